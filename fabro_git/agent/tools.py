"""The tools an agent works with, their JSON schemas, and what each does to the worktree.

Every profile gets `read_file`, `write_file`, `shell`, `grep` and `glob`; Anthropic and
Gemini models edit with `edit_file` (exact string replacement), OpenAI models with
`apply_patch` (the v4a format they are trained on). `use_skill` is offered when skills
exist. A tool that cannot do what it is asked raises `ToolError`: the model gets the
message as an error result and may try again; nothing a model sends can fail the stage.

Each built-in tool's arguments are a `ToolArguments` Struct: the model's JSON object is
decoded into it before the call is admitted (a missing, unknown or mistyped argument is
an error the model reads), and the JSON schema the model is shown is made from it, so
the two cannot disagree.

File tools go through `Workspace`, which confines them to the worktree. Their blocking
file I/O runs in a worker thread, so a large read does not stall other trio tasks.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, TypeVar

import msgspec
import trio

from fabro_git import redact
from fabro_git.agent import patch as v4a
from fabro_git.agent.shell import run_shell
from fabro_git.agent.skills import Skill, render
from fabro_git.agent.workspace import ToolError, Workspace
from fabro_git.config.protected import ConfigSnapshot, config_change_refused
from fabro_git.jsondata import JsonObject, JsonValue, section
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


# A tool's runner takes the call's arguments as the model sent them (a JSON object).
Runner = Callable[[Mapping[str, JsonValue], ToolContext], Awaitable[ToolOutcome]]


class ToolArguments(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The arguments of a built-in tool (a subclass per tool). An optional argument is
    `T | None = None`: models send null for one they leave out, and that means unset."""


Arguments = TypeVar("Arguments", bound=ToolArguments)


@dataclass(frozen=True)
class Tool:
    spec: ToolSpec
    run: Runner
    # What `check_arguments` decodes a call's arguments into before the call is
    # admitted; None for a tool whose schema is another program's (an MCP server's),
    # which checks its own arguments.
    arguments: type[ToolArguments] | None = None


def parameters_of(kind: type[ToolArguments]) -> JsonObject:
    """The JSON schema of `kind` as the model is shown it: one object, each optional
    argument given as its type alone (the null a model may send is not advertised)."""
    schema = msgspec.json.schema(kind)["$defs"][kind.__name__]
    properties: JsonObject = {}
    for name, prop in schema["properties"].items():
        prop = next((p for p in prop.get("anyOf", ()) if p.get("type") != "null"), prop)
        # Its type first, as the schemas were written by hand (the bytes sent stay the same).
        properties[name] = {"type": prop["type"]} | {
            key: value for key, value in prop.items() if key not in ("type", "default")
        }
    return {
        "type": "object",
        "properties": properties,
        "required": schema.get("required", []),
        "additionalProperties": False,
    }


def builtin(
    name: str,
    description: str,
    kind: type[Arguments],
    body: Callable[[Arguments, ToolContext], Awaitable[ToolOutcome]],
) -> Tool:
    """A tool whose arguments decode into `kind` before `body` sees them."""
    spec = ToolSpec(name=name, description=description, parameters=parameters_of(kind))

    async def run(arguments: Mapping[str, JsonValue], context: ToolContext) -> ToolOutcome:
        return await body(decode_arguments(spec, kind, arguments), context)

    return Tool(spec, run, kind)


