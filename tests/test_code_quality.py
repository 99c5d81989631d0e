"""The tree stays lint-clean, formatted and type-checked: part of the test command, so
CI and every developer run it the same way."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (pip install '.[test]')")
    return found


@pytest.mark.parametrize(
    "argv",
    [["ruff", "check", "--quiet", "."], ["ruff", "format", "--check", "--quiet", "."], ["mypy"]],
    ids=["ruff-check", "ruff-format", "mypy"],
)
def test_tree_is_clean(argv: list[str]) -> None:
    proc = subprocess.run(
        [_tool(argv[0]), *argv[1:]], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, f"{' '.join(argv)}:\n{proc.stdout}{proc.stderr}"
