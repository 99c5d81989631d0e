"""Which `git-fabro` a benchmark times: the one installed beside the interpreter that
runs it (`.venv/bin/python benchmarks/X.py` times that venv's), else the first on PATH,
so a stale install elsewhere on PATH is not measured by mistake."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def fabro_exe() -> str:
    found = shutil.which("git-fabro", path=str(Path(sys.executable).parent)) or shutil.which(
        "git-fabro"
    )
    if found is None:
        raise SystemExit("no git-fabro beside this interpreter nor on PATH; install the project")
    return found


def environ_with_fabro() -> dict[str, str]:
    """This process's environment with `fabro_exe()`'s directory first on PATH, so that
    `git fabro` runs the same command."""
    return dict(
        os.environ,
        PATH=os.pathsep.join([str(Path(fabro_exe()).parent), os.environ.get("PATH", "")]),
    )
