"""Command nodes: run a script in the worktree.

Output streams straight to files in the stage's scratch dir, so a command that prints a
gigabyte costs disk, not memory. The meta ref keeps the whole output, byte for byte (one
over META_LIMIT is streamed into git from its file at the checkpoint). The context gets
a capped copy (the whole output when under META_LIMIT, else its head and tail): over the
offload threshold the engine moves it to the artifact store and the context keeps a
pointer, so a large output is not copied into every checkpoint. The command runs in
its own process group (`fabro_git.engine.process`), so a timeout or Ctrl-C stops
everything it started, not just the shell. The run's goal and inputs reach the script
only through its environment (`script_environment`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import trio

from fabro_git import redact
from fabro_git.config.locations import open_private
from fabro_git.engine.outcome import DETERMINISTIC, TRANSIENT, Outcome
from fabro_git.engine.process import (
    META_LIMIT,
    argv_for,
    excerpt,
    out_of_space,
    run_script,
)
from fabro_git.engine.stage import StageRequest
from fabro_git.errors import DiskFull, WorkflowError
from fabro_git.workflow.templates import script_environment


class OutputFollower:
    """Hands the lines a command writes to its output files to `line_out` as they
    appear (`run -v`). The files stay the only capture: this only reads them behind the
    writer, a bounded chunk at a time, so a huge output costs no memory here either."""

    INTERVAL = 0.05
    CHUNK = 1 << 16

    def __init__(self, paths: list[Path], line_out: Callable[[str], None]) -> None:
        self.paths = paths
        self.line_out = line_out
        self._offsets = [0] * len(paths)
        self._partial = [b""] * len(paths)
        # The terminal is no place for a secret either (a CI log keeps it): one masker
        # per file, which holds back what may still become one.
        self._maskers = [redact.for_process().stream_bytes() for _ in paths]

    async def follow(self) -> None:
        while True:
            self.poll()
            await trio.sleep(self.INTERVAL)

    def poll(self, *, final: bool = False) -> None:
        for index, path in enumerate(self.paths):
            try:
                with path.open("rb") as fh:
                    fh.seek(self._offsets[index])
                    # A bounded read per poll keeps the trio loop turning; the last
                    # poll reads to the end.
                    for _ in range(1 << 30 if final else 16):
                        chunk = fh.read(self.CHUNK)
                        if not chunk:
                            break
                        self._offsets[index] += len(chunk)
                        self._lines(index, self._maskers[index].feed(chunk))
            except FileNotFoundError:
                continue
            if final:
                self._lines(index, self._maskers[index].flush())
            if final and self._partial[index]:
                self.line_out(_text(self._partial[index]))
                self._partial[index] = b""

    def _lines(self, index: int, chunk: bytes) -> None:
        data = self._partial[index] + chunk
        *complete, rest = data.split(b"\n")
        for line in complete:
            self.line_out(_text(line))
        # A line with no end yet waits for it, unless it is already longer than a chunk.
        if len(rest) > self.CHUNK:
            self.line_out(_text(rest))
            rest = b""
        self._partial[index] = rest


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def stage_environment(req: StageRequest, *, keys: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment a stage's program runs with (a command's script, an agent CLI):
    the stage's (`fabro_git.engine.stage_env`: no secret-named variable but those
    `[run.sandbox.env]` or `keys` name), and the run's values as FABRO_* variables."""
    env = script_environment(
        req.environment(keys=keys),
        goal=req.goal,
        inputs=req.inputs,
        run_id=req.run_id,
        node_id=req.node.id,
    )
    env.update(FABRO_STAGE_ID=req.stage_id, FABRO_WORKTREE=str(req.worktree))
    return env


def notice_stripped(req: StageRequest, script: str, where: str) -> None:
    """A `run.notice` naming the variables `script` mentions but will not get."""
    from fabro_git.engine.stage_env import NOTICE_CODE, mentioned_stripped, stripped_notice
    from fabro_git.events.catalogue import RunNotice

    names = mentioned_stripped(script, os.environ, req.sandbox_env)
    if names:
        req.emit(RunNotice(level="warn", code=NOTICE_CODE, message=stripped_notice(names, where)))


