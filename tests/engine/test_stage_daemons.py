"""Nothing a stage starts outlives it: processes that leave the stage's process group
(`setsid`, a double fork, `nohup ... &`), started by a command stage, by the agent's
shell tool or by an agent CLI, are gone when the stage ends, after Ctrl-C, and after a
kill -9 of `git fabro`; so are those that also clear their environment (`env -i`), which
only their ancestry ties to the stage.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import meta_file, run_json, start_fabro, wait_until, write_workflow
from llm_server import LlmServer, Reply, ToolUse

KINDS = ("setsid", "double", "nohup", "bare-setsid", "bare-double")


def _daemons(pids: Path) -> str:
    """A shell script starting processes that outlive their parent and leave (or would
    survive the loss of) its group, the `bare-` ones with an emptied environment; each
    writes its pid to `pids/<kind>`."""
    record = f"echo $$ > {pids}/$0.tmp && mv {pids}/$0.tmp {pids}/$0; exec sleep 600"
    quiet = "</dev/null >/dev/null 2>&1"
    return (
        f"setsid sh -c '{record}' setsid {quiet} &\n"
        f"( sh -c '{record}' double {quiet} & ) &\n"
        f"nohup sh -c '{record}' nohup {quiet} &\n"
        f"env -i setsid sh -c '{record}' bare-setsid {quiet} &\n"
        f"( env -i sh -c '{record}' bare-double {quiet} & ) &\n"
        f"for k in {' '.join(KINDS)}; do until [ -s {pids}/$k ]; do sleep 0.01; done; done\n"
    )


def _pids(directory: Path) -> list[int]:
    return [int((directory / kind).read_text()) for kind in KINDS]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _all_gone(pids: list[int], seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def pids(tmp_path: Path) -> Iterator[Path]:
    """Where the daemons write their pids; whatever is left is killed at the end."""
    directory = tmp_path / "pids"
    directory.mkdir()
    yield directory
    for path in directory.iterdir():
        with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
            os.kill(int(path.read_text()), signal.SIGKILL)


# The stage after the one that started the daemons: what of them is alive then (a
# bounded wait, as a SIGKILL takes a moment to land).
CHECK = (
    "for i in $(seq 500); do alive=; for p in $(cat {pids}/*); do "
    "s=$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null); "
    '[ -n "$s" ] && [ "$s" != Z ] && alive="$alive $p"; done; '
    '[ -z "$alive" ] && break; sleep 0.02; done; echo "alive:$alive"'
)


def _workflow(first: str, pids: Path) -> str:
    check = CHECK.replace("{pids}", str(pids)).replace('"', '\\"')
    return f"""\
digraph D {{
    start [shape=Mdiamond]
    exit [shape=Msquare]
    {first}
    check [shape=parallelogram, script="{check}"]
    start -> first -> check -> exit
}}
"""


def _script_file(tmp_path: Path, pids: Path) -> Path:
    path = tmp_path / "daemons.sh"
    path.write_text(_daemons(pids))
    return path


def test_what_a_command_stage_leaves_running_is_gone_when_it_ends(
    repo: Path, tmp_path: Path, pids: Path
) -> None:
    script = _script_file(tmp_path, pids)
    write_workflow(repo, _workflow(f'first [shape=parallelogram, script="sh {script}"]', pids))
    proc, result = run_json("run", "wf.fabro", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert meta_file(repo, result["run_id"], "nodes/check/stdout.log") == "alive:\n"


def test_what_the_shell_tool_leaves_running_is_gone_when_the_stage_ends(
    repo: Path, tmp_path: Path, pids: Path, llm_server: LlmServer
) -> None:
    script = _script_file(tmp_path, pids)
    first = 'first [shape=box, model="claude-sonnet-4-6", permissions="full", prompt="Start the servers"]'
    write_workflow(repo, _workflow(first, pids))
    llm_server.script(
        Reply(
            text="Starting.", tool_calls=(ToolUse("shell", {"command": f"sh {script}"}, id="s1"),)
        ),
        Reply(text="Started."),
    )
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert len(_pids(pids)) == len(KINDS)  # they were started
    assert meta_file(repo, result["run_id"], "nodes/check/stdout.log") == "alive:\n"


FAKE_CLAUDE = """\
import json, subprocess, sys
sys.stdin.read()
subprocess.run(["sh", sys.argv[0] + ".sh"], check=True)
print(json.dumps({"type": "result", "subtype": "success", "is_error": False,
                  "result": "started", "usage": {"input_tokens": 1, "output_tokens": 1}}))
