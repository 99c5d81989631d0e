"""Run configuration: the typed `run.toml` schema and the layers that feed it.

A run's settings come from four layers, highest first: the command line, the run
config (`git fabro run run.toml`), the repository's `.fabro/project.toml`, and the
user's `settings.toml` in the platform config dir. `effective_config` is the one place
they meet: each layer is checked on its own (so an error names the file it is in),
then the raw tables are merged key by key (a table in a higher layer overrides only the
keys it sets; a list or a scalar replaces) and the result is checked once more as a
whole. The effective `[run]` table is recorded in the run's manifest, so `git fabro
inspect` shows what the run actually used.

Only a run config may name the graph (`[workflow]`): project and user layers hold
defaults for `[run]` keys and nothing else.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Literal, get_args

import msgspec

from fabro_git.config.toml_source import convert, find_line, key_path, toml_error
from fabro_git.errors import ConfigError, SourceError
from fabro_git.jsondata import JsonObject, JsonValue, section

SCHEMA_VERSION = 1
PROJECT_CONFIG = Path(".fabro") / "project.toml"
DEFAULT_GRAPH = "workflow.fabro"

HOOK_EVENTS = (
    "run_start",
    "run_complete",
    "run_failed",
    "stage_start",
    "stage_complete",
    "stage_failed",
    "stage_retrying",
    "edge_selected",
    "parallel_start",
    "parallel_complete",
    "sandbox_ready",
    "sandbox_cleanup",
    "checkpoint_saved",
    "pre_tool_use",
    "post_tool_use",
    "post_tool_use_failure",
)


# The permission levels of agent stages, lowest first (`fabro_git.agent.permissions`
# says what each lets through). Named here, at the bottom of the package stack, because
# a workflow's `permissions` attribute and `[run.agent] permissions` are checked with
# them as well as the agent's tool dispatch.
PermissionLevel = Literal["read-only", "read-write", "full"]
PERMISSION_LEVELS: tuple[PermissionLevel, ...] = get_args(PermissionLevel)
DEFAULT_PERMISSION_LEVEL: PermissionLevel = "read-write"


def permission_level(value: str) -> PermissionLevel | None:
    """`value` as a permission level, or None when it names none."""
    for level in PERMISSION_LEVELS:
        if value == level:
            return level
    return None


class _Table(msgspec.Struct, omit_defaults=True):
    """A table of the schema. A key it does not name is refused in a file a person
    wrote (`toml_source.convert`) and ignored in a run's recorded configuration, which
    a later version may have written."""


class ModelConfig(_Table):
    name: str | None = None
    provider: str | None = None
    fallbacks: list[str] | None = None


# What an item of `[run.agent] cli_command` may name.
CLI_PLACEHOLDERS = ("{prompt_file}", "{prompt}", "{model}", "{worktree}", "{node_id}")


class PrepareStep(_Table):
    script: str | None = None
    command: list[str] | None = None

    def shell(self) -> str:
        """The step as one shell command line, the form setup commands take."""
        import shlex

        if self.script is not None:
            return self.script
        return shlex.join(self.command or [])


class PrepareConfig(_Table):
    steps: list[PrepareStep] = msgspec.field(default_factory=list)


class CheckpointConfig(_Table):
    exclude_globs: list[str] = msgspec.field(default_factory=list)


class ArtifactsConfig(_Table):
    include: list[str] = msgspec.field(default_factory=list)


class HookConfig(_Table):
    """A lifecycle hook (`fabro_git/engine/lifecycle.py` fires it). `script` and
    `command` are one shell line under two names; `timeout` ("30s") and `timeout_ms`
    say the same thing, `timeout_ms` first."""

    event: str
    id: str | None = None
    name: str | None = None
    type: Literal["command", "http", "prompt", "agent"] | None = None
    command: str | None = None
    script: str | None = None
    url: str | None = None
    headers: dict[str, str] | None = None
    allowed_env_vars: list[str] | None = None
    tls: Literal["verify", "no_verify", "off"] | None = None
    prompt: str | None = None
    model: str | None = None
    max_tool_rounds: int | None = None
    matcher: str | None = None
    blocking: bool | None = None
    timeout_ms: int | None = None
    timeout: str | None = None
    sandbox: bool | None = None

    @property
    def kind(self) -> str:
        if self.type is not None:
            return self.type
        return "http" if self.url is not None else "command"

    @property
    def shell(self) -> str | None:
        return self.command if self.command is not None else self.script


class McpServerConfig(_Table):
    """An MCP server whose tools agent stages are offered (`[run.agent.mcps.<name>]`).

    `stdio` servers are started by each agent stage, in its worktree, from `command`
    (an argv list) or `script` (a shell line); `http` servers are reached at `url`.
    Strings in `command`, `script`, `env`, `url` and `headers` may hold `{{ env.NAME }}`
    references, resolved from the host environment when a stage starts the server, so
    a credential need not be written into the config (nor reach the run's manifest).
    In `script` a reference is the variable `FABRO_ENV_NAME`, handed over in the
    environment (`env_references_as_variables`), never shell text.
    """

    type: Literal["stdio", "http", "sandbox"]
    command: list[str] | None = None
    script: str | None = None
    url: str | None = None
    port: int | None = None
    env: dict[str, str] = msgspec.field(default_factory=dict)
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    startup_timeout: str | None = None
    tool_timeout: str | None = None
    startup_timeout_secs: float | None = None
    tool_timeout_secs: float | None = None
    # A stage whose required server fails to start fails; others go on without it.
    required: bool = False


class AgentConfig(_Table):
    """`[run.agent]`: how agent stages with `backend="cli"` run, and the MCP servers
    agent stages with `backend="api"` use (`mcps`).

    `cli_command` replaces the built-in profile (`claude -p`, `codex exec`, `gemini -p`)
    with any program, as an argv list whose items may hold the placeholders in
    `CLI_PLACEHOLDERS`. The prompt also arrives on the program's standard input.
    """

    cli_command: list[str] | None = None
    cli_output: Literal["text", "claude-json", "codex-jsonl", "gemini-json"] | None = None
    mcps: dict[str, McpServerConfig] = msgspec.field(default_factory=dict)
    # How long a model's response may go without a byte (and its headers may take)
    # before the attempt is cut off; a duration such as "120s".
    stream_idle_timeout: str | None = None
    # How often a failed model request is tried again (a rate limit, a server error, a
    # cut stream) and the wait before the first retry, a duration doubled for each
    # later one; a provider's Retry-After wins.
    request_retries: int | None = None
    request_retry_delay: str | None = None
    # The permission level of agent stages that set none (`fabro_git.agent.permissions`).
    permissions: PermissionLevel | None = None


class SandboxConfig(_Table):
    """`[run.sandbox]`: what stages' processes get beyond the host environment, which
    reaches them without its secret-named variables (`fabro_git.engine.stage_env`).

    `env` names variables to set in every stage command, setup command, agent shell
    call, agent CLI, worktree hook and MCP stdio server: a literal value, or one with
    `{{ env.NAME }}` references resolved from the host environment when the stage starts.
    A value passed this way reaches the process even when its name looks secret.
    """

    env: dict[str, str] = msgspec.field(default_factory=dict)


class GitAuthor(_Table):
    name: str | None = None
    email: str | None = None


class GitConfig(_Table):
    author: GitAuthor | None = None
    # Push the run's refs to this remote after every checkpoint (live replication).
    push_remote: str | None = None


class EventSinkConfig(_Table):
    """One `[[run.events.sinks]]`: where every event of the run goes as a JSON line, as
    it is emitted (`fabro_git.engine.event_sinks`). `type = "file"` appends to `path`
    (relative to the file that names it); `type = "command"` starts `command` (an argv
    list) or `script` (a shell line) and writes the lines to its stdin."""

    type: Literal["file", "command"]
    path: str | None = None
    command: list[str] | None = None
    script: str | None = None


class EventsConfig(_Table):
    sinks: list[EventSinkConfig] = msgspec.field(default_factory=list)


class RunSection(_Table):
    goal: str | None = None
    inputs: dict[str, str] = msgspec.field(default_factory=dict)
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    model: ModelConfig | None = None
    agent: AgentConfig | None = None
    prepare: PrepareConfig | None = None
    checkpoint: CheckpointConfig | None = None
    artifacts: ArtifactsConfig | None = None
    hooks: list[HookConfig] = msgspec.field(default_factory=list)
    events: EventsConfig | None = None
    git: GitConfig | None = None
    sandbox: SandboxConfig | None = None
    # US dollars the run may spend on models: past it, the run stops at its next
    # checkpoint, resumable (`--max-cost`). Declarative: it acts only by stopping.
    max_cost: Annotated[float, msgspec.Meta(gt=0)] | None = None

    @property
    def model_fallbacks(self) -> list[str]:
        """`[run.model] fallbacks`, empty when not set."""
        return list(self.model.fallbacks or []) if self.model is not None else []

    @property
    def sandbox_env(self) -> dict[str, str]:
        """`[run.sandbox.env]`, its references unresolved; empty when not set."""
        return dict(self.sandbox.env) if self.sandbox is not None else {}


class WorkflowSection(_Table):
    graph: str = DEFAULT_GRAPH


class RunConfig(_Table):
    version: int = msgspec.field(default=SCHEMA_VERSION, name="_version")
    workflow: WorkflowSection | None = None
    run: RunSection = msgspec.field(default_factory=RunSection)


class DefaultsConfig(_Table):
    """`.fabro/project.toml` and `settings.toml`: defaults for `[run]` only."""

    version: int = msgspec.field(default=SCHEMA_VERSION, name="_version")
    run: RunSection = msgspec.field(default_factory=RunSection)


class Layer(msgspec.Struct, frozen=True):
    """One source of settings: its raw tables, and where they came from."""

    name: str  # "flags", "run config", "project", "user settings"
    path: Path | None
    data: JsonObject  # checked against the schema: only the JSON-shaped values it allows


class EffectiveConfig(msgspec.Struct, frozen=True):
    run: RunSection
    graph: Path | None  # the run config's graph, resolved; None without a run config
    sources: list[str]  # the layers that contributed, highest first

    def settings(self) -> JsonObject:
        """The record of this configuration kept in the run's manifest."""
        return {"config": msgspec.to_builtins(self.run), "config_sources": self.sources}


# -- the layers ------------------------------------------------------------------------------


def user_settings_path() -> Path:
    import platformdirs

    base = os.environ.get("XDG_CONFIG_HOME")
    if base and os.path.isabs(base):
        return Path(base) / "git-fabro" / "settings.toml"
    return Path(platformdirs.user_config_dir("git-fabro", appauthor=False)) / "settings.toml"


def load_layer(path: Path, name: str, *, run_config: bool) -> Layer:
    """Read and check one TOML layer; a file that is not there is an empty layer."""
    from fabro_git.files import UnreadableFile, read_input_text

    if not run_config and not os.path.lexists(path):
        return Layer(name, path, {})
    try:
        text = read_input_text(path)
    except UnreadableFile as err:
        if err.detail == "no such file" and run_config:
            raise ConfigError(f"{path}: no such run config") from None
        raise ConfigError(f"{name} {path}: {err.detail}") from None
    return parse_layer(text, path, name, run_config=run_config)


def parse_layer(text: str, path: Path, name: str, *, run_config: bool) -> Layer:
    """Check the TOML `text` read from `path` as one layer."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise toml_error(path, exc) from None
    schema: type[RunConfig | DefaultsConfig] = RunConfig if run_config else DefaultsConfig
    if not run_config and "workflow" in data:
        raise SourceError(
            "[workflow] belongs in a run config; this file holds defaults for [run] keys only",
            path=path,
            line=find_line(text, ["workflow"]),
        )
    checked = convert(data, schema, path, text)
    if checked.version != SCHEMA_VERSION:
        raise SourceError(
            f"_version: unsupported schema version {checked.version!r}; this version reads {SCHEMA_VERSION}",
            path=path,
            line=find_line(text, ["_version"]),
        )
    _check_run_section(checked.run, path, text)
    if isinstance(checked, RunConfig):
        # The graph is relative to the run config's own directory: resolve it now,
        # before merging, while the file it belongs to is known.
        relative = checked.workflow.graph if checked.workflow is not None else DEFAULT_GRAPH
        graph = (path.parent / Path(relative).expanduser()).resolve()
        data = {**data, "workflow": {"graph": str(graph)}}
    if checked.run.events is not None and checked.run.events.sinks:
        data = _sink_paths_resolved(data, path.parent)
    return Layer(name, path, data)


def _sink_paths_resolved(data: JsonObject, directory: Path) -> JsonObject:
    """`data` with each file sink's path made absolute, from the directory of the file
    that names it (as a run config's graph is), before layers merge."""
    run = dict(section(data, "run"))
    events = dict(section(run, "events"))
    sinks: list[JsonValue] = []
    for sink in _sinks_of(data):
        if isinstance(sink, dict) and isinstance(path := sink.get("path"), str):
            resolved = (directory / Path(path).expanduser()).resolve()
            sink = {**sink, "path": str(resolved)}
        sinks.append(sink)
    events["sinks"] = sinks
    run["events"] = events
    return {**data, "run": run}


def flag_layer(
    *,
    goal: str | None = None,
    inputs: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    model: str | None = None,
    provider: str | None = None,
    push_remote: str | None = None,
    max_cost: float | None = None,
    permissions: str | None = None,
) -> Layer:
    run: JsonObject = {}
    if permissions is not None:
        run["agent"] = {"permissions": permissions}
    if max_cost is not None:
        run["max_cost"] = max_cost
    if push_remote is not None:
        run["git"] = {"push_remote": push_remote}
    if goal is not None:
        run["goal"] = goal
    if inputs:
        run["inputs"] = dict[str, JsonValue](inputs)
    if labels:
        run["labels"] = dict[str, JsonValue](labels)
    model_table: JsonObject = {
        k: v for k, v in (("name", model), ("provider", provider)) if v is not None
    }
    if model_table:
        run["model"] = model_table
    return Layer("flags", None, {"run": run} if run else {})


def effective_config(layers: list[Layer]) -> EffectiveConfig:
    """Merge `layers` (highest first) into the configuration a run uses."""
    merged: JsonObject = {}
    for layer in reversed(layers):
        hooks = merge_hooks(_hooks_of(merged), _hooks_of(layer.data))
        # Every layer's event sinks are used: the user's beside the project's.
        sinks = _sinks_of(merged) + _sinks_of(layer.data)
        merged = merge_tables(merged, layer.data)
        if hooks:
            merged["run"] = {**section(merged, "run"), "hooks": hooks}
        if sinks:
            run = section(merged, "run")
            merged["run"] = {**run, "events": {**section(run, "events"), "sinks": sinks}}
    try:
        config = msgspec.convert(merged, RunConfig)
    except msgspec.ValidationError as exc:  # each layer passed alone: a merge mismatch
        raise ConfigError(
            f"the merged configuration ({', '.join(layer.name for layer in layers)}) is invalid: {exc}"
        ) from None
    graph = config.workflow.graph if config.workflow is not None else None
    sources = [
        layer.name + (f" {layer.path}" if layer.path else "") for layer in layers if layer.data
    ]
    return EffectiveConfig(run=config.run, graph=Path(graph) if graph else None, sources=sources)


def _hooks_of(data: JsonObject) -> list[JsonValue]:
    run = data.get("run")
    hooks = run.get("hooks") if isinstance(run, dict) else None
    return list(hooks) if isinstance(hooks, list) else []


def _sinks_of(data: JsonObject) -> list[JsonValue]:
    run = data.get("run")
    events = run.get("events") if isinstance(run, dict) else None
    sinks = events.get("sinks") if isinstance(events, dict) else None
    return list(sinks) if isinstance(sinks, list) else []


def merge_hooks(lower: list[JsonValue], higher: list[JsonValue]) -> list[JsonValue]:
    """Hook lists add up across layers: a higher layer's hook with the `id` (else the
    `name`) of an inherited one replaces it in place; any other is appended."""
    out = list(lower)
    for hook in higher:
        key = _hook_identity(hook)
        same = [i for i, old in enumerate(out) if key is not None and _hook_identity(old) == key]
        if same:
            out[same[0]] = hook
        else:
            out.append(hook)
    return out


def _hook_identity(hook: JsonValue) -> tuple[str, str] | None:
    if not isinstance(hook, dict):
        return None
    for field_name in ("id", "name"):
        value = hook.get(field_name)
        if isinstance(value, str) and value:
            return (field_name, value)
    return None


# Tables whose entries stand whole: a project's MCP server named as the user's would
# take the user's headers (credentials) to its url, which its trust prompt never shows.
_WHOLE_ENTRIES = (("run", "agent", "mcps"),)


def merge_tables(lower: JsonObject, higher: JsonObject, path: tuple[str, ...] = ()) -> JsonObject:
    """`higher` over `lower`: tables merge key by key (bar `_WHOLE_ENTRIES`), the rest replaces."""
    out = dict(lower)
    for key, value in higher.items():
        below = out.get(key)
        if isinstance(value, dict) and isinstance(below, dict) and path not in _WHOLE_ENTRIES:
            out[key] = merge_tables(below, value, (*path, key))
        else:
            out[key] = value
    return out


# -- checks and messages -----------------------------------------------------------------------


Fail = Callable[[list[str], str], None]


def _check_run_section(run: RunSection, path: Path, text: str) -> None:
    def fail(keys: list[str], message: str) -> None:
        raise SourceError(f"{key_path(keys)}: {message}", path=path, line=find_line(text, keys))

    if run.prepare is not None:
        _check_prepare(run.prepare, fail)
    for i, hook in enumerate(run.hooks):
        where = ["run", "hooks", f"[{i}]"]
        _check_hook_kind(hook, where, fail)
        _check_hook_limits(hook, where, fail)
    _check_sinks(run.events, fail)
    if run.agent is not None:
        _check_agent(run.agent, fail)
    for name, value in run.sandbox_env.items():
        keys = ["run", "sandbox", "env", name]
        if not ENV_NAME.fullmatch(name):
            fail(keys, "a variable name is letters, digits and '_', not starting with a digit")
        _only_env_references(keys, value, fail)
    if run.git is not None:
        _check_git(run.git, fail)


def _check_prepare(prepare: PrepareConfig, fail: Fail) -> None:
    for i, step in enumerate(prepare.steps):
        where = ["run", "prepare", "steps", f"[{i}]"]
        if (step.script is None) == (step.command is None):
            fail(
                where,
                "a prepare step needs exactly one of `script` (a shell line) or `command` (an argv list)",
            )
        if step.command is not None and not step.command:
            fail([*where, "command"], "expected a non-empty argv list")


def _check_sinks(events: EventsConfig | None, fail: Fail) -> None:
    """Each `[[run.events.sinks]]` entry names what its type needs, and only that."""
    for i, sink in enumerate(events.sinks if events is not None else []):
        where = ["run", "events", "sinks", f"[{i}]"]
        if sink.type == "file" and not sink.path:
            fail(where, "a file sink needs `path` (the file every event is appended to)")
        if sink.type == "file" and (sink.command is not None or sink.script is not None):
            fail(where, "a file sink takes `path` only")
        if sink.type == "command":
            if (sink.script is None) == (sink.command is None):
                fail(
                    where,
                    "a command sink needs exactly one of `script` (a shell line) or `command` (an argv list)",
                )
            if sink.command is not None and not sink.command:
                fail([*where, "command"], "expected a non-empty argv list")
            if sink.path is not None:
                fail([*where, "path"], "a command sink takes `command` or `script`, not `path`")


def _check_hook_kind(hook: HookConfig, where: list[str], fail: Fail) -> None:
    """The hook's event, and what its kind needs: a command, a URL or a prompt."""
    if hook.event not in HOOK_EVENTS:
        fail(
            [*where, "event"],
            f"unknown event {hook.event!r}; expected one of {', '.join(HOOK_EVENTS)}",
        )
    kind = hook.kind
    if kind == "command":
        if hook.shell is None:
            fail(where, "a command hook needs `command`")
        if hook.command is not None and hook.script is not None:
            fail([*where, "script"], "give `command` or `script`, not both")
    else:
        needs = {"http": "url", "prompt": "prompt", "agent": "prompt"}[kind]
        if getattr(hook, needs) is None:
            fail(where, f"a {kind} hook needs `{needs}`")
    if kind == "http" and hook.url is not None:
        scheme = hook.url.partition(":")[0].lower()
        if scheme not in ("http", "https"):
            fail([*where, "url"], f"expected an http:// or https:// URL, got {hook.url!r}")
        if scheme == "http" and hook.tls != "off":
            fail([*where, "url"], 'a plain http:// URL needs `tls = "off"`; use https://')


def _check_hook_limits(hook: HookConfig, where: list[str], fail: Fail) -> None:
    """The hook's numbers, durations and matcher."""
    if hook.max_tool_rounds is not None and hook.max_tool_rounds < 0:
        fail(
            [*where, "max_tool_rounds"],
            f"expected a number of tool rounds (0 or more), got {hook.max_tool_rounds}",
        )
    if hook.timeout_ms is not None and hook.timeout_ms <= 0:
        fail(
            [*where, "timeout_ms"],
            f"expected a positive number of milliseconds, got {hook.timeout_ms}",
        )
    if hook.timeout is not None and not _positive_duration(hook.timeout):
        fail(
            [*where, "timeout"],
            f"expected a duration such as 500ms, 30s or 2m, got {hook.timeout!r}",
        )
    if hook.matcher is not None:
        try:
            re.compile(hook.matcher)
        except re.error as exc:
            fail([*where, "matcher"], f"not a valid regular expression: {exc}")


def _check_agent(agent: AgentConfig, fail: Fail) -> None:
    for name, server in agent.mcps.items():
        _check_mcp_server(name, server, fail)
    idle = agent.stream_idle_timeout
    if idle is not None and not _positive_duration(idle):
        fail(
            ["run", "agent", "stream_idle_timeout"],
            f"expected a duration such as 30s or 2m, got {idle!r}",
        )
    retries = agent.request_retries
    if retries is not None and not 0 <= retries <= MAX_REQUEST_RETRIES:
        fail(
            ["run", "agent", "request_retries"],
            f"expected a number from 0 to {MAX_REQUEST_RETRIES}, got {retries}",
        )
    delay = agent.request_retry_delay
    if delay is not None and request_retry_delay(delay) is None:
        fail(
            ["run", "agent", "request_retry_delay"],
            f"expected a duration such as 500ms or 2s, got {delay!r}",
        )
    command = agent.cli_command
    if command is not None:
        if not command or not command[0].strip():
            fail(["run", "agent", "cli_command"], "expected a non-empty argv list")
        for item in command:
            for name in re.findall(r"\{[^{}]*\}", item):
                if name not in CLI_PLACEHOLDERS:
                    fail(
                        ["run", "agent", "cli_command"],
                        f"unknown placeholder {name}; expected one of {', '.join(CLI_PLACEHOLDERS)}",
                    )


def _check_git(git: GitConfig, fail: Fail) -> None:
    remote = git.push_remote
    if remote is not None and (not remote.strip() or remote.startswith("-") or "\n" in remote):
        fail(["run", "git", "push_remote"], f"{remote!r} cannot name a git remote")
    author = git.author
    if author is not None:
        for field_name in ("name", "email"):
            value = getattr(author, field_name)
            if value is not None and (not value.strip() or any(c in value for c in "<>\n\r\0")):
                fail(["run", "git", "author", field_name], f"{value!r} cannot be a git identity")


MCP_DEFAULT_STARTUP_TIMEOUT = 10.0
MCP_DEFAULT_TOOL_TIMEOUT = 60.0
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_REFERENCE = re.compile(r"\{\{\s*env\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_ANY_TEMPLATE = re.compile(r"\{\{(.*?)\}\}")


def mcp_timeouts(server: McpServerConfig) -> tuple[float, float]:
    """The server's startup and tool-call timeouts in seconds (checked at load)."""
    from fabro_git.durations import parse_duration

    def pick(text: str | None, secs: float | None, default: float) -> float:
        if text is not None:
            return parse_duration(text) or default
        return secs if secs is not None else default

    return (
        pick(server.startup_timeout, server.startup_timeout_secs, MCP_DEFAULT_STARTUP_TIMEOUT),
        pick(server.tool_timeout, server.tool_timeout_secs, MCP_DEFAULT_TOOL_TIMEOUT),
    )


def stream_idle_timeout(agent: AgentConfig) -> float | None:
    """`[run.agent] stream_idle_timeout` in seconds (checked at load), or None if unset."""
    from fabro_git.durations import parse_duration

    text = agent.stream_idle_timeout
    return parse_duration(text.strip()) if text is not None else None


MAX_REQUEST_RETRIES = 20


def request_retry_delay(text: str | None) -> float | None:
    """`[run.agent] request_retry_delay` in seconds (zero or more), None if unset or
    not a duration."""
    from fabro_git.durations import parse_duration

    return parse_duration(text.strip()) if text is not None else None


def resolve_env_references(text: str, environ: Mapping[str, str], where: str) -> str:
    """`text` with each `{{ env.NAME }}` replaced by the host's value; a variable that
    is not set is an error naming the field and the reference."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise ConfigError(
                f"{where}: {match.group(0)} names {name}, which is not set in the environment"
            )
        return environ[name]

    return ENV_REFERENCE.sub(value, text)


# The variable a `{{ env.NAME }}` reference in a shell line is handed over in.
SCRIPT_REFERENCE_PREFIX = "FABRO_ENV_"


def env_references_as_variables(
    script: str, environ: Mapping[str, str], where: str
) -> tuple[str, dict[str, str]]:
    """`script` (a shell line) with each `{{ env.NAME }}` made the parameter expansion
    `${FABRO_ENV_NAME}`, and those variables with the host's values, for the process's
    environment: a value reaches the shell as a variable's value, never as shell text
    to parse (a quote or `$(...)` in it stays a character) nor in the process list. An
    unset variable is an error naming the field, as in `resolve_env_references`."""
    passed: dict[str, str] = {}

    def variable(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise ConfigError(
                f"{where}: {match.group(0)} names {name}, which is not set in the environment"
            )
        passed[SCRIPT_REFERENCE_PREFIX + name] = environ[name]
        return "${" + SCRIPT_REFERENCE_PREFIX + name + "}"

    return ENV_REFERENCE.sub(variable, script), passed


def config_secrets(run: RunSection) -> list[str]:
    """Credentials written literally into a run's configuration: MCP servers' and
    hooks' header values and secret-named env values. The redactor masks them wherever
    they appear; `{{ env.NAME }}` references are not, except in `[run.sandbox.env]`: a
    secret-named variable there is masked whatever host variable its value comes from."""
    from fabro_git.redact import is_secret_name

    found: list[str] = []
    for server in (run.agent.mcps if run.agent is not None else {}).values():
        found += list(server.headers.values())
        found += [v for k, v in server.env.items() if is_secret_name(k)]
    # What `[run.sandbox.env]` hands a stage under a secret name, written out or not.
    for name, value in run.sandbox_env.items():
        if is_secret_name(name):
            found.append(_resolved_or_none(value) or "")
    # A hook's headers name allowed variables as `$NAME`; what is written out is literal.
    found += [v for hook in run.hooks for v in (hook.headers or {}).values() if "$" not in v]
    return [value for value in found if not ENV_REFERENCE.search(value)]


def _resolved_or_none(text: str) -> str | None:
    try:
        return ENV_REFERENCE.sub(lambda m: os.environ[m.group(1)], text)
    except KeyError:  # refused when the stage starts, naming the field
        return None


def _check_mcp_server(name: str, server: McpServerConfig, fail: Fail) -> None:
    from fabro_git.durations import parse_duration

    where = ["run", "agent", "mcps", name]
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", name):
        fail(where, "a server name is 1 to 40 letters, digits, '_', '-' or '.'")
    if server.type == "sandbox":
        fail(
            [*where, "type"],
            'the sandbox transport needs a remote sandbox; stages run locally here: use type = "stdio"',
        )
    if server.type == "stdio" and (server.command is None) == (server.script is None):
        fail(where, "a stdio server needs exactly one of `command` (an argv list) or `script`")
    if server.command is not None and not server.command:
        fail([*where, "command"], "expected a non-empty argv list")
    if server.type == "http" and not server.url:
        fail(where, "an http server needs `url`")
    if server.type != "http" and server.url is not None:
        fail([*where, "url"], "`url` is for http servers")
    for key in ("startup_timeout", "tool_timeout"):
        text = getattr(server, key)
        if text is not None and not (parse_duration(text) or 0) > 0:
            fail([*where, key], f'expected a duration such as "10s" or "2m", got {text!r}')
        secs = getattr(server, key + "_secs")
        if secs is not None and secs <= 0:
            fail([*where, key + "_secs"], f"expected a positive number of seconds, got {secs}")
    strings: list[tuple[list[str], str]] = [([*where, "url"], server.url or "")]
    strings += [([*where, "script"], server.script or "")]
    strings += [([*where, "command"], part) for part in server.command or []]
    strings += [([*where, "env", k], v) for k, v in server.env.items()]
    strings += [([*where, "headers", k], v) for k, v in server.headers.items()]
    for keys, text in strings:
        _only_env_references(keys, text, fail)


def _only_env_references(
    keys: list[str], text: str, fail: Callable[[list[str], str], None]
) -> None:
    for match in _ANY_TEMPLATE.finditer(text):
        if not ENV_REFERENCE.fullmatch(match.group(0)):
            fail(keys, f"{match.group(0)!r}: only {{{{ env.NAME }}}} references are allowed here")


def _positive_duration(text: str) -> bool:
    from fabro_git.durations import parse_duration

    seconds = parse_duration(text.strip())
    return seconds is not None and seconds > 0
