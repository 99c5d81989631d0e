"""Shipped example workflows, usable by name wherever a workflow file is expected."""

from __future__ import annotations

from pathlib import Path

from fabro_git.workflow.paths import examples_dir


def example_names() -> list[str]:
    return sorted(p.stem for p in examples_dir().glob("*.fabro"))


def find_example(arg: str | Path) -> Path | None:
    """The shipped example called `arg` (`hello` or `hello.fabro`), when `arg` is not a
    path that exists."""
    text = str(arg)
    if Path(text).expanduser().exists() or "/" in text:
        return None
    for candidate in (examples_dir() / text, examples_dir() / f"{text}.fabro"):
        if candidate.is_file():
            return candidate
    return None


def workflow_path(arg: str | Path) -> Path:
    """`arg` itself, or the shipped example it names."""
    return find_example(arg) or Path(arg).expanduser()
