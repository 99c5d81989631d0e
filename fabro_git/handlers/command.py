"""Command nodes: run a script in the worktree.

Output streams straight to files in the stage's scratch dir, so a command that prints a
gigabyte costs disk, not memory; the context gets a bounded excerpt (head and tail) and
the meta ref a capped copy. The command runs in its own process group, so a timeout or
Ctrl-C stops everything it started, not just the shell. The run's goal and inputs reach
the script only through its environment (`script_environment`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import trio

from fabro_git.config.locations import open_private
from fabro_git.engine import outcome as oc
from fabro_git.engine import process_groups
from fabro_git.engine.outcome import Outcome
from fabro_git.engine.stage import StageRequest
from fabro_git.errors import DiskFull, WorkflowError
from fabro_git.workflow.templates import script_environment

CONTEXT_LIMIT = 100_000  # bytes of each stream kept in the context
META_LIMIT = 1_000_000  # bytes of each stream kept on the meta ref
KILL_GRACE = 2.0


def excerpt(path: Path, limit: int) -> bytes:
    """The whole file when small, else its head and tail around an omission marker.

    The cuts fall on line ends when a line end is near: a secret cut in two would
    no longer be recognised, and half of it would reach git.
    """
    size = path.stat().st_size
    with path.open("rb") as fh:
        if size <= limit:
            return fh.read()
        half = limit // 2
        head = fh.read(half)
        fh.seek(size - half)
        tail = fh.read()
    end = head.rfind(b"\n")
    if end >= half // 2:
        head = head[: end + 1]
    start = tail.find(b"\n")
    if 0 <= start < half // 2:
        tail = tail[start + 1 :]
    marker = f"\n[... {size - len(head) - len(tail)} bytes omitted ...]\n".encode()
    return head + marker + tail


def argv_for(script: str, language: str) -> list[str]:
    if language == "python":
        return [sys.executable, "-c", script]
    shell = shutil.which("bash") or "/bin/sh"
    return [shell, "-c", script]


async def run_script(
    argv: list[str],
    *,
    cwd: Path,
    stdout: Path,
    stderr: Path,
    env: dict[str, str],
    timeout: float | None,
    groups: Path | None = None,
) -> tuple[int | None, bool]:
    """Run to completion; returns (exit code or None when killed, timed out?).

    A program that cannot be started (say, an environment over the system's limits)
    exits 126, as in a shell, with the reason in `stderr`. With `groups` (the run's
    record directory), the process group is recorded there while any of it is alive,
    so that the run's end, or a resume after a crash, can kill what the command left
    running.
    """
    truncate = os.O_WRONLY | os.O_TRUNC
    with (
        open(open_private(stdout, truncate), "wb") as out,
        open(open_private(stderr, truncate), "wb") as err,
    ):
        try:
            process = await process_groups.start(argv, cwd=cwd, stdout=out, stderr=err, env=env)
        except OSError as exc:
            err.write(f"cannot start {argv[0]}: {exc.strerror or exc}\n".encode())
            return 126, False
    recorded = process_groups.record(groups, process.pid) if groups is not None else None
    timed_out = False
    try:
        with trio.move_on_after(timeout if timeout else float("inf")) as scope:
            await process.wait()
        if scope.cancelled_caught:
            timed_out = True
            await _stop_group(process)
    except BaseException:
        with trio.CancelScope(shield=True):
            await _stop_group(process)
        _forget_unless_alive(process.pid, recorded)
        raise
    _forget_unless_alive(process.pid, recorded)
    return (None if timed_out else process.returncode), timed_out


def _forget_unless_alive(pgid: int, recorded: Path | None) -> None:
    # What a command leaves running in the background keeps its record until the run
    # ends, when it is killed.
    if recorded is not None and not process_groups.alive(pgid):
        process_groups.forget(recorded)


async def _stop_group(process: process_groups.StageProcess) -> None:
    for sig, grace in ((signal.SIGTERM, KILL_GRACE), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with trio.move_on_after(grace):
            await process.wait()
            return


# Less free space than this (for an unprivileged writer) after a command failed means the
# disk filled up under it.
NEARLY_FULL = 64 * 1024


def out_of_space(*paths: Path) -> Path | None:
    """The first of `paths` on a filesystem with (next to) no room left, if any."""
    for path in paths:
        try:
            info = os.statvfs(path)
        except OSError:
            continue
        if info.f_bavail * info.f_frsize < NEARLY_FULL:
            return path
    return None


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


async def execute(req: StageRequest) -> Outcome:
    node = req.node
    script = node.get("script") or node.get("tool_command")
    if not script:
        raise WorkflowError(
            f"command node {node.id!r} has no script; add script=\"...\"",
            path=req.graph.path,
            line=node.line,
            column=node.column,
        )
    language = (node.get("language") or "shell").lower()
    if language not in ("shell", "python"):
        raise WorkflowError(
            f"command node {node.id!r}: language must be shell or python, not {language!r}",
            path=req.graph.path,
            line=node.line,
            column=node.column,
        )
    timeout = node.get_duration("timeout", None)
    stdout_path = req.stage_dir / "stdout.log"
    stderr_path = req.stage_dir / "stderr.log"
    manifest = req.runtime.manifest
    env = script_environment(
        os.environ,
        goal=manifest.goal,
        inputs=manifest.inputs,
        run_id=req.runtime.run_id,
        node_id=node.id,
    )
    env.update(FABRO_STAGE_ID=req.stage_id, FABRO_WORKTREE=str(req.worktree))
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    env.pop("GIT_INDEX_FILE", None)
    started = time.monotonic()
    code, timed_out = await run_script(
        argv_for(script, language),
        cwd=req.worktree,
        stdout=stdout_path,
        stderr=stderr_path,
        env=env,
        timeout=timeout,
        groups=process_groups.records_dir(req.runtime.scratch),
    )
    elapsed = time.monotonic() - started
    out = excerpt(stdout_path, CONTEXT_LIMIT)
    err = excerpt(stderr_path, CONTEXT_LIMIT)
    req.files["script.sh" if language == "shell" else "script.py"] = script.encode()
    req.files["stdout.log"] = excerpt(stdout_path, META_LIMIT)
    req.files["stderr.log"] = excerpt(stderr_path, META_LIMIT)
    updates = {"command.output": _text(out), "command.stderr": _text(err)}
    if timed_out:
        return Outcome.failure(
            f"command timed out after {timeout:g}s",
            oc.TRANSIENT,
            context_updates=updates,
        )
    notes = f"exit code {code} after {elapsed:.2f}s"
    if code == 0:
        return Outcome.success(context_updates=updates, notes=notes)
    last = _text(err).strip().splitlines()[-1:] or _text(out).strip().splitlines()[-1:]
    detail = f": {last[0][:200]}" if last else ""
    full = out_of_space(req.worktree, req.stage_dir)
    if full is not None:
        # Not the command's fault, and not a result to route on: the run stops where a
        # full disk stops every other write, resumable once there is room again.
        raise DiskFull(f"No space left on device under {full} (the command exited with status {code}{detail})")
    return Outcome.failure(f"command exited with status {code}{detail}", oc.DETERMINISTIC, context_updates=updates, notes=notes)
