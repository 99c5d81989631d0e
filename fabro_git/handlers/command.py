"""Command nodes: run a script in the worktree.

Output streams straight to files in the stage's scratch dir, so a command that prints a
gigabyte costs disk, not memory. The meta ref keeps a capped copy (META_LIMIT: the whole
output when smaller, else its head and tail), and the context gets that same copy: over
the offload threshold the engine moves it to the artifact store and the context keeps a
pointer, so a large output is kept once, not in every checkpoint. The command runs in
its own process group (`fabro_git.engine.process`), so a timeout or Ctrl-C stops
everything it started, not just the shell. The run's goal and inputs reach the script
only through its environment (`script_environment`).
"""

from __future__ import annotations

import os
import time

from fabro_git.engine import outcome as oc
from fabro_git.engine.outcome import Outcome
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


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def stage_environment(req: StageRequest) -> dict[str, str]:
    """The environment a stage's program runs with (a command's script, an agent CLI):
    the run's values as FABRO_* variables, and no variable that would point git at
    another repository than the worktree's."""
    env = script_environment(
        os.environ, goal=req.goal, inputs=req.inputs, run_id=req.run_id, node_id=req.node.id
    )
    env.update(FABRO_STAGE_ID=req.stage_id, FABRO_WORKTREE=str(req.worktree))
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    env.pop("GIT_INDEX_FILE", None)
    return env


async def execute(req: StageRequest) -> Outcome:
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
    stdout_path = req.stage_dir / "stdout.log"
    stderr_path = req.stage_dir / "stderr.log"
    env = stage_environment(req)
    script_name = "script.sh" if language == "shell" else "script.py"

    def keep_output() -> dict[str, str]:
        req.files[script_name] = script.encode()
        out = req.files["stdout.log"] = excerpt(stdout_path, META_LIMIT)
        err = req.files["stderr.log"] = excerpt(stderr_path, META_LIMIT)
        return {"command.output": _text(out), "command.stderr": _text(err)}

    def timed_out(seconds: float) -> Outcome:
        return Outcome.failure(
            f"command timed out after {seconds:g}s", oc.TRANSIENT, context_updates=keep_output()
        )

    req.on_timeout(timed_out)
    started = time.monotonic()
    code, _ = await run_script(
        argv_for(script, language),
        cwd=req.worktree,
        stdout=stdout_path,
        stderr=stderr_path,
        env=env,
        timeout=None,
        groups=req.process_groups,
    )
    elapsed = time.monotonic() - started
    updates = keep_output()
    out, err = updates["command.output"], updates["command.stderr"]
    notes = f"exit code {code} after {elapsed:.2f}s"
    if code == 0:
        return Outcome.success(context_updates=updates, notes=notes)
    last = err.strip().splitlines()[-1:] or out.strip().splitlines()[-1:]
    detail = f": {last[0][:200]}" if last else ""
    full = out_of_space(req.worktree, req.stage_dir)
    if full is not None:
        # Not the command's fault, and not a result to route on: the run stops where a
        # full disk stops every other write, resumable once there is room again.
        raise DiskFull(
            f"No space left on device under {full} (the command exited with status {code}{detail})"
        )
    return Outcome.failure(
        f"command exited with status {code}{detail}",
        oc.DETERMINISTIC,
        context_updates=updates,
        notes=notes,
    )
