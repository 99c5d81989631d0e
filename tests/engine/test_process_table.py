"""The sweep's view of `/proc` after each stage (`reaper.ProcessTable`): it reads again
only what may have become the run's, and still sees every process of the run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fabro_git.engine import reaper

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_the_table_reads_again_only_new_processes_and_descendants(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = reaper.ProcessTable()
    before = {p.pid for p in table.read()}
    read: list[int] = []
    real = reaper.read_stat

    def counting(pid: int) -> reaper.ProcessInfo | None:
        read.append(pid)
        return real(pid)

    monkeypatch.setattr(reaper, "read_stat", counting)
    child = subprocess.Popen(["sleep", "30"])
    try:
        after = {p.pid: p for p in table.read()}
        # The new process is read, and seen as this process's child.
        assert child.pid in read
        assert after[child.pid].ppid == reaper.os.getpid()
        # Init, and whatever else was there before and is no descendant, is not read again.
        unrelated = (
            before
            - {reaper.os.getpid()}
            - {
                p.pid
                for p in reaper.descendants(
                    [reaper.os.getpid()], list(after.values()), zombies=True
                )
            }
        )
        assert 1 in unrelated or 1 not in before
        assert not unrelated & set(read)
        # A descendant is read at every look: what it is now, not what it was.
        read.clear()
        table.read()
        assert child.pid in read
    finally:
        child.kill()
        child.wait()