"""


def test_what_an_agent_cli_leaves_running_is_gone_when_the_stage_ends(
    repo: Path, tmp_path: Path, pids: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = tmp_path / "cli-bin"
    bindir.mkdir()
    claude = bindir / "claude"
    claude.write_text(f"#!{sys.executable}\n{FAKE_CLAUDE}")
    claude.chmod(0o755)
    (bindir / "claude.sh").write_text(_daemons(pids))
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-used")
    first = 'first [shape=box, backend="cli", provider="anthropic", prompt="Start"]'
    write_workflow(repo, _workflow(first, pids))
    proc, result = run_json("run", "wf.fabro", "--goal", "g", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert meta_file(repo, result["run_id"], "nodes/check/stdout.log") == "alive:\n"


def test_a_process_outside_the_run_that_carries_the_stages_mark_is_gone_when_it_ends(
    repo: Path, tmp_path: Path, pids: Path
) -> None:
    """A job handed to a daemon with the stage's environment (as `at` keeps it) runs
    outside `git fabro`'s tree, where no ancestry leads to it: its mark does. Here the
    test itself starts it, with the environment the stage wrote out, while the stage
    waits; the stage then ends with `git fabro` having no child left."""
    env_file, go = tmp_path / "stage.env", tmp_path / "go"
    first = (
        f'first [shape=parallelogram, script="env -0 > {env_file}.tmp && mv {env_file}.tmp '
        f'{env_file}; until [ -e {go} ]; do sleep 0.01; done"]'
    )
    write_workflow(repo, _workflow(first, pids))
    with (tmp_path / "run.out").open("wb") as out:
        proc = start_fabro(
            ["run", "wf.fabro", "--json"], cwd=repo, stdin=subprocess.DEVNULL, stdout=out
        )
    wait_until(env_file.exists, process=proc, what="the stage wrote its environment")
    stage_env = dict(
        entry.split("=", 1) for entry in env_file.read_text().split("\0") if "=" in entry
    )
    assert stage_env.get("FABRO_PROCESS_MARK")
    outside = subprocess.Popen(
        ["sleep", "600"], env=stage_env, start_new_session=True, stdin=subprocess.DEVNULL
    )
    try:
        (pids / "outside").write_text(str(outside.pid))
        go.touch()
        assert proc.wait(timeout=120) == 0
        # Killed by the stage's sweep (the test's child: it is reaped here).
        assert outside.wait(timeout=10) == -signal.SIGKILL
        run_id = json.loads((tmp_path / "run.out").read_text().splitlines()[-1])["run_id"]
        assert meta_file(repo, run_id, "nodes/check/stdout.log") == "alive:\n"
    finally:
        outside.kill()
        outside.wait()


def _hanging(repo: Path, tmp_path: Path, pids: Path) -> subprocess.Popen[bytes]:
    """`git fabro run` of a stage that starts the daemons, says so, and waits."""
    ready = tmp_path / "ready"
    proc = _hanging_stage(repo, tmp_path, _daemons(pids) + f"touch {ready}\nexec sleep 600\n")
    wait_until(ready.exists, process=proc, what="the stage started its daemons")
    return proc


def _hanging_stage(repo: Path, tmp_path: Path, script_text: str) -> subprocess.Popen[bytes]:
    """`git fabro run`, in the background, of one command stage running `script_text`."""
    script = tmp_path / "hang.sh"
    script.write_text(script_text)
    write_workflow(
        repo,
        f"""\
