"""The file and search tools on their own, and the truncation they go through."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from fabro_git.agent.session import repeats
from fabro_git.agent.tools import TOOLS, ToolContext, ToolOutcome, check_arguments
from fabro_git.agent.truncation import (
    DEFAULT_LIMITS,
    truncate_chars,
    truncate_lines,
    truncate_tool_output,
)
from fabro_git.agent.workspace import ToolError, Workspace


@pytest.fixture
def context(worktree: Path) -> ToolContext:
    return ToolContext(
        workspace=Workspace(worktree),
        shell_env={},
        shell_default_timeout=5,
        shell_max_timeout=5,
        on_output=lambda _delta: None,
        on_skill=lambda _skill: None,
    )


def call(context: ToolContext, name: str, **arguments: Any) -> ToolOutcome:
    return trio.run(TOOLS[name].run, arguments, context)


def test_glob_lists_files_newest_first_and_hides_git_and_links_out(
    worktree: Path, context: ToolContext
) -> None:
    (worktree / "src").mkdir()
    (worktree / "src" / "old.py").write_text("")
    (worktree / "src" / "new.py").write_text("")
    os.utime(worktree / "src" / "old.py", (1_000_000, 1_000_000))
    outside = worktree.parent / "elsewhere"
    outside.mkdir()
    (outside / "secret.py").write_text("")
    (worktree / "src" / "link").symlink_to(outside)

    assert call(context, "glob", pattern="**/*.py").output == "src/new.py\nsrc/old.py"
    with pytest.raises(ToolError, match="git's internal files"):
        call(context, "glob", pattern="*", path=".git")
    assert ".git" not in call(context, "glob", pattern="**/*").output
    with pytest.raises(ToolError, match="must be relative"):
        call(context, "glob", pattern="../*")


def test_grep_finds_lines_with_their_place_and_skips_git_and_binaries(
    worktree: Path, context: ToolContext
) -> None:
    (worktree / "b.py").write_text("x = 1\nBETA = 2\n")
    (worktree / "blob.bin").write_bytes(b"beta\x00beta")
    assert call(context, "grep", pattern="beta").output == "a.txt:2: beta"
    assert call(context, "grep", pattern="beta", case_insensitive=True).output == (
        "a.txt:2: beta\nb.py:2: BETA = 2"
    )
    assert call(context, "grep", pattern="=", glob_filter="*.py").output == (
        "b.py:1: x = 1\nb.py:2: BETA = 2"
    )
    assert call(context, "grep", pattern="a", max_results=2).output == (
        "a.txt:1: alpha\na.txt:2: beta\n[stopped at 2 matches; narrow the search]"
    )
    assert call(context, "grep", pattern="repositoryformatversion").output == "no matches"
    with pytest.raises(ToolError, match="invalid regular expression"):
        call(context, "grep", pattern="(unclosed")


def test_edit_file_replace_all_and_its_refusals(worktree: Path, context: ToolContext) -> None:
    outcome = call(
        context, "edit_file", path="a.txt", old_string="a\n", new_string="A\n", replace_all=True
    )
    assert outcome.output == "edited a.txt: 3 replacement(s)"
    assert (worktree / "a.txt").read_text() == "alphA\nbetA\ngammA\n"
    with pytest.raises(ToolError, match="old_string was not found"):
        call(context, "edit_file", path="a.txt", old_string="zeta", new_string="z")
    with pytest.raises(ToolError, match="are the same"):
        call(context, "edit_file", path="a.txt", old_string="betA", new_string="betA")
    assert list(context.touched) == ["a.txt"]


def test_read_file_refuses_binaries_and_directories(worktree: Path, context: ToolContext) -> None:
    (worktree / "blob.bin").write_bytes(b"\x00\x01")
    with pytest.raises(ToolError, match="binary"):
        call(context, "read_file", path="blob.bin")
    with pytest.raises(ToolError, match="is a directory"):
        call(context, "read_file", path=str(worktree))
    os.mkfifo(worktree / "pipe")
    with pytest.raises(ToolError, match="not a regular file"):
        call(context, "read_file", path="pipe")
    with pytest.raises(ToolError, match="past the end"):
        call(context, "read_file", path="a.txt", offset=9)


def test_a_symlink_inside_the_worktree_is_followed(worktree: Path, context: ToolContext) -> None:
    (worktree / "alias.txt").symlink_to(worktree / "a.txt")
    call(context, "write_file", path="alias.txt", content="through the link\n")
    assert (worktree / "a.txt").read_text() == "through the link\n"
    assert list(context.touched) == ["a.txt"]


def test_a_linked_worktrees_git_file_is_refused(worktree: Path) -> None:
    linked = worktree.parent / "linked"
    linked.mkdir()
    (linked / ".git").write_text("gitdir: /somewhere\n")
    with pytest.raises(ToolError, match="git's internal files"):
        Workspace(linked).resolve(".git")
    with pytest.raises(ToolError, match="git's internal files"):
        Workspace(linked).resolve("sub/../.git")


def test_head_tail_truncation_keeps_both_ends_and_says_how_much_went() -> None:
    text = "H" * 100 + "M" * 800 + "T" * 100
    cut = truncate_chars(text, 200, "head_tail")
    assert cut.startswith("H" * 100) and cut.endswith("T" * 100)
    assert "800 characters were removed from the middle" in cut
    assert "M" not in cut


def test_tail_truncation_keeps_the_end() -> None:
    cut = truncate_chars("x" * 50 + "y" * 50, 50, "tail")
    assert cut.endswith("y" * 50) and "the first 50 characters were removed" in cut
    assert "x" not in cut.split("\n\n", 1)[1]


def test_lines_are_cut_after_characters() -> None:
    text = "\n".join(str(n) for n in range(1000))
    cut = truncate_lines(text, 10)
    assert cut.split("\n") == [
        "0",
        "1",
        "2",
        "3",
        "4",
        "[... 990 lines omitted ...]",
        "995",
        "996",
        "997",
        "998",
        "999",
    ]
    # Two enormous lines pass a line limit; the character limit still bounds them.
    huge = "a" * 100_000 + "\n" + "b" * 100_000
    limited = truncate_tool_output(huge, DEFAULT_LIMITS["shell"])
    assert len(limited) < 31_000
    assert truncate_tool_output("short", DEFAULT_LIMITS["shell"]) == "short"


@pytest.mark.parametrize(
    ("signatures", "window", "expected"),
    [
        (["a"] * 4, 4, True),
        (["a", "b"] * 3, 6, True),
        (["a", "b", "c"] * 2, 6, True),
        (["a", "b", "c", "d"], 4, False),
        (["a"] * 3, 4, False),
        (["x", "a", "b", "a", "b"], 4, True),
        (["a", "a", "a", "b"], 4, False),
    ],
)
def test_loop_patterns(signatures: list[str], window: int, expected: bool) -> None:
    assert repeats(signatures, window) is expected


def test_files_that_are_not_utf8_are_read_but_not_rewritten(
    worktree: Path, context: ToolContext
) -> None:
    (worktree / "latin1.txt").write_bytes(b"caf\xe9\n")
    assert call(context, "read_file", path="latin1.txt").output == "     1 | caf\ufffd"
    with pytest.raises(ToolError, match="is not UTF-8 text"):
        call(context, "edit_file", path="latin1.txt", old_string="caf", new_string="tea")
    patch = "*** Begin Patch\n*** Update File: latin1.txt\n@@\n-caf\ufffd\n+tea\n*** End Patch"
    with pytest.raises(ToolError, match="is not UTF-8 text"):
        call(context, "apply_patch", patch=patch)
    assert (worktree / "latin1.txt").read_bytes() == b"caf\xe9\n"


def test_grep_skips_what_git_ignores(worktree: Path, context: ToolContext) -> None:
    (worktree / ".gitignore").write_text("build/\n")
    (worktree / "build").mkdir()
    (worktree / "build" / "out.txt").write_text("beta from a build\n")
    (worktree / "sub").mkdir()
    (worktree / "sub" / "kept.txt").write_text("beta kept\n")
    assert (
        call(context, "grep", pattern="beta").output == "a.txt:2: beta\nsub/kept.txt:1: beta kept"
    )
    assert call(context, "grep", pattern="beta", path="sub").output == "sub/kept.txt:1: beta kept"


def test_grep_in_a_worktree_with_a_fifo_named_gitignore_answers(
    worktree: Path, context: ToolContext
) -> None:
    """git reads every `.gitignore` as it lists files and would wait on a FIFO for ever;
    the search walks the files itself then (and never opens the FIFO)."""
    (worktree / "sub").mkdir()
    fifo = worktree / "sub" / ".gitignore"
    os.mkfifo(fifo)
    (worktree / "sub" / "kept.txt").write_text("beta kept\n")
    answered: list[str] = []
    searching = threading.Thread(
        target=lambda: answered.append(call(context, "grep", pattern="beta").output), daemon=True
    )
    searching.start()
    searching.join(60)
    if searching.is_alive():  # let a git stuck on the FIFO go, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert answered == ["a.txt:2: beta\nsub/kept.txt:1: beta kept"]


def test_malformed_glob_patterns_are_tool_errors(context: ToolContext) -> None:
    for pattern in ("", "**.py"):
        with pytest.raises(ToolError, match="invalid glob pattern"):
            call(context, "glob", pattern=pattern)


_A_VALUE = {"string": "x", "integer": 3, "boolean": True}
_ANOTHER_KIND = {"string": 3, "integer": "3", "boolean": 1}


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_a_tools_arguments_are_checked_as_the_schema_the_model_is_shown_says(name: str) -> None:
    """Every argument the schema names is taken, null stands for an optional one left
    out, and a missing, unknown or mistyped one is refused in words the model can act on."""
    tool = TOOLS[name]
    schema = tool.spec.parameters
    properties, required = schema["properties"], schema["required"]
    assert schema["additionalProperties"] is False and set(required) <= set(properties)
    whole = {arg: _A_VALUE[spec["type"]] for arg, spec in properties.items()}
    check_arguments(tool, whole)
    check_arguments(tool, {arg: None if arg not in required else whole[arg] for arg in whole})
    for arg, spec in properties.items():
        with pytest.raises(ToolError, match=f"^{name}: '{arg}' must be a JSON {spec['type']}$"):
            check_arguments(tool, whole | {arg: _ANOTHER_KIND[spec["type"]]})
    for arg in required:
        with pytest.raises(ToolError, match=f"^{name}: the argument '{arg}' is required$"):
            check_arguments(tool, {k: v for k, v in whole.items() if k != arg})
    it_takes = ", ".join(properties)
    with pytest.raises(ToolError) as refused:
        check_arguments(tool, whole | {"colour": "red"})
    assert str(refused.value) == f"{name}: unknown argument 'colour'; it takes {it_takes}"


def test_grep_in_a_directory_shaped_as_a_git_dir_runs_nothing_it_names(
    worktree: Path, context: ToolContext
) -> None:
    """A directory holding HEAD, objects/, refs/ and a config is a repository to a git
    started in it, and its `core.fsmonitor` a program that git runs: the listing is
    asked of the worktree's own repository instead."""
    marker = worktree.parent / "fsmonitor-ran"
    trap = worktree / "trap"
    (trap / "objects").mkdir(parents=True)
    (trap / "refs").mkdir()
    (trap / "HEAD").write_text("ref: refs/heads/main\n")
    (trap / "config").write_text(
        "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tworktree = .\n"
        f"\tfsmonitor = touch {marker}\n"
    )
    (trap / "notes.txt").write_text("beta in the trap\n")
    found = call(context, "grep", pattern="beta", path="trap")
    assert found.output == "trap/notes.txt:1: beta in the trap"
    assert not marker.exists()