_MISSING = re.compile(r"Object missing required field `(?P<name>[^`]+)`$")
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<name>[^`]+)`$")
_MISTYPED = re.compile(r" - at `\$\.(?P<name>[^`.\[]+)`$")


def decode_arguments(
    spec: ToolSpec, kind: type[Arguments], arguments: Mapping[str, JsonValue]
) -> Arguments:
    """`arguments` as `kind`; a `ToolError` the model can act on when they do not fit."""
    try:
        return msgspec.convert(arguments, kind)
    except msgspec.ValidationError as exc:
        raise ToolError(f"{spec.name}: {_misfit(spec, str(exc))}") from None


def _misfit(spec: ToolSpec, error: str) -> str:
    """msgspec's complaint about a call's arguments, in the words of the tool's schema."""
    properties = section(spec.parameters, "properties")
    if found := _MISSING.match(error):
        return f"the argument {found['name']!r} is required"
    if found := _UNKNOWN.match(error):
        return f"unknown argument {found['name']!r}; it takes {', '.join(properties)}"
    found = _MISTYPED.search(error)
    if found and found["name"] in properties:
        return f"{found['name']!r} must be a JSON {section(properties, found['name']).get('type')}"
    return error


def check_arguments(tool: Tool, arguments: Mapping[str, JsonValue]) -> None:
    """Refuse missing, unknown or mistyped arguments with a message the model can act on."""
    if tool.arguments is not None:
        decode_arguments(tool.spec, tool.arguments, arguments)


_PATH = msgspec.Meta(description="File path, relative to the worktree root.")


def _in_thread(
    body: Callable[[Arguments, ToolContext], str],
) -> Callable[[Arguments, ToolContext], Awaitable[ToolOutcome]]:
    async def run(arguments: Arguments, context: ToolContext) -> ToolOutcome:
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


class ReadFileArguments(ToolArguments):
    path: Annotated[str, _PATH]
    offset: Annotated[int, msgspec.Meta(description="First line, from 1.")] | None = None
    limit: Annotated[int, msgspec.Meta(description="Lines to read (2000).")] | None = None


def read_file(arguments: ReadFileArguments, context: ToolContext) -> str:
    shown = arguments.path
    text = _read_text(context.workspace.resolve(shown), shown)
    offset = max(1, arguments.offset or 1)
    limit = max(1, arguments.limit or READ_LIMIT_LINES)
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


class WriteFileArguments(ToolArguments):
    path: Annotated[str, _PATH]
    content: str


def write_file(arguments: WriteFileArguments, context: ToolContext) -> str:
    shown = arguments.path
    real = context.workspace.resolve(shown, write=True)
    if real.is_dir():
        raise ToolError(f"{shown}: is a directory")
    data = arguments.content.encode("utf-8")
    real.parent.mkdir(parents=True, exist_ok=True)
    existed = real.exists()
    real.write_bytes(data)
    context.touch(real)
    return f"{'overwrote' if existed else 'created'} {context.workspace.relative(real)} ({len(data)} bytes)"


class EditFileArguments(ToolArguments):
    path: Annotated[str, _PATH]
    old_string: str
    new_string: str
    replace_all: bool | None = None


def edit_file(arguments: EditFileArguments, context: ToolContext) -> str:
    shown = arguments.path
    old, new = arguments.old_string, arguments.new_string
    replace_all = bool(arguments.replace_all)
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


class ApplyPatchArguments(ToolArguments):
    patch: str


def apply_patch(arguments: ApplyPatchArguments, context: ToolContext) -> str:
    try:
        operations = v4a.parse(arguments.patch)
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


def _search_base(path: str | None, context: ToolContext) -> Path:
    path = path or "."
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
    """The files git lists under `base`; None when git cannot say, or would hang: git
    reads every `.gitignore` as it walks, and waits for ever on a FIFO by that name."""
    import subprocess

    from fabro_git.errors import FabroError, StoreError
    from fabro_git.store._gitcli import SEES_FIFO_WAITS, communicate_watching, popen_git
    from fabro_git.store.statcheck import special_files

    if not SEES_FIFO_WAITS and next(special_files(workspace.root), None) is not None:
        return None
    # git is asked from the worktree's root, never from the directory the model named:
    # there, a directory shaped as a git dir (committed, or written by the agent) would be
    # the repository git reads, config and all, and `core.fsmonitor` in it a program git
    # runs. No fsmonitor at all, whatever config git reads.
    root = workspace.root
    inside = os.path.relpath(base, root)
    args = ["-c", "core.fsmonitor=false", "ls-files", "-z", "--cached", "--others"]
    args += ["--exclude-standard", "--full-name", "--", inside]
    try:
        process = popen_git(args, cwd=root, stderr=subprocess.DEVNULL)
        listing, _ = communicate_watching(process, None, lambda: StoreError("a FIFO"))
    except (OSError, FabroError):
        return None
    if process.returncode != 0:
        return None
    files: list[Path] = []
    for name in sorted(set(listing.decode("utf-8", errors="surrogateescape").split("\0"))):
        if name.endswith("/"):
            return None  # a repository of its own inside: walked as plain files instead
        path = root / name
        if name and not workspace.is_hidden(path) and path.is_file():
            files.append(path)
    return files


class GrepArguments(ToolArguments):
    pattern: str
    path: Annotated[str, msgspec.Meta(description="File or directory.")] | None = None
    glob_filter: Annotated[str, msgspec.Meta(description="e.g. *.py")] | None = None
    case_insensitive: bool | None = None
    max_results: int | None = None


def grep(arguments: GrepArguments, context: ToolContext) -> str:
    import re2

    pattern = arguments.pattern
    flags = "(?i)" if arguments.case_insensitive else ""
    try:
        regex = re2.compile(flags + pattern)
    except Exception as exc:  # re2 raises its own error type for a bad pattern
        raise ToolError(f"invalid regular expression {pattern!r}: {exc}") from exc
    wanted = min(arguments.max_results or GREP_DEFAULT_RESULTS, GREP_MAX_RESULTS)
    name_filter = arguments.glob_filter
    workspace = context.workspace
    matches: list[str] = []
    for path in _walk_files(_search_base(arguments.path, context), workspace):
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
                matches.append(f"{relative}:{number}: {redact.clip(line, GREP_LINE_CHARS)}")
                if len(matches) >= wanted:
                    matches.append(f"[stopped at {wanted} matches; narrow the search]")
                    return "\n".join(matches)
    return "\n".join(matches) if matches else "no matches"


class GlobArguments(ToolArguments):
    pattern: str
    path: str | None = None


def glob(arguments: GlobArguments, context: ToolContext) -> str:
    pattern = arguments.pattern
    if Path(pattern).is_absolute() or ".." in Path(pattern).parts:
        raise ToolError("the pattern must be relative and stay inside the base directory")
    base = _search_base(arguments.path, context)
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


class ShellArguments(ToolArguments):
    command: str
    timeout_ms: Annotated[int, msgspec.Meta(description="Time limit.")] | None = None
    description: Annotated[str, msgspec.Meta(description="What it does.")] | None = None


async def shell(arguments: ShellArguments, context: ToolContext) -> ToolOutcome:
    timeout = context.shell_default_timeout
    if arguments.timeout_ms is not None:
        timeout = arguments.timeout_ms / 1000
    timeout = max(0.001, min(timeout, context.shell_max_timeout))
    before = None
    if context.workspace.guard_config is not None:
        before = await trio.to_thread.run_sync(ConfigSnapshot, context.workspace.guard_config)
    result = await run_shell(
        arguments.command,
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


class UseSkillArguments(ToolArguments):
    skill_name: str


async def use_skill(arguments: UseSkillArguments, context: ToolContext) -> ToolOutcome:
    name = arguments.skill_name.strip().lstrip("/")
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
        builtin(
            "read_file",
            "Read a text file of the worktree; lines come numbered "
            "('N | text'). Use offset and limit for a part of a long file.",
            ReadFileArguments,
            _in_thread(read_file),
        ),
        builtin(
            "write_file",
            "Write a whole file, creating it and its directories if needed "
            "and replacing what was there.",
            WriteFileArguments,
            _in_thread(write_file),
        ),
        builtin(
            "edit_file",
            "Replace an exact piece of a file. old_string must match the "
            "file's text exactly (whitespace too) and occur once, unless replace_all.",
            EditFileArguments,
            _in_thread(edit_file),
        ),
        builtin(
            "apply_patch",
            "Apply a patch in the v4a format: '*** Begin Patch', then "
            "'*** Add File: p' (lines '+'), '*** Delete File: p' or '*** Update File: p' "
            "(optional '*** Move to: q') with '@@' hunks of ' ', '-', '+' lines, then "
            "'*** End Patch'. All changes apply or none do.",
            ApplyPatchArguments,
            _in_thread(apply_patch),
        ),
        builtin(
            "shell",
            "Run a command with bash in the worktree; stdout and stderr "
            "come back merged, with the exit code. Background jobs end with the command.",
            ShellArguments,
            shell,
        ),
        builtin(
            "grep",
            "Search file contents with a regular expression (RE2 syntax); "
            "answers 'path:line: text'.",
            GrepArguments,
            _in_thread(grep),
        ),
        builtin(
            "glob",
            "List files matching a glob pattern such as '**/*.py', newest first.",
            GlobArguments,
            _in_thread(glob),
        ),
        builtin(
            "use_skill",
            "Load the instructions of one of the available skills.",
            UseSkillArguments,
            use_skill,
        ),
    )
}

PROFILE_TOOLS = {
    "anthropic": ("read_file", "write_file", "edit_file", "shell", "grep", "glob"),
    "gemini": ("read_file", "write_file", "edit_file", "shell", "grep", "glob"),
    "openai": ("read_file", "apply_patch", "write_file", "shell", "grep", "glob"),
}
