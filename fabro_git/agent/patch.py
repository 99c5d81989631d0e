"""The v4a patch format OpenAI models write their edits in, parsed and applied.

A patch is a list of file operations between `*** Begin Patch` and `*** End Patch`:
add a file (every line `+`), delete one, or update one (optionally moving it) with
hunks of context (` `), removed (`-`) and added (`+`) lines, each hunk introduced by
`@@` and an optional hint line that narrows where it applies. The parser is strict about
structure and names the line it rejects, so the model can repair its patch; the matcher
is lenient about whitespace and typographic punctuation, which models often get wrong.

Applying is all or nothing: every operation is computed against the files as they are
before anything is written, so a patch whose third hunk does not match leaves the
worktree untouched.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from typing import Literal

import msgspec

BEGIN = "*** Begin Patch"
END = "*** End Patch"
ADD = "*** Add File: "
DELETE = "*** Delete File: "
UPDATE = "*** Update File: "
MOVE = "*** Move to: "
END_OF_FILE = "*** End of File"


class PatchError(Exception):
    """The patch is malformed or does not apply; the message is for the model."""


class Hunk(msgspec.Struct, frozen=True, kw_only=True):
    hint: str | None
    old: tuple[str, ...]
    new: tuple[str, ...]
    at_end: bool = False


class AddFile(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    lines: tuple[str, ...]


class DeleteFile(msgspec.Struct, frozen=True, kw_only=True):
    path: str


class UpdateFile(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    move_to: str | None
    hunks: tuple[Hunk, ...]


Operation = AddFile | DeleteFile | UpdateFile


def parse(text: str) -> list[Operation]:
    """The operations of a patch, or `PatchError` naming the first bad line."""
    lines = text.strip().split("\n")
    lines = [line.removesuffix("\r") for line in lines]
    if not lines or lines[0].strip() != BEGIN:
        raise PatchError(f"a patch must start with {BEGIN!r}")
    if lines[-1].strip() != END:
        raise PatchError(f"a patch must end with {END!r}")
    body = lines[1:-1]
    operations: list[Operation] = []
    seen: set[str] = set()
    index = 0
    while index < len(body):
        line = body[index]
        lineno = index + 2
        operation: Operation
        if line.startswith(ADD):
            operation, index = _added_file(body, index)
        elif line.startswith(DELETE):
            operation = DeleteFile(path=_path(line, DELETE, lineno))
            index += 1
        elif line.startswith(UPDATE):
            path = _path(line, UPDATE, lineno)
            index += 1
            move_to = None
            if index < len(body) and body[index].startswith(MOVE):
                move_to = _path(body[index], MOVE, index + 2)
                index += 1
            hunks, index = _hunks(body, index, path)
            operation = UpdateFile(path=path, move_to=move_to, hunks=tuple(hunks))
        elif not line.strip():
            index += 1
            continue
        else:
            raise PatchError(
                f"line {lineno}: expected '*** Add File:', '*** Delete File:' or "
                f"'*** Update File:', got {line!r}"
            )
        if operation.path in seen:
            raise PatchError(f"line {lineno}: {operation.path} appears in the patch twice")
        seen.add(operation.path)
        operations.append(operation)
    if not operations:
        raise PatchError("the patch holds no file operations")
    return operations


def _added_file(body: list[str], index: int) -> tuple[AddFile, int]:
    """The `*** Add File:` at `index` and its `+` lines; the index after them."""
    path = _path(body[index], ADD, index + 2)
    index += 1
    added: list[str] = []
    while index < len(body) and not body[index].startswith("*** "):
        if not body[index].startswith("+"):
            raise PatchError(
                f"line {index + 2}: every line of an added file starts with '+', "
                f"got {body[index]!r}"
            )
        added.append(body[index][1:])
        index += 1
    return AddFile(path=path, lines=tuple(added)), index


def _path(line: str, prefix: str, lineno: int) -> str:
    path = line[len(prefix) :].strip()
    if not path:
        raise PatchError(f"line {lineno}: {prefix.strip()} names no file")
    return path


def _hunks(body: list[str], index: int, path: str) -> tuple[list[Hunk], int]:
    hunks: list[Hunk] = []
    first = True
    while index < len(body):
        line = body[index]
        if line.startswith("@@"):
            hint = line[2:].strip() or None
            index += 1
        elif first and line[:1] in (" ", "-", "+"):
            hint = None  # a first hunk may leave out its `@@` line
        else:
            break
        first = False
        old: list[str] = []
        new: list[str] = []
        at_end = False
        while index < len(body):
            line = body[index]
            if line.strip() == END_OF_FILE:
                at_end = True
                index += 1
                break
            if line.startswith(("@@", "*** ")):
                break
            marker, rest = line[:1], line[1:]
            if marker == " " or line == "":
                old.append(rest)
                new.append(rest)
            elif marker == "-":
                old.append(rest)
            elif marker == "+":
                new.append(rest)
            else:
                raise PatchError(
                    f"line {index + 2}: a hunk line starts with ' ', '-' or '+', got {line!r}"
                )
            index += 1
        if not old and not new:
            raise PatchError(f"update of {path}: a hunk has no lines")
        hunks.append(Hunk(hint=hint, old=tuple(old), new=tuple(new), at_end=at_end))
    if not hunks:
        raise PatchError(f"update of {path} has no hunks (each starts with '@@')")
    return hunks, index


# ---------------------------------------------------------------------------- applying


class FileChange(msgspec.Struct, frozen=True, kw_only=True):
    """What one operation does to the worktree: `content` None deletes `path`."""

    kind: Literal["add", "delete", "update"]
    path: str
    content: str | None
    moved_from: str | None = None


def plan(operations: list[Operation], read: Callable[[str], str | None]) -> list[FileChange]:
    """The file writes the operations amount to, given `read(path)` (None: no such file)."""
    changes: list[FileChange] = []
    for operation in operations:
        if isinstance(operation, AddFile):
            if read(operation.path) is not None:
                raise PatchError(
                    f"cannot add {operation.path}: it exists (use '*** Update File:' to change it)"
                )
            content = "\n".join(operation.lines) + "\n" if operation.lines else ""
            changes.append(FileChange(kind="add", path=operation.path, content=content))
        elif isinstance(operation, DeleteFile):
            if read(operation.path) is None:
                raise PatchError(f"cannot delete {operation.path}: no such file")
            changes.append(FileChange(kind="delete", path=operation.path, content=None))
        else:
            original = read(operation.path)
            if original is None:
                raise PatchError(f"cannot update {operation.path}: no such file")
            updated = apply_hunks(original, operation.hunks, operation.path)
            if operation.move_to and operation.move_to != operation.path:
                if read(operation.move_to) is not None:
                    raise PatchError(
                        f"cannot move {operation.path} to {operation.move_to}: it exists"
                    )
                changes.append(
                    FileChange(
                        kind="update",
                        path=operation.move_to,
                        content=updated,
                        moved_from=operation.path,
                    )
                )
                changes.append(FileChange(kind="delete", path=operation.path, content=None))
            else:
                changes.append(FileChange(kind="update", path=operation.path, content=updated))
    return changes


def apply_hunks(original: str, hunks: tuple[Hunk, ...], path: str) -> str:
    lines = original.split("\n")
    trailing_newline = lines[-1] == ""
    if trailing_newline:
        lines.pop()
    replacements: list[tuple[int, int, tuple[str, ...]]] = []
    cursor = 0
    for number, hunk in enumerate(hunks, 1):
        start = cursor
        if hunk.hint is not None:
            found = _find(lines, (hunk.hint,), cursor)
            if found is None:
                raise PatchError(
                    f"update of {path}, hunk {number}: the context line {hunk.hint!r} is not "
                    "in the file (read the file and write the patch against its text)"
                )
            start = found
        if not hunk.old:
            position = start + 1 if hunk.hint is not None else len(lines)
            replacements.append((position, 0, hunk.new))
            cursor = position
            continue
        at = None
        if hunk.at_end:
            at = _find(lines, hunk.old, max(start, len(lines) - len(hunk.old)))
        if at is None:
            at = _find(lines, hunk.old, start)
        if at is None:
            shown = "\n".join(hunk.old)
            raise PatchError(
                f"update of {path}, hunk {number}: these lines are not in the file"
                f"{' after the earlier hunks' if cursor else ''}:\n{shown}"
            )
        replacements.append((at, len(hunk.old), hunk.new))
        cursor = at + len(hunk.old)
    for position, length, new in reversed(replacements):
        lines[position : position + length] = new
    text = "\n".join(lines)
    return text + "\n" if trailing_newline or not original else text


# Each pass compares lines more loosely; the first pass that finds the block wins.
_PUNCTUATION = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u2010": "-",
        "\u2011": "-",
        "\u2012": "-",
        "\u2013": "-",
        "\u2014": "-",
        "\u2212": "-",
        "\u00a0": " ",
    }
)
_NORMALISERS: tuple[Callable[[str], str], ...] = (
    lambda line: line,
    str.rstrip,
    str.strip,
    lambda line: unicodedata.normalize("NFKC", line).translate(_PUNCTUATION).strip(),
)


def _find(lines: list[str], block: tuple[str, ...], start: int) -> int | None:
    for normalise in _NORMALISERS:
        wanted = [normalise(line) for line in block]
        for position in range(max(0, start), len(lines) - len(block) + 1):
            if all(
                normalise(lines[position + offset]) == wanted[offset]
                for offset in range(len(block))
            ):
                return position
    return None
