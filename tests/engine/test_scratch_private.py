"""Scratch is private whatever the umask: the dirs we make are 0700, our files 0600.

Runs go through `sh -c 'umask 000; exec git fabro ...'`, the worst umask a user can
have. The worktrees inside scratch are the user's checkouts: they follow the umask like
any checkout, and only the directories above them are ours.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

from helpers import wait_until

FAILS_AT_GATE = """\
digraph Private {
    graph [setup="echo prepared"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    fan   [shape=component]
    a     [shape=parallelogram, script="echo a > a.txt"]
    b     [shape=parallelogram, script="echo b > b.txt"]
    join  [shape=tripleoctagon]
    gate  [shape=parallelogram, script="echo out; echo err >&2; exit 1"]
    start -> fan
    fan -> a
    fan -> b
    a -> join
    b -> join
    join -> gate -> exit
}
"""


def _fabro_umask_000(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = "umask 000; exec git fabro " + " ".join(shlex.quote(a) for a in args)
    return subprocess.run(
        ["sh", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _walk_ours(root: Path, checkouts: set[Path]) -> tuple[list[Path], list[Path]]:
    """Dirs and files under `root`, not descending into the user's checkouts."""
    dirs, files = [root], []
    for current, subdirs, names in os.walk(root):
        here = Path(current)
        subdirs[:] = [d for d in subdirs if here / d not in checkouts]
        dirs += [here / d for d in subdirs]
        files += [here / n for n in names]
    return dirs, files


def test_scratch_dirs_and_files_are_private_under_umask_000(repo: Path, tmp_path: Path) -> None:
    workflow = tmp_path / "private.fabro"
    workflow.write_text(FAILS_AT_GATE)
    proc = _fabro_umask_000("run", str(workflow), "--json", cwd=repo)
    assert proc.returncode == 1, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]

    home = Path(os.environ["FABRO_HOME"])
    (scratch,) = (home / "runs").glob(f"{run_id}-*")
    worktree = scratch / "worktree"
    # The branches' checkouts are gone after the fan-in; the dir above them is ours.
    branches = {p for p in (scratch / "parallel").glob("*/*") if p.is_dir()}
    # The failed run released its worktree; the dirs it lived in stay ours.
    assert not worktree.exists() and (scratch / "parallel" / "fan-1").is_dir()
    checkouts = {worktree, *branches}

    dirs, files = _walk_ours(home, checkouts)
    names = {p.relative_to(scratch).as_posix() for p in files if scratch in p.parents}
    # What the run left: the tail, the output of its last command and of each branch's,
    # the setup command's logs.
    assert {
        "events.jsonl",
        "output/stdout.log",
        "output/stderr.log",
        "output/1/stdout.log",
        "output/2/stderr.log",
        "setup/0.stdout",
    } <= names
    assert {p: oct(_mode(p)) for p in dirs if _mode(p) != 0o700} == {}
    assert {p: oct(_mode(p)) for p in files if _mode(p) != 0o600} == {}

    # The run lock and the worktree lock in the repository are ours too.
    fabro_dir = repo / ".git" / "fabro"
    for path in [fabro_dir, fabro_dir / "locks"]:
        assert _mode(path) == 0o700, path
    for path in [fabro_dir / "worktrees.flock", fabro_dir / "locks" / f"{run_id}.lock"]:
        assert _mode(path) == 0o600, path

    # Resuming in the background adds its log, private as the rest.
    resumed = _fabro_umask_000("resume", run_id, "--detach", cwd=repo)
    assert resumed.returncode == 0, resumed.stderr
    log = scratch / "detached.log"
    assert log.exists() and _mode(log) == 0o600
    wait_until(
        lambda: (scratch / "events.jsonl").read_bytes().count(b'"event":"run.failed"') >= 2,
        limit=60,
        what="the background resume's end",
    )


def test_crash_log_is_private_and_masked(tmp_path: Path) -> None:
    """A crash log is written for a bug report; it holds argv, which may hold a key."""
    key = "sk-ant-api03-" + "Q" * 40
    code = (
        "import os, sys\n"
        "os.umask(0)\n"
        "from fabro_git.cli import write_crash_log\n"
        f"sys.argv = ['git-fabro', 'run', 'x', '--goal', {key!r}]\n"
        "print(write_crash_log(RuntimeError('boom')))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    log = Path(proc.stdout.strip())
    assert log.parent == Path(os.environ["FABRO_HOME"]) / "crash-logs"
    assert _mode(log) == 0o600 and _mode(log.parent) == 0o700
    text = log.read_text()
    assert "RuntimeError: boom" in text
    assert key not in text and "***QQQQ" in text


def test_crash_log_goes_to_the_temp_dir_when_fabro_home_is_unusable(tmp_path: Path) -> None:
    """The crash reporter must not fall over (nor dump the log on the terminal) when
    its own directory, under FABRO_HOME, cannot be made: a FABRO_HOME below a file."""
    afile = tmp_path / "a-file"
    afile.write_text("")
    temp = tmp_path / "temp"
    temp.mkdir()
    code = (
        "from fabro_git.cli import write_crash_log\nprint(write_crash_log(RuntimeError('boom')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "FABRO_HOME": str(afile / "fabro"), "TMPDIR": str(temp)},
    )
    assert proc.stderr == ""
    log = Path(proc.stdout.strip())
    assert log.parent == temp and log.name.startswith("git-fabro-crash-"), log
    assert _mode(log) == 0o600
    assert "RuntimeError: boom" in log.read_text()
