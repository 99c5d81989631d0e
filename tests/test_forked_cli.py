"""The warm start of `git fabro` (`tests/forked_cli.py`) gives what starting it the
ordinary way gives: the same output, exit code, environment and working directory, and
it steps aside wherever it could differ."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import forked_cli
import pytest
from helpers import fabro_exe, git, run_fabro, write_workflow

pytestmark = pytest.mark.skipif(
    not hasattr(os, "pidfd_open") or forked_cli.ORDINARY_ONLY,
    reason="the warm start needs os.pidfd_open and is off under FABRO_TEST_EXEC=1",
)

# The stage's view of its process: what git passed the command, a variable, its umask.
PROBE = """\
digraph Probe {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    probe [shape=parallelogram, script="printf '%s\\\\n' \\"$GIT_EXEC_PATH\\" \\"${PATH%%:*}\\" \\"$PROBE_VALUE\\" \\"$(umask)\\" > seen.txt"]
    start -> probe -> exit
}
"""

GATE = """\
digraph Gate {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    gate  [shape=hexagon, label="Ship?"]
    yes   [shape=parallelogram, script="echo A > answer.txt"]
    no    [shape=parallelogram, script="echo R > answer.txt"]
    start -> gate
    gate -> yes [label="[A] Approve"]
    gate -> no  [label="[R] Reject"]
    yes -> exit
    no -> exit
}
"""


def _ordinary(
    args: list[str], cwd: Path, env: dict[str, str], input: str | None
) -> subprocess.CompletedProcess[str]:
    stdin = {"input": input} if input is not None else {"stdin": subprocess.DEVNULL}
    return subprocess.run(
        ["git", "fabro", *args], cwd=cwd, env=env, capture_output=True, text=True, **stdin
    )  # fmt: skip


def _warm(
    args: list[str], cwd: Path, env: dict[str, str], input: str | None = None
) -> subprocess.CompletedProcess[str]:
    warm = forked_cli.run(args, cwd, env, input, 60)
    assert warm is not None, "the warm start stepped aside"
    return warm


def _file(repo: Path, proc: subprocess.CompletedProcess[str], name: str) -> str:
    branch = re.search(r"fabro/run/\w+", proc.stderr)
    assert branch is not None, proc.stderr
    return git(repo, "show", f"{branch.group()}:{name}")


def _seen(repo: Path, proc: subprocess.CompletedProcess[str]) -> list[str]:
    return _file(repo, proc, "seen.txt").splitlines()


def test_a_run_sees_the_same_process_warm_as_started_by_git(repo: Path) -> None:
    write_workflow(repo, PROBE)
    env = dict(os.environ, PROBE_VALUE="from the caller")
    old = os.umask(0o027)
    try:
        ordinary = _ordinary(["run", "wf.fabro"], repo, env, None)
        warm = _warm(["run", "wf.fabro"], repo, env)
    finally:
        os.umask(old)
    assert ordinary.returncode == warm.returncode == 0, (ordinary.stderr, warm.stderr)
    seen = _seen(repo, warm)
    assert seen == _seen(repo, ordinary)
    # Git's exec path, first in PATH, as git gives its dashed commands; the caller's
    # variable and umask.
    exec_path = subprocess.run(["git", "--exec-path"], capture_output=True, text=True).stdout
    assert seen == [exec_path.strip(), exec_path.strip(), "from the caller", "0027"]


def test_input_exit_codes_and_errors_match(repo: Path, tmp_path: Path) -> None:
    env = dict(os.environ)
    # A user error: the message and exit code a new interpreter gives.
    missing = ["validate", "no-such.fabro"]
    ordinary, warm = _ordinary(missing, repo, env, None), _warm(missing, repo, env)
    assert (warm.returncode, warm.stdout, warm.stderr) == (
        ordinary.returncode, ordinary.stdout, ordinary.stderr,
    )  # fmt: skip
    assert warm.returncode == 1 and "no-such.fabro" in warm.stdout
    # Input reaches the command's stdin: the gate's answer, then more than a pipe holds.
    write_workflow(repo, GATE)
    answer = "R\n" + "z" * 200_000 + "\n"
    ordinary, warm = (
        _ordinary(["run", "wf.fabro"], repo, env, answer),
        _warm(["run", "wf.fabro"], repo, env, answer),
    )
    assert ordinary.returncode == warm.returncode == 0, (ordinary.stderr, warm.stderr)
    assert _file(repo, warm, "answer.txt") == _file(repo, ordinary, "answer.txt") == "R\n"
    # A relative path is read from the working directory given.
    (tmp_path / "elsewhere").mkdir()
    moved = _warm(["validate", "wf.fabro"], tmp_path / "elsewhere", env)
    assert moved.returncode == 1 and "wf.fabro: error" in moved.stdout


def test_it_steps_aside_where_the_process_would_differ(repo: Path, tmp_path: Path) -> None:
    env = dict(os.environ)
    assert forked_cli.run(["--version"], repo, env, None, 60) is not None
    # Another git-fabro first in PATH: git would run that one.
    other = tmp_path / "bin"
    other.mkdir()
    fake = other / "git-fabro"
    fake.write_text("#!/bin/sh\necho other\n")
    fake.chmod(0o755)
    shadowed = dict(env, PATH=f"{other}{os.pathsep}{env['PATH']}")
    assert forked_cli.run(["--version"], repo, shadowed, None, 60) is None
    assert run_fabro("--version", cwd=repo, env=shadowed).stdout == "other\n"
    # A locale the interpreter reads as it starts, a missing directory, a set exec path.
    assert forked_cli.run(["--version"], repo, dict(env, LC_ALL="C"), None, 60) is None
    assert forked_cli.run(["--version"], tmp_path / "gone", env, None, 60) is None
    assert forked_cli.run(["--version"], repo, dict(env, GIT_EXEC_PATH="/x"), None, 60) is None


def test_a_command_past_its_timeout_is_killed(repo: Path, tmp_path: Path) -> None:
    write_workflow(
        repo,
        "digraph W { start [shape=Mdiamond]; exit [shape=Msquare]; "
        'wait [shape=parallelogram, script="sleep 60"]; start -> wait -> exit }\n',
    )
    with pytest.raises(subprocess.TimeoutExpired):
        forked_cli.run(["run", "wf.fabro"], repo, dict(os.environ), None, 1)
    # The command was killed, as `subprocess.run` kills one: its run is left interrupted.
    listed = run_fabro("ps", "--json", cwd=repo)
    assert listed.returncode == 0, listed.stderr
    statuses = [json.loads(line)["status"] for line in listed.stdout.splitlines()]
    assert statuses == ["interrupted"], listed.stdout


def test_the_server_forks_from_one_thread() -> None:
    server = forked_cli._server(dict(os.environ))
    assert server is not None
    assert len(list(Path(f"/proc/{server.process.pid}/task").iterdir())) == 1


def test_a_server_killed_from_outside_leaves_the_commands_to_start_ordinarily(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = dict(os.environ)
    server = forked_cli._Server(env)
    monkeypatch.setitem(forked_cli._servers, os.getpid(), server)
    try:
        assert forked_cli.run(["--version"], repo, env, None, 60) is not None
        server.process.kill()
        server.process.wait()
        assert forked_cli.run(["--version"], repo, env, None, 60) is None
        streams = (subprocess.DEVNULL, subprocess.PIPE, subprocess.PIPE)
        assert (
            forked_cli.start(["--version"], repo, env, streams, text=True, new_session=False)
            is None
        )
        assert run_fabro("--version", cwd=repo).stdout.startswith("git-fabro ")
    finally:
        server.close()


HOLD = """\
digraph Hold {
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    hold  [shape=parallelogram, script="while [ ! -f \\"$HOME/go\\" ]; do sleep 0.05; done; echo held"]
    start -> hold -> exit
}
"""


def test_a_started_command_is_a_process_as_popen_gives_it(repo: Path) -> None:
    """`forked_cli.start`: its pid is the command's own, leading a session of its own;
    a signal to its group reaches it; its exit status and pipes are Popen's."""
    import signal

    write_workflow(repo, HOLD)
    env = dict(os.environ)
    streams = (subprocess.DEVNULL, subprocess.PIPE, subprocess.PIPE)
    proc = forked_cli.start(["run", "wf.fabro"], repo, env, streams, text=True, new_session=True)
    assert proc is not None, "the warm start stepped aside"
    assert proc.stderr.readline().startswith("run ")  # started, and still holding
    assert proc.poll() is None
    assert os.getsid(proc.pid) == os.getpgid(proc.pid) == proc.pid
    assert Path(f"/proc/{proc.pid}/cwd").resolve() == repo.resolve()
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    proc.stdout.close()
    proc.stderr.close()

    # Finished: output and status as the ordinary start gives them.
    (Path(os.environ["HOME"]) / "go").write_text("")
    ordinary = subprocess.run(
        [*fabro_exe(), "--version"], cwd=repo, env=env, capture_output=True, text=True
    )
    warm = forked_cli.start(["--version"], repo, env, streams, text=True, new_session=False)
    assert warm is not None
    assert warm.communicate(timeout=30) == (ordinary.stdout, ordinary.stderr)
    assert warm.returncode == ordinary.returncode == 0
