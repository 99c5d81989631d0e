"""The tools an agent works with, their JSON schemas, and what each does to the worktree.

Every profile gets `read_file`, `write_file`, `shell`, `grep` and `glob`; Anthropic and
Gemini models edit with `edit_file` (exact string replacement), OpenAI models with
`apply_patch` (the v4a format they are trained on). `use_skill` is offered when skills
exist. A tool that cannot do what it is asked raises `ToolError`: the model gets the
message as an error result and may try again; nothing a model sends can fail the stage.

File tools go through `Workspace`, which confines them to the worktree. Their blocking
file I/O runs in a worker thread, so a large read does not stall other trio tasks.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import trio

from fabro_git.agent import patch as v4a
from fabro_git.agent.shell import run_shell
from fabro_git.agent.skills import Skill, render
from fabro_git.agent.workspace import ToolError, Workspace
from fabro_git.config.protected import ConfigSnapshot, config_change_refused
from fabro_git.engine.stage_env import GIT_LOCATION_VARIABLES
from fabro_git.llm.types import ToolSpec

READ_LIMIT_LINES = 2000
GREP_DEFAULT_RESULTS = 100
GREP_MAX_RESULTS = 1000
GREP_LINE_CHARS = 500
GLOB_MAX_RESULTS = 2000
BINARY_PROBE = 8192
MAX_READ_BYTES = 16 * 1024 * 1024


class ToolOutcome(msgspec.Struct, frozen=True, kw_only=True):
    output: str
    is_error: bool = False


@dataclass
class ToolContext:
    """What a tool may use: the confined worktree, the shell's environment and limits,
    a sink for streamed output, and the record of files written."""

    workspace: Workspace
    shell_env: Mapping[str, str]
    shell_default_timeout: float
    shell_max_timeout: float
    on_output: Callable[[str], object]
    on_skill: Callable[[Skill], None]
    on_process_group: Callable[[int, bool], object] | None = None
    skills: dict[str, Skill] = field(default_factory=dict)
    touched: dict[str, None] = field(default_factory=dict)

    def touch(self, real: Path) -> None:
        self.touched[self.workspace.relative(real)] = None


Runner = Callable[[dict[str, Any], ToolContext], Awaitable[ToolOutcome]]


@dataclass(frozen=True)
class Tool:
    spec: ToolSpec
    run: Runner
    # Whether `check_arguments` vets a call first; a tool whose schema is another
    # program's (an MCP server's) checks its own arguments.
    strict: bool = True


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


_PATH = {"type": "string", "description": "File path, relative to the worktree root."}


def _in_thread(body: Callable[[dict[str, Any], ToolContext], str]) -> Runner:
    async def run(arguments: dict[str, Any], context: ToolContext) -> ToolOutcome:
        output = await trio.to_thread.run_sync(body, arguments, context)
        return ToolOutcome(output=output)

    return run


# ---------------------------------------------------------------------------- files


def _read_text(real: Path, shown: str, *, for_edit: bool = False) -> str:
    """The file's text. A file to be rewritten must be valid UTF-8: decoding with
    replacement characters and writing back would corrupt it."""
    if not real.exists():
        raise ToolError(f"{shown}: no such file")
    if real.is_dir():
        raise ToolError(f"{shown}: is a directory (use glob to list it)")
    if not real.is_file():
        raise ToolError(f"{shown}: is not a regular file")
    if real.stat().st_size > MAX_READ_BYTES:
        raise ToolError(
            f"{shown}: is larger than {MAX_READ_BYTES // (1024 * 1024)} MiB; "
            "use grep or the shell (head, sed -n) to look at parts of it"
        )
    data = real.read_bytes()
    if b"\x00" in data[:BINARY_PROBE]:
        raise ToolError(f"{shown}: is a binary file")
    if not for_edit:
        return data.decode("utf-8", errors="replace")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError(
            f"{shown}: is not UTF-8 text ({exc.reason} at byte {exc.start}); change it with the shell"
        ) from exc


def read_file(arguments: dict[str, Any], context: ToolContext) -> str:
    shown = arguments["path"]
    text = _read_text(context.workspace.resolve(shown), shown)
    offset = max(1, int(arguments.get("offset") or 1))
    limit = max(1, int(arguments.get("limit") or READ_LIMIT_LINES))
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        return f"({shown} is empty)"
    if offset > len(lines):
        raise ToolError(f"{shown}: has {len(lines)} lines; offset {offset} is past the end")
    chosen = lines[offset - 1 : offset - 1 + limit]
    numbered = [f"{number:>6} | {line}" for number, line in enumerate(chosen, offset)]
    last = offset - 1 + len(chosen)
    if last < len(lines):
        numbered.append(f"[lines {offset}-{last} of {len(lines)}; use offset to read on]")
    return "\n".join(numbered)


def write_file(arguments: dict[str, Any], context: ToolContext) -> str:
    shown = arguments["path"]
    real = context.workspace.resolve(shown, write=True)
    if real.is_dir():
        raise ToolError(f"{shown}: is a directory")
    data = arguments["content"].encode("utf-8")
    real.parent.mkdir(parents=True, exist_ok=True)
    existed = real.exists()
    real.write_bytes(data)
    context.touch(real)
    return f"{'overwrote' if existed else 'created'} {context.workspace.relative(real)} ({len(data)} bytes)"


def edit_file(arguments: dict[str, Any], context: ToolContext) -> str:
    shown = arguments["path"]
    old, new = arguments["old_string"], arguments["new_string"]
    replace_all = bool(arguments.get("replace_all", False))
    real = context.workspace.resolve(shown, write=True)
    text = _read_text(real, shown, for_edit=True)
    if not old:
        raise ToolError("old_string is empty; to write a whole file use write_file")
    if old == new:
        raise ToolError("old_string and new_string are the same; nothing would change")
    count = text.count(old)
    if count == 0:
        raise ToolError(
            f"{shown}: old_string was not found; read the file and copy the text exactly, "
            "whitespace included"
        )
    if count > 1 and not replace_all:
        raise ToolError(
            f"{shown}: old_string occurs {count} times; include more surrounding lines so "
            "it is unique, or set replace_all to replace every occurrence"
        )
    updated = text.replace(old, new) if replace_all else text.replace(old, new, 1)
    real.write_text(updated, encoding="utf-8")
    context.touch(real)
    replaced = count if replace_all else 1
    return f"edited {context.workspace.relative(real)}: {replaced} replacement(s)"


def apply_patch(arguments: dict[str, Any], context: ToolContext) -> str:
    try:
        operations = v4a.parse(arguments["patch"])
    except v4a.PatchError as exc:
        raise ToolError(f"the patch is malformed: {exc}") from exc

    def read(path: str) -> str | None:
        real = context.workspace.resolve(path)
        return _read_text(real, path, for_edit=True) if real.exists() else None

    try:
        changes = v4a.plan(operations, read)
    except v4a.PatchError as exc:
        raise ToolError(f"the patch does not apply (nothing was changed): {exc}") from exc
    # Every path is vetted before the first is written: a refused one changes nothing.
    reals = [context.workspace.resolve(change.path, write=True) for change in changes]
    for change, real in zip(changes, reals, strict=True):
        if change.content is None:
            real.unlink()
        else:
            real.parent.mkdir(parents=True, exist_ok=True)
            real.write_text(change.content, encoding="utf-8")
        context.touch(real)
    moved = {change.moved_from for change in changes if change.moved_from}
    letters = {"add": "A", "delete": "D", "update": "M"}
    summary = [
        f"R {change.moved_from} -> {change.path}"
        if change.moved_from
        else f"{letters[change.kind]} {change.path}"
        for change in changes
        if not (change.kind == "delete" and change.path in moved)
    ]
    return "applied:\n" + "\n".join(summary)


# ---------------------------------------------------------------------------- search


def _search_base(arguments: dict[str, Any], context: ToolContext) -> Path:
    path = arguments.get("path") or "."
    real = context.workspace.resolve(path)
    if not real.exists():
        raise ToolError(f"{path}: no such file or directory")
    return real


def _walk_files(base: Path, workspace: Workspace) -> list[Path]:
    """The files under `base` a search looks at: those git tracks or would track (so
    ignored build output and dependencies are skipped, as ripgrep skips them), or every
    file when the worktree is not a git checkout."""
    if base.is_file():
        return [base]
    listed = _git_files(base, workspace)
    if listed is not None:
        return listed
    files: list[Path] = []
    for directory, subdirectories, names in os.walk(base):
        subdirectories[:] = sorted(d for d in subdirectories if d != ".git")
        for name in sorted(names):
            path = Path(directory) / name
            if not workspace.is_hidden(path) and path.is_file():
                files.append(path)
    return files


def _git_files(base: Path, workspace: Workspace) -> list[Path] | None:
    import subprocess

    try:
        listing = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "."],
            cwd=base,
            env={k: v for k, v in os.environ.items() if k not in GIT_LOCATION_VARIABLES},
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    files: list[Path] = []
    for name in sorted(set(listing.decode("utf-8", errors="surrogateescape").split("\0"))):
        path = base / name
        if name and not workspace.is_hidden(path) and path.is_file():
            files.append(path)
    return files


def grep(arguments: dict[str, Any], context: ToolContext) -> str:
    import re2

    pattern = arguments["pattern"]
    flags = "(?i)" if arguments.get("case_insensitive") else ""
    try:
        regex = re2.compile(flags + pattern)
    except Exception as exc:  # re2 raises its own error type for a bad pattern
        raise ToolError(f"invalid regular expression {pattern!r}: {exc}") from exc
    wanted = min(int(arguments.get("max_results") or GREP_DEFAULT_RESULTS), GREP_MAX_RESULTS)
    name_filter = arguments.get("glob_filter")
    workspace = context.workspace
    matches: list[str] = []
    for path in _walk_files(_search_base(arguments, context), workspace):
        relative = workspace.relative(path)
        if name_filter and not (
            fnmatch.fnmatch(path.name, name_filter) or fnmatch.fnmatch(relative, name_filter)
        ):
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if b"\x00" in data[:BINARY_PROBE]:
            continue
        for number, line in enumerate(data.decode("utf-8", errors="replace").split("\n"), 1):
            if regex.search(line):
                matches.append(f"{relative}:{number}: {line[:GREP_LINE_CHARS]}")
                if len(matches) >= wanted:
                    matches.append(f"[stopped at {wanted} matches; narrow the search]")
                    return "\n".join(matches)
    return "\n".join(matches) if matches else "no matches"


def glob(arguments: dict[str, Any], context: ToolContext) -> str:
    pattern = arguments["pattern"]
    if Path(pattern).is_absolute() or ".." in Path(pattern).parts:
        raise ToolError("the pattern must be relative and stay inside the base directory")
    base = _search_base(arguments, context)
    workspace = context.workspace
    found: list[tuple[float, str]] = []
    try:
        for path in base.glob(pattern):
            if workspace.is_hidden(path) or not path.is_file():
                continue
            found.append((path.stat().st_mtime, workspace.relative(Path(os.path.realpath(path)))))
            if len(found) >= GLOB_MAX_RESULTS:
                break
    except ValueError as exc:  # pathlib's word for a malformed pattern
        raise ToolError(f"invalid glob pattern {pattern!r}: {exc}") from exc
    if not found:
        return "no files match"
    found.sort(key=lambda item: (-item[0], item[1]))
    return "\n".join(path for _, path in found)


# ---------------------------------------------------------------------------- shell, skills


async def shell(arguments: dict[str, Any], context: ToolContext) -> ToolOutcome:
    timeout = context.shell_default_timeout
    if arguments.get("timeout_ms") is not None:
        timeout = int(arguments["timeout_ms"]) / 1000
    timeout = max(0.001, min(timeout, context.shell_max_timeout))
    before = None
    if context.workspace.guard_config is not None:
        before = await trio.to_thread.run_sync(ConfigSnapshot, context.workspace.guard_config)
    result = await run_shell(
        arguments["command"],
        cwd=str(context.workspace.root),
        env=context.shell_env,
        timeout=timeout,
        on_output=context.on_output,
        on_process_group=context.on_process_group,
    )
    if result.timed_out:
        return ToolOutcome(output=result.output, is_error=True)
    footer = f"[exit code {result.exit_code}; {result.duration_ms} ms]"
    text = f"{result.output.rstrip(chr(10))}\n{footer}" if result.output else footer
    if before is not None:
        refused = await trio.to_thread.run_sync(config_change_refused, before)
        if refused is not None:
            return ToolOutcome(output=f"{text}\n{refused}", is_error=True)
    return ToolOutcome(output=text)


async def use_skill(arguments: dict[str, Any], context: ToolContext) -> ToolOutcome:
    name = arguments["skill_name"].strip().lstrip("/")
    skill = context.skills.get(name)
    if skill is None:
        known = ", ".join(context.skills) or "none"
        raise ToolError(f"no skill named {name!r}; the skills are: {known}")
    context.on_skill(skill)
    return ToolOutcome(output=render(skill, ""))


# ---------------------------------------------------------------------------- registry

TOOLS: dict[str, Tool] = {
    tool.spec.name: tool
    for tool in (
        Tool(
            ToolSpec(
                name="read_file",
                description="Read a text file of the worktree; lines come numbered "
                "('N | text'). Use offset and limit for a part of a long file.",
                parameters=_schema(
                    {
                        "path": _PATH,
                        "offset": {"type": "integer", "description": "First line, from 1."},
                        "limit": {"type": "integer", "description": "Lines to read (2000)."},
                    },
                    ["path"],
                ),
            ),
            _in_thread(read_file),
        ),
        Tool(
            ToolSpec(
                name="write_file",
                description="Write a whole file, creating it and its directories if needed "
                "and replacing what was there.",
                parameters=_schema(
                    {"path": _PATH, "content": {"type": "string"}}, ["path", "content"]
                ),
            ),
            _in_thread(write_file),
        ),
        Tool(
            ToolSpec(
                name="edit_file",
                description="Replace an exact piece of a file. old_string must match the "
                "file's text exactly (whitespace too) and occur once, unless replace_all.",
                parameters=_schema(
                    {
                        "path": _PATH,
                        "old_string": {"type": "string"},
                        "new_string": {"type": "string"},
                        "replace_all": {"type": "boolean"},
                    },
                    ["path", "old_string", "new_string"],
                ),
            ),
            _in_thread(edit_file),
        ),
        Tool(
            ToolSpec(
                name="apply_patch",
                description="Apply a patch in the v4a format: '*** Begin Patch', then "
                "'*** Add File: p' (lines '+'), '*** Delete File: p' or '*** Update File: p' "
                "(optional '*** Move to: q') with '@@' hunks of ' ', '-', '+' lines, then "
                "'*** End Patch'. All changes apply or none do.",
                parameters=_schema({"patch": {"type": "string"}}, ["patch"]),
            ),
            _in_thread(apply_patch),
        ),
        Tool(
            ToolSpec(
                name="shell",
                description="Run a command with bash in the worktree; stdout and stderr "
                "come back merged, with the exit code. Background jobs end with the command.",
                parameters=_schema(
                    {
                        "command": {"type": "string"},
                        "timeout_ms": {"type": "integer", "description": "Time limit."},
                        "description": {"type": "string", "description": "What it does."},
                    },
                    ["command"],
                ),
            ),
            shell,
        ),
        Tool(
            ToolSpec(
                name="grep",
                description="Search file contents with a regular expression (RE2 syntax); "
                "answers 'path:line: text'.",
                parameters=_schema(
                    {
                        "pattern": {"type": "string"},
                        "path": {"type": "string", "description": "File or directory."},
                        "glob_filter": {"type": "string", "description": "e.g. *.py"},
                        "case_insensitive": {"type": "boolean"},
                        "max_results": {"type": "integer"},
                    },
                    ["pattern"],
                ),
            ),
            _in_thread(grep),
        ),
        Tool(
            ToolSpec(
                name="glob",
                description="List files matching a glob pattern such as '**/*.py', newest first.",
                parameters=_schema(
                    {"pattern": {"type": "string"}, "path": {"type": "string"}}, ["pattern"]
                ),
            ),
            _in_thread(glob),
        ),
        Tool(
            ToolSpec(
                name="use_skill",
                description="Load the instructions of one of the available skills.",
                parameters=_schema({"skill_name": {"type": "string"}}, ["skill_name"]),
            ),
            use_skill,
        ),
    )
}

PROFILE_TOOLS = {
    "anthropic": ("read_file", "write_file", "edit_file", "shell", "grep", "glob"),
    "gemini": ("read_file", "write_file", "edit_file", "shell", "grep", "glob"),
    "openai": ("read_file", "apply_patch", "write_file", "shell", "grep", "glob"),
}

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "boolean": (bool,),
}


def check_arguments(tool: Tool, arguments: dict[str, Any]) -> None:
    """Refuse missing, unknown or mistyped arguments with a message the model can act on."""
    schema: dict[str, Any] = tool.spec.parameters
    properties: dict[str, Any] = schema["properties"]
    for name in schema.get("required", []):
        if name not in arguments:
            raise ToolError(f"{tool.spec.name}: the argument {name!r} is required")
    for name, value in arguments.items():
        if name not in properties:
            raise ToolError(
                f"{tool.spec.name}: unknown argument {name!r}; it takes {', '.join(properties)}"
            )
        kind = properties[name]["type"]
        if value is None and name not in schema.get("required", []):
            continue
        if not isinstance(value, _JSON_TYPES[kind]) or (
            kind == "integer" and isinstance(value, bool)
        ):
            raise ToolError(f"{tool.spec.name}: {name!r} must be a JSON {kind}")
