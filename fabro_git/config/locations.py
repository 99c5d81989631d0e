"""Where local, disposable state lives.

Nothing here is the truth: the repository is. The scratch dir holds worktrees, the live
event tail and materialised files for runs in progress; deleting it loses nothing that a
snapshot already holds. `FABRO_HOME` overrides the platform's user data dir.
"""

from __future__ import annotations

import os
from pathlib import Path


def fabro_home() -> Path:
    override = os.environ.get("FABRO_HOME")
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("git-fabro", appauthor=False))


def runs_dir() -> Path:
    return fabro_home() / "runs"


def run_scratch_dir(run_id: str) -> Path:
    return runs_dir() / run_id


def crash_log_dir() -> Path:
    return fabro_home() / "crash-logs"