digraph D {{
    start [shape=Mdiamond]
    exit [shape=Msquare]
    hang [shape=parallelogram, script="sh {script}"]
    start -> hang -> exit
}}
""",
    )
    with (tmp_path / "run.err").open("wb") as err:
        return start_fabro(
            ["run", "wf.fabro"],
            cwd=repo,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )


def test_ctrl_c_leaves_nothing_of_the_stage_running(repo: Path, tmp_path: Path, pids: Path) -> None:
    proc = _hanging(repo, tmp_path, pids)
    daemons = _pids(pids)
    assert all(_alive(pid) for pid in daemons)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130, (tmp_path / "run.err").read_text()
    assert _all_gone(daemons), [pid for pid in daemons if _alive(pid)]


def test_a_kill_9_of_the_run_leaves_nothing_of_the_stage_running(
    repo: Path, tmp_path: Path, pids: Path
) -> None:
    proc = _hanging(repo, tmp_path, pids)
    daemons = _pids(pids)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    # The run's watcher sees git fabro go, and kills what carries the run's mark.
    assert _all_gone(daemons), [pid for pid in daemons if _alive(pid)]


def test_a_kill_9_mid_stage_leaves_no_orphan_whose_parent_died(
    repo: Path, tmp_path: Path, pids: Path
) -> None:
    """A process with an emptied environment and a session of its own, whose parent
    died while the stage still runs, is git fabro's adopted child: nothing but its
    ancestry tells where it came from, and a kill -9 of git fabro takes that away too.
    git fabro notes what it adopts as the stage goes on, so the watcher kills it."""
    record = f"echo $$ > {pids}/$0.tmp && mv {pids}/$0.tmp {pids}/$0; exec sleep 600"
    ready = tmp_path / "ready"
    proc = _hanging_stage(
        repo,
        tmp_path,
        f"( env -i setsid sh -c '{record}' lone </dev/null >/dev/null 2>&1 & ) &\n"
        f"until [ -s {pids}/lone ]; do sleep 0.01; done\n"
        f"touch {ready}\nexec sleep 600\n",
    )
    try:
        wait_until(ready.exists, process=proc, what="the stage started its daemon")
        lone = int((pids / "lone").read_text())
        # The kill point: git fabro has noted its adopted child.
        home = Path(os.environ["FABRO_HOME"])
        wait_until(
            lambda: any(home.glob(f"runs/*/process-groups/orphan-{lone}.json")),
            process=proc,
            limit=30,
            what="git fabro noted the orphan it adopted",
        )
    finally:
        os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert _all_gone([lone]), "the orphan outlived the run"


def _hanging_agent(
    repo: Path, tmp_path: Path, pids: Path, llm_server: LlmServer
) -> subprocess.Popen[bytes]:
    """`git fabro run` of an agent stage whose shell tool starts the daemons in one call
    (they outlive it) and waits in the next."""
    ready = tmp_path / "ready"
    script = _script_file(tmp_path, pids)
    write_workflow(
        repo,
        """\
digraph D {
    start [shape=Mdiamond]
    exit [shape=Msquare]
    work [shape=box, model="claude-sonnet-4-6", permissions="full", prompt="Start the servers"]
    start -> work -> exit
}
""",
    )
    llm_server.script(
        Reply(text="Starting.", tool_calls=(ToolUse("shell", {"command": f"sh {script}"}),)),
        Reply(
            text="Waiting.",
            tool_calls=(ToolUse("shell", {"command": f"touch {ready}; exec sleep 600"}),),
        ),
        Reply(text="Done."),
    )
    with (tmp_path / "run.err").open("wb") as err:
        proc = start_fabro(
            ["run", "wf.fabro", "--goal", "g"],
            cwd=repo,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None, (tmp_path / "run.err").read_text()
        assert time.monotonic() < deadline, "the agent never started its daemons"
        time.sleep(0.01)
    return proc


@pytest.mark.parametrize("how", ["ctrl-c", "kill-9"])
def test_what_the_shell_tool_left_running_is_gone_when_the_run_is_stopped(
    repo: Path, tmp_path: Path, pids: Path, llm_server: LlmServer, how: str
) -> None:
    proc = _hanging_agent(repo, tmp_path, pids, llm_server)
    # The tool call's end killed its group; those that left it are still running.
    daemons = [pid for pid in _pids(pids) if _alive(pid)]
    assert int((pids / "bare-setsid").read_text()) in daemons
    if how == "ctrl-c":
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130, (tmp_path / "run.err").read_text()
    else:
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    assert _all_gone(daemons), [pid for pid in daemons if _alive(pid)]
