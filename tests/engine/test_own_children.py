"""A child `git fabro` started itself is never swept as something a stage left behind.

A sweep of adopted processes (`process_groups.sweep_adopted`) looks at this process's
children in sessions of their own, which is what a stage's orphans re-parented to the
subreaper are, and also what every stage, hook and event sink this process starts is.
Between its fork and its exec such a child still carries this process's environment,
without the mark that would spare it: the walk's end sweeping while the last
`checkpoint_saved` hook starts would kill the hook. Tested in process: a child started
with no mark stands for one caught in that window.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from fabro_git.engine import process_groups


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sweep reads /proc")
def test_a_child_started_here_without_a_mark_outlives_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process_groups._Subreaper, "on", True)
    env = {k: v for k, v in os.environ.items() if k != "FABRO_PROCESS_MARK"}

    async def main() -> tuple[list[int], int | None, int]:
        with open(os.devnull, "wb") as sink:
            child = await process_groups.start(
                ["sleep", "30"], cwd=tmp_path, stdout=sink, stderr=sink, env=env
            )
        try:
            killed = process_groups.sweep_adopted(None, hooks_too=False)
            alive = child.returncode
            return killed, alive, child.pid
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, 9)
            await child.wait()

    killed, returncode, pid = trio.run(main)
    assert pid not in killed and returncode is None
    assert pid not in process_groups._own_children  # forgotten once waited for


def test_a_process_this_one_did_not_start_is_still_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other side: an adopted-looking child not started through `start` (here a
    plain Popen in its own session, no mark) is what the sweep is for."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the sweep reads /proc")
    monkeypatch.setattr(process_groups._Subreaper, "on", True)
    env = {k: v for k, v in os.environ.items() if k != "FABRO_PROCESS_MARK"}
    child = subprocess.Popen(["sleep", "30"], start_new_session=True, env=env)
    try:
        killed = process_groups.sweep_adopted(None, hooks_too=False)
        assert child.pid in killed
    finally:
        child.kill()
        child.wait()


def test_a_pid_counted_as_this_ones_spares_only_the_process_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A child never waited for stays counted as this process's own; a later process
    given its pid (here: one whose start lies outside the counted child's) is swept all
    the same, while the child it counted is spared."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the sweep reads /proc")
    monkeypatch.setattr(process_groups._Subreaper, "on", True)
    env = {k: v for k, v in os.environ.items() if k != "FABRO_PROCESS_MARK"}
    counted = subprocess.Popen(["sleep", "30"], start_new_session=True, env=env)
    reused = subprocess.Popen(["sleep", "30"], start_new_session=True, env=env)
    try:
        process_groups.own_child(counted.pid)  # its start read from /proc
        # What an earlier child of the same pid would have left: a start long past.
        process_groups.own_child(reused.pid, (0, 1))
        killed = process_groups.sweep_adopted(None, hooks_too=False)
        assert reused.pid in killed
        assert counted.pid not in killed and counted.poll() is None
    finally:
        for child in (counted, reused):
            process_groups.child_ended(child.pid)
            child.kill()
            child.wait()
