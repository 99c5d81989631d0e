"""A run's setup commands: run once in its worktree, before its first stage.

They run as a stage's command does (the same environment, stripped of secrets, and
process records, so the walk's end sweeps what they leave running); the first that
fails fails the run before any stage starts.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from fabro_git import redact
from fabro_git.config.locations import make_private_dir
from fabro_git.engine import process_groups
from fabro_git.engine.checkpoint import Manifest
from fabro_git.engine.runner import Runtime
from fabro_git.errors import ConfigError
from fabro_git.events import catalogue


class SetupFailed(Exception):
    pass


async def run_setup(runtime: Runtime, manifest: Manifest, worktree: Path) -> None:
    from fabro_git.engine.process import argv_for, run_script
    from fabro_git.engine.stage_env import (
        NOTICE_CODE,
        mentioned_stripped,
        stage_environment,
        stripped_notice,
    )
    from fabro_git.workflow.templates import script_environment

    commands = manifest.options.setup_commands
    if not commands:
        return
    emit = runtime.emit
    emit(catalogue.SetupStarted(command_count=len(commands)))
    t0 = time.monotonic()
    logs = make_private_dir(runtime.scratch / "setup")
    records = process_groups.records_dir(runtime.scratch)
    sandbox = manifest.run_config.sandbox_env
    try:
        # Setup commands are swept with the stages', when the walk ends.
        base = stage_environment(sandbox=sandbox, mark=process_groups.process_mark(records))
    except ConfigError as exc:
        raise SetupFailed(str(exc)) from None
    env = script_environment(
        base, goal=manifest.goal, inputs=manifest.inputs, run_id=runtime.run_id
    )
    for index, command in enumerate(commands):
        names = mentioned_stripped(command, os.environ, sandbox)
        if names:
            where = f"setup command {index + 1}"
            emit(
                catalogue.RunNotice(
                    level="warn", code=NOTICE_CODE, message=stripped_notice(names, where)
                )
            )
        emit(catalogue.SetupCommandStarted(command=command, index=index))
        c0 = time.monotonic()
        out, err = logs / f"{index}.stdout", logs / f"{index}.stderr"
        code, _timed_out = await run_script(
            argv_for(command, "shell"),
            cwd=worktree,
            stdout=out,
            stderr=err,
            env=env,
            timeout=None,
            groups=records,
        )
        exit_code = -1 if code is None else code
        if exit_code != 0:
            stderr = redact.clip(err.read_bytes().decode("utf-8", "replace"), 4000, end=True)
            emit(
                catalogue.SetupFailed(
                    command=command, index=index, exit_code=exit_code, stderr=stderr
                )
            )
            raise SetupFailed(
                f"setup command {index + 1} ({command!r}) exited with status {exit_code}"
            )
        emit(
            catalogue.SetupCommandCompleted(
                command=command,
                index=index,
                exit_code=exit_code,
                duration_ms=int((time.monotonic() - c0) * 1000),
            )
        )
    emit(catalogue.SetupCompleted(duration_ms=int((time.monotonic() - t0) * 1000)))
