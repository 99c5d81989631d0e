"""The v4a patch parser and applier, on their own: what they accept, what they refuse and why."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabro_git.agent.patch import (
    AddFile,
    DeleteFile,
    Hunk,
    PatchError,
    UpdateFile,
    apply_hunks,
    parse,
    plan,
)


def patch(*lines: str) -> str:
    return "\n".join(["*** Begin Patch", *lines, "*** End Patch"]) + "\n"


def test_add_delete_and_update_parse_into_operations() -> None:
    operations = parse(
        patch(
            "*** Add File: src/new.py",
            "+def greet():",
            "+    return 'hi'",
            "*** Delete File: old.py",
            "*** Update File: main.py",
            "*** Move to: app.py",
            "@@ def main():",
            "     print('a')",
            "-    return 0",
            "+    return 1",
        )
    )
    assert operations == [
        AddFile(path="src/new.py", lines=("def greet():", "    return 'hi'")),
        DeleteFile(path="old.py"),
        UpdateFile(
            path="main.py",
            move_to="app.py",
            hunks=(
                Hunk(
                    hint="def main():",
                    old=("    print('a')", "    return 0"),
                    new=("    print('a')", "    return 1"),
                ),
            ),
        ),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("*** Update File: a.py\n@@\n-x\n+y\n*** End Patch", "must start with"),
        ("*** Begin Patch\n*** Update File: a.py\n@@\n-x\n+y\n", "must end with"),
        (patch(), "no file operations"),
        (patch("*** Add File: a.py", "no plus sign"), "line 3: every line of an added file"),
        (patch("*** Update File: a.py"), "has no hunks"),
        (patch("*** Update File: a.py", "@@ hint"), "a hunk has no lines"),
        (patch("*** Update File: a.py", "@@", "?what", "+y"), "line 4: a hunk line starts"),
        (patch("*** Frobnicate File: a.py"), "line 2: expected '*** Add File:'"),
        (patch("*** Add File: "), "names no file"),
        (patch("*** Delete File: a.py", "*** Delete File: a.py"), "appears in the patch twice"),
    ],
)
def test_malformed_patches_are_refused_with_the_line_at_fault(text: str, message: str) -> None:
    with pytest.raises(PatchError, match=re.escape(message)):
        parse(text)


def test_a_first_hunk_may_leave_out_its_header_and_blank_lines_are_context() -> None:
    [operation] = parse(patch("*** Update File: a.txt", " one", "", "-three", "+THREE"))
    assert isinstance(operation, UpdateFile)
    [hunk] = operation.hunks
    assert hunk.hint is None
    assert hunk.old == ("one", "", "three")
    assert hunk.new == ("one", "", "THREE")


def test_multi_hunk_update_applies_in_order_and_keeps_the_final_newline() -> None:
    original = "TIMEOUT = 30\n\ndef load():\n    config = {}\n    config['debug'] = False\n    return config\n"
    [operation] = parse(
        patch(
            "*** Update File: config.py",
            "@@ TIMEOUT = 30",
            "-TIMEOUT = 30",
            "+TIMEOUT = 60",
            "@@ def load():",
            "     config = {}",
            "-    config['debug'] = False",
            "+    config['debug'] = True",
        )
    )
    assert isinstance(operation, UpdateFile)
    assert apply_hunks(original, operation.hunks, "config.py") == (
        "TIMEOUT = 60\n\ndef load():\n    config = {}\n    config['debug'] = True\n    return config\n"
    )


def test_the_hint_chooses_between_identical_blocks() -> None:
    original = "def a():\n    return 0\n\ndef b():\n    return 0\n"
    [operation] = parse(
        patch("*** Update File: m.py", "@@ def b():", "-    return 0", "+    return 2")
    )
    assert isinstance(operation, UpdateFile)
    assert apply_hunks(original, operation.hunks, "m.py") == (
        "def a():\n    return 0\n\ndef b():\n    return 2\n"
    )


def test_end_of_file_anchors_the_hunk_at_the_last_match() -> None:
    original = "x\nend\nx\nend\n"
    [operation] = parse(patch("*** Update File: f", "@@", " x", "-end", "+END", "*** End of File"))
    assert isinstance(operation, UpdateFile)
    assert apply_hunks(original, operation.hunks, "f") == "x\nend\nx\nEND\n"


def test_whitespace_and_typographic_quotes_are_matched_loosely() -> None:
    original = "say(\u201chello\u201d)   \n"
    [operation] = parse(patch("*** Update File: f", "@@", '-say("hello")', '+say("bye")'))
    assert isinstance(operation, UpdateFile)
    assert apply_hunks(original, operation.hunks, "f") == 'say("bye")\n'


def test_a_hunk_that_does_not_match_names_the_lines() -> None:
    [operation] = parse(patch("*** Update File: f", "@@", "-missing line", "+x"))
    assert isinstance(operation, UpdateFile)
    with pytest.raises(PatchError, match=r"hunk 1: these lines are not in the file:\nmissing line"):
        apply_hunks("present\n", operation.hunks, "f")


def test_hunks_out_of_order_do_not_apply() -> None:
    [operation] = parse(patch("*** Update File: f", "@@", "-b", "+B", "@@", "-a", "+A"))
    assert isinstance(operation, UpdateFile)
    with pytest.raises(PatchError, match=r"hunk 2: .* after the earlier hunks"):
        apply_hunks("a\nb\n", operation.hunks, "f")


def test_a_missing_hint_is_reported() -> None:
    [operation] = parse(patch("*** Update File: f", "@@ def gone():", "-a", "+b"))
    assert isinstance(operation, UpdateFile)
    with pytest.raises(PatchError, match="'def gone\\(\\):' is not in the file"):
        apply_hunks("a\n", operation.hunks, "f")


def test_plan_refuses_adding_an_existing_file_and_touching_a_missing_one() -> None:
    existing = {"a.txt": "x\n"}
    with pytest.raises(PatchError, match=r"cannot add a\.txt: it exists"):
        plan(parse(patch("*** Add File: a.txt", "+y")), existing.get)
    with pytest.raises(PatchError, match=r"cannot delete b\.txt: no such file"):
        plan(parse(patch("*** Delete File: b.txt")), existing.get)
    with pytest.raises(PatchError, match=r"cannot update b\.txt: no such file"):
        plan(parse(patch("*** Update File: b.txt", "@@", "-x", "+y")), existing.get)


def test_plan_of_a_move_writes_the_new_path_and_deletes_the_old() -> None:
    changes = plan(
        parse(patch("*** Update File: old.py", "*** Move to: new.py", "@@", "-a", "+b")),
        {"old.py": "a\n"}.get,
    )
    assert [(c.kind, c.path, c.content, c.moved_from) for c in changes] == [
        ("update", "new.py", "b\n", "old.py"),
        ("delete", "old.py", None, None),
    ]


def test_pure_additions_go_after_the_hint_or_at_the_end() -> None:
    [after_hint] = parse(patch("*** Update File: f", "@@ first", "+inserted"))
    [at_end] = parse(patch("*** Update File: f", "@@", "+appended"))
    assert isinstance(after_hint, UpdateFile) and isinstance(at_end, UpdateFile)
    assert apply_hunks("first\nlast\n", after_hint.hunks, "f") == "first\ninserted\nlast\n"
    assert apply_hunks("first\nlast\n", at_end.hunks, "f") == "first\nlast\nappended\n"


@st.composite
def edits(draw: st.DrawFn) -> tuple[list[str], int, int, list[str]]:
    """Distinct file lines, a region [start, end) to replace, and its replacement."""
    words = st.text(alphabet="abc xyz", max_size=8)
    count = draw(st.integers(min_value=1, max_value=30))
    lines = [f"{index}:{draw(words)}" for index in range(count)]
    start = draw(st.integers(min_value=0, max_value=count))
    end = draw(st.integers(min_value=start, max_value=count))
    replacement = [f"new:{word}" for word in draw(st.lists(words, max_size=5))]
    return lines, start, end, replacement


@given(edits(), st.integers(min_value=0, max_value=3))
def test_a_generated_hunk_reproduces_the_edit(
    edit: tuple[list[str], int, int, list[str]], context: int
) -> None:
    lines, start, end, replacement = edit
    if start == end and not replacement:
        return
    before = lines[max(0, start - context) : start]
    after = lines[end : end + context]
    if not before and not after and start == end:
        return  # a pure addition without context goes at the end, by design
    body = [f" {line}" for line in before]
    body += [f"-{line}" for line in lines[start:end]]
    body += [f"+{line}" for line in replacement]
    body += [f" {line}" for line in after]
    [operation] = parse(patch("*** Update File: f", "@@", *body))
    assert isinstance(operation, UpdateFile)
    original = "\n".join(lines) + "\n"
    expected = lines[:start] + replacement + lines[end:]
    assert apply_hunks(original, operation.hunks, "f") == "\n".join(expected) + "\n"