def _script(req: StageRequest) -> tuple[str, str]:
    """The node's script and its language (shell or python); a `WorkflowError` naming
    the node's line when either is missing or wrong."""
    node = req.node
    script = node.get("script") or node.get("tool_command")
    if not script:
        raise WorkflowError(
            f'command node {node.id!r} has no script; add script="..."',
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
    return script, language


async def execute(req: StageRequest) -> Outcome:
    script, language = _script(req)
    output = req.output_dir
    stdout_path = output / "stdout.log"
    stderr_path = output / "stderr.log"
    env = stage_environment(req)
    notice_stripped(req, script, f"the script of {req.node_id}")
    script_name = "script.sh" if language == "shell" else "script.py"

    def keep_output() -> dict[str, str]:
        req.files[script_name] = script.encode()
        updates = {}
        for name, path, key in (
            ("stdout.log", stdout_path, "command.output"),
            ("stderr.log", stderr_path, "command.stderr"),
        ):
            kept = excerpt(path, META_LIMIT)
            # The meta ref keeps the whole output, byte for byte; a large one is streamed
            # into git from its file at the checkpoint, never held in memory.
            large = path.stat().st_size > META_LIMIT
            req.files[name] = _moved_out(path, req.stage_dir) if large else kept
            updates[key] = _text(kept)
        return updates

    async def timed_out(seconds: float) -> Outcome:
        return Outcome.failure(
            f"command timed out after {seconds:g}s", TRANSIENT, context_updates=dict(keep_output())
        )

    req.on_timeout(timed_out)
    started = time.monotonic()
    listener = req.output_listener
    follower = None
    async with trio.open_nursery() as nursery:
        if listener is not None:
            node_id = req.node_id
            for path in (stdout_path, stderr_path):
                # Emptied before the follower's first look: they hold the walk's last
                # command's output until `run_script` opens them.
                os.close(open_private(path, os.O_WRONLY | os.O_TRUNC))
            follower = OutputFollower(
                [stdout_path, stderr_path], lambda line: listener(node_id, line)
            )
            nursery.start_soon(follower.follow)
        code, _ = await run_script(
            argv_for(script, language),
            cwd=req.worktree,
            stdout=stdout_path,
            stderr=stderr_path,
            env=env,
            timeout=None,
            groups=req.process_groups,
        )
        nursery.cancel_scope.cancel()
    if follower is not None:
        follower.poll(final=True)
    elapsed = time.monotonic() - started
    updates = keep_output()
    out, err = updates["command.output"], updates["command.stderr"]
    notes = f"exit code {code} after {elapsed:.2f}s"
    if code == 0:
        return Outcome.success(context_updates=dict(updates), notes=notes)
    last = err.strip().splitlines()[-1:] or out.strip().splitlines()[-1:]
    detail = f": {redact.clip(last[0], 200)}" if last else ""
    full = out_of_space(req.worktree, output)
    if full is not None:
        # Not the command's fault, and not a result to route on: the run stops where a
        # full disk stops every other write, resumable once there is room again.
        raise DiskFull(
            f"No space left on device under {full} (the command exited with status {code}{detail})"
        )
    return Outcome.failure(
        f"command exited with status {code}{detail}",
        DETERMINISTIC,
        context_updates=dict(updates),
        notes=notes,
    )


def _moved_out(path: Path, stage_dir: Path) -> Path:
    """A log too large to keep in memory, moved from the walk's output dir to the
    stage's own, where the checkpoint streams it into git from: the walk's next
    command stage writes over the output dir's, perhaps before that checkpoint (a
    branch's or a child workflow's stages are recorded with their parent's)."""
    moved = stage_dir / path.name
    os.replace(path, moved)
    return moved
