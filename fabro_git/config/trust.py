"""Workspace trust: a repository's own configuration acts only once the user says so.

A clone carries `.fabro/project.toml`, and a run reads it. Most of its keys only shape
the run (model, labels, goal, inputs, checkpoint globs, artifacts, git author), but some
act on the user's machine with the user's rights: hooks run programs and post events,
event sinks write every event to a file or to a program they start, agents given the
`full` permission level run shell commands without asking, MCP servers are
started or called with headers, `cli_command` and prepare steps run programs,
`push_remote` chooses where the user's run refs go, and `{{ env.NAME }}`,
`$NAME` headers and `allowed_env_vars` carry the user's environment out. git never
runs a clone's hooks, and direnv and mise refuse a directory's config until it is
allowed; git fabro does the same. Those keys act only after `git fabro trust` recorded
the sha256 of the file's exact bytes for its path, in the user's config dir (never in
the repository). A changed file is untrusted again.

The check reads the file once: the bytes that are hashed are the bytes that are
parsed. The user's `settings.toml` and a run config named on the command line are the
user's own choice and are not checked.

This module is the one place that says which keys act (`actions`), how they read in
plain words, and where trust is kept (`TrustStore`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import msgspec

from fabro_git.config.recorded import read_recorded
from fabro_git.config.run_config import (
    ENV_REFERENCE,
    PROJECT_CONFIG,
    AgentConfig,
    DefaultsConfig,
    EventSinkConfig,
    HookConfig,
    Layer,
    McpServerConfig,
    RunConfig,
    RunSection,
    load_layer,
    parse_layer,
    user_settings_path,
)
from fabro_git.config.toml_source import find_line
from fabro_git.errors import ConfigError

STORE_VERSION = 1
# The sha256 digests of project files the user vouched for where the run was asked for,
# comma-separated: set by `git fabro batch --ray` for the runs it starts on a cluster's
# nodes, whose own trust stores have never seen the repository. Only a file with exactly
# those bytes is trusted by it.
VOUCHED_VARIABLE = "FABRO_TRUSTED_PROJECT"
# The same for a run's recorded configuration (the digest `recorded_actions` gives): set
# for a run a batch resumes on another node, from what its first start recorded there.
VOUCHED_CONFIG_VARIABLE = "FABRO_TRUSTED_CONFIG"
TRUST_HINT = "read the file, then run `git fabro trust` to allow it (or fix or remove the keys)"


class Action(msgspec.Struct, frozen=True):
    """One thing a configuration would do: the key that does it, in plain words."""

    key: str  # run.hooks[0], run.agent.mcps.github, run.git.push_remote
    words: str
    line: int | None = None  # where the file sets it, once known


# -- what acts -----------------------------------------------------------------------------

_WHEN = {
    "run_start": "before the run starts",
    "run_complete": "when the run succeeds",
    "run_failed": "when the run fails",
    "stage_start": "before each stage",
    "stage_complete": "after each stage",
    "stage_failed": "when a stage fails",
    "stage_retrying": "when a stage is retried",
    "edge_selected": "when the run picks an edge",
    "parallel_start": "when parallel branches start",
    "parallel_complete": "when parallel branches end",
    "sandbox_ready": "when the run's worktree is ready",
    "sandbox_cleanup": "when the run's worktree is removed",
    "checkpoint_saved": "after each checkpoint",
    "pre_tool_use": "before each agent tool call",
    "post_tool_use": "after each agent tool call",
    "post_tool_use_failure": "after each failed agent tool call",
}


def shown(text: str) -> str:
    """`text` quoted for a terminal, on one line, through the one sanitiser: what the
    user reads is what would run."""
    from fabro_git.terminal import printable

    return "`" + printable(text, one_line=True) + "`"


def _env_names(*texts: str) -> list[str]:
    return sorted({name for text in texts for name in ENV_REFERENCE.findall(text)})


def _dollar_names(text: str, allowed: list[str]) -> list[str]:
    return [name for name in allowed if f"${name}" in text or f"${{{name}}}" in text]


def actions(run: RunSection) -> list[Action]:
    """What `run` would do that needs the user's trust, in file order of the keys."""
    found: list[Action] = []
    for i, hook in enumerate(run.hooks):
        found += _hook_actions(f"run.hooks[{i}]", hook)
    if run.agent is not None:
        found += _agent_actions(run.agent)
    if run.prepare is not None:
        for i, step in enumerate(run.prepare.steps):
            found.append(
                Action(
                    f"run.prepare.steps[{i}]", f"runs {shown(step.shell())} before the first stage"
                )
            )
    for i, sink in enumerate(run.events.sinks if run.events is not None else []):
        found.append(_sink_action(f"run.events.sinks[{i}]", sink))
    if run.sandbox is not None:
        # A literal value acts too: LD_PRELOAD, PATH or GIT_SSH_COMMAND choose what runs.
        for variable, value in run.sandbox.env.items():
            names = _env_names(value)
            words = (
                f"passes {', '.join('$' + n for n in names)} to every stage process as {variable}"
                if names
                else f"sets {variable}={shown(value)} for every stage process"
            )
            found.append(Action(f"run.sandbox.env.{variable}", words))
    if run.git is not None and run.git.push_remote is not None:
        found.append(
            Action(
                "run.git.push_remote",
                f"pushes run refs to remote {shown(run.git.push_remote)} after every checkpoint",
            )
        )
    return found


def _agent_actions(agent: AgentConfig) -> list[Action]:
    """What the `[run.agent]` table lets agents do: its permissions, program and servers."""
    found: list[Action] = []
    if agent.permissions == "full":
        found.append(
            Action(
                "run.agent.permissions",
                "lets agent stages run shell commands and MCP tools without asking",
            )
        )
    if agent.cli_command is not None:
        found.append(
            Action(
                "run.agent.cli_command",
                f"runs {shown(' '.join(agent.cli_command))} for each agent stage with backend=cli",
            )
        )
    for name, server in agent.mcps.items():
        found += _mcp_actions(name, server)
    return found


def _sink_action(key: str, sink: EventSinkConfig) -> Action:
    """Where an event sink sends the run's events: a file it appends to, or a program."""
    if sink.type == "file":
        return Action(key, f"appends every event of the run to {shown(sink.path or '')}")
    program = sink.script if sink.script is not None else " ".join(sink.command or [])
    return Action(key, f"runs {shown(program)} for the whole run, every event on its stdin")


def _mcp_actions(name: str, server: McpServerConfig) -> list[Action]:
    """What starting or connecting to MCP server `name` does, and what it is given."""
    key = f"run.agent.mcps.{name}"
    found: list[Action] = []
    if server.type == "http":
        found.append(
            Action(key, f"connects to MCP server {shown(name)} at {shown(server.url or '')}")
        )
    else:
        program = server.script if server.script is not None else " ".join(server.command or [])
        found.append(Action(key, f"starts MCP server {shown(name)}: {shown(program)}"))
    for header, value in server.headers.items():
        names = _env_names(value)
        carried = f"with {', '.join('$' + n for n in names)}" if names else "(a literal value)"
        found.append(
            Action(
                f"{key}.headers.{header}",
                f"sends header {shown(header)} {carried} to {shown(server.url or name)}",
            )
        )
    for variable, value in server.env.items():
        names = _env_names(value)
        if names:
            found.append(
                Action(
                    f"{key}.env.{variable}",
                    f"passes {', '.join('$' + n for n in names)} to MCP server {shown(name)} as {variable}",
                )
            )
    for part in [server.url or "", server.script or "", *(server.command or [])]:
        names = _env_names(part)
        if names:
            found.append(
                Action(
                    key,
                    f"puts {', '.join('$' + n for n in names)} into MCP server {shown(name)}'s command or URL",
                )
            )
            break
    return found


def _hook_actions(key: str, hook: HookConfig) -> list[Action]:
    when = _WHEN.get(hook.event, f"on {hook.event}")
    label = (
        f" (hook {hook.event}"
        + (f", {shown(hook.id or hook.name or '')}" if hook.id or hook.name else "")
        + ")"
    )
    kind = hook.kind
    if kind == "command":
        where = " in your checkout, with your whole environment" if hook.sandbox is False else ""
        return [Action(key, f"runs {shown(hook.shell or '')} {when}{where}{label}")]
    if kind in ("prompt", "agent"):
        doing = "asks a model" if kind == "prompt" else "runs an agent with tools"
        return [Action(key, f"{doing} {when}: {shown(hook.prompt or '')}{label}")]
    out = [Action(key, f"posts the event to {shown(hook.url or '')} {when}{label}")]
    allowed = list(hook.allowed_env_vars or [])
    for header, value in (hook.headers or {}).items():
        names = _dollar_names(value, allowed)
        carried = f"with {', '.join('$' + n for n in names)}" if names else "(a literal value)"
        out.append(
            Action(
                f"{key}.headers.{header}",
                f"sends header {shown(header)} {carried} to {shown(hook.url or '')}",
            )
        )
    if allowed:
        out.append(
            Action(
                f"{key}.allowed_env_vars",
                f"may send {', '.join('$' + n for n in allowed)} to {shown(hook.url or '')}",
            )
        )
    return out


def describe(found: list[Action]) -> str:
    """The actions as the lines a user reads, each through the one sanitiser: keys and
    names come from the file (a server's, a header's, a variable's), and an escape in
    one could rewrite the lines above the question."""
    from fabro_git.terminal import printable

    return "\n".join(
        "  - "
        + printable(
            f"{action.words}  [{action.key}" + (f", line {action.line}]" if action.line else "]"),
            one_line=True,
        )
        for action in found
    )


def _keys(key: str) -> list[str]:
    """["run", "hooks", "[0]"] from run.hooks[0], as `line_of` takes a key path."""
    import re

    return [part for part in re.split(r"\.|(?=\[)", key) if part]


def _owners(found: list[Action]) -> list[str]:
    """The keys of `found` without those inside another (a hook, not its headers)."""
    keys = list(dict.fromkeys(action.key for action in found))
    return [k for k in keys if not any(k != o and k.startswith(o + ".") for o in keys)]


# -- the project file ----------------------------------------------------------------------


class ProjectFile(msgspec.Struct, frozen=True):
    """A repository's `.fabro/project.toml` as read once: its layer, the sha256 of the
    bytes it was parsed from, and what it would do. No file: empty layer, no digest."""

    repo_root: Path
    path: Path
    layer: Layer
    digest: str | None
    actions: list[Action]


def read_project(repo_root: Path, file: Path | None = None) -> ProjectFile:
    """The repository's `.fabro/project.toml`, or `file`, another of its configuration
    files: a run config of a workflow it names (`.fabro/workflows/<name>/workflow.toml`)."""
    from fabro_git.files import UnreadableFile, read_input_file

    root = Path(repo_root).resolve()
    path = root / PROJECT_CONFIG if file is None else Path(file).absolute()
    run_config = file is not None
    name = "run config" if run_config else "project config"
    if not os.path.lexists(path):
        return ProjectFile(root, path, Layer(name, path, {}), None, [])
    # The repository's own file, as every path it names (`workflow.paths`): a link out
    # of it would make a file of this machine (the user's settings, say) its settings.
    real = Path(os.path.realpath(path))
    if not real.is_relative_to(root):
        raise ConfigError(
            f"{name} {path}: is a link to {real}, outside the repository",
            hint="a repository's configuration is a file it holds: replace the link with "
            "the file, or remove it",
        )
    try:
        data = read_input_file(path)
    except UnreadableFile as err:
        raise ConfigError(f"{name} {path}: {err.detail}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{name} {path}: is not valid UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None
    layer = parse_layer(text, path, name, run_config=run_config)
    run = (
        msgspec.convert(layer.data, RunConfig).run
        if run_config
        else msgspec.convert(layer.data, DefaultsConfig).run
    )
    found = [
        msgspec.structs.replace(action, line=find_line(text, _keys(action.key)))
        for action in actions(run)
    ]
    return ProjectFile(root, path, layer, hashlib.sha256(data).hexdigest(), found)


# -- the store -----------------------------------------------------------------------------


class TrustedFile(msgspec.Struct, frozen=True):
    path: str  # the file, resolved
    repository: str  # the repository it belongs to, resolved
    sha256: str
    trusted_at: str


class TrustedConfig(msgspec.Struct, frozen=True):
    """A run's recorded configuration the user let act: the digest of its acting keys."""

    sha256: str
    repository: str  # the repository it was first approved in, resolved
    run_id: str  # the run it was first approved for
    trusted_at: str


class _StoreFile(msgspec.Struct):
    version: int = msgspec.field(default=STORE_VERSION, name="_version")
    files: list[TrustedFile] = msgspec.field(default_factory=list)
    # Run configurations trusted before each had a file of its own under
    # `trusted-runs/`: still honoured, never added to.
    configs: list[TrustedConfig] = msgspec.field(default_factory=list)


def _is_digest(name: str) -> bool:
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


def store_path() -> Path:
    """`trusted.json` beside the user's `settings.toml`."""
    return user_settings_path().parent / "trusted.json"


class TrustStore:
    """The user's trusted files, one entry a path (trusting new content replaces it),
    in `trusted.json`; and the run configurations they let act, one small file each
    under `trusted-runs/`, named by its digest: a batch of a thousand rows trusts a
    thousand runs, and each run's check is one `stat`, its approval one new file, however
    many came before. Writes hold a lock or are atomic renames."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else store_path()
        self.runs_dir = self.path.parent / "trusted-runs"

    def entries(self) -> list[TrustedFile]:
        return list(self._read().files)

    def status(self, project: ProjectFile) -> str:
        """`trusted`, `changed` (trusted once, different bytes now) or `untrusted`."""
        entry = self._entry(self._read(), project.path)
        if entry is None:
            return "untrusted"
        return "trusted" if entry.sha256 == project.digest else "changed"

    def trust(self, project: ProjectFile) -> None:
        import datetime

        assert project.digest is not None
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        entry = TrustedFile(str(project.path), str(project.repo_root), project.digest, now)
        with self._locked() as store:
            store.files = [f for f in store.files if f.path != entry.path] + [entry]

    def configs(self) -> list[TrustedConfig]:
        """Every run configuration trusted, oldest first."""
        found = [*self._read().configs]
        try:
            children = list(self.runs_dir.iterdir())
        except FileNotFoundError:
            children = []
        except OSError as exc:
            raise self._unusable(exc) from None
        for child in children:
            if _is_digest(child.name) and (config := self._config_file(child)) is not None:
                found.append(config)
        return sorted(found, key=lambda c: c.trusted_at)

    def trusts_config(self, digest: str) -> bool:
        if _is_digest(digest) and (self.runs_dir / digest).exists():
            return True
        return any(c.sha256 == digest for c in self._read().configs)

    def trust_config(self, digest: str, *, repository: Path, run_id: str) -> None:
        """Record a run configuration's acting keys as the user's choice (once)."""
        import datetime

        if not _is_digest(digest):
            raise ValueError(f"not a sha256 digest: {digest!r}")
        if self.trusts_config(digest):
            return
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        self._write_config(TrustedConfig(digest, str(Path(repository).resolve()), run_id, now))

    def revoke(self, path: Path, repository: Path) -> bool:
        """Forget the file at `path` and the run configurations approved in
        `repository`: whether anything was trusted."""
        with self._locked() as store:
            files = [f for f in store.files if f.path != str(path)]
            configs = [c for c in store.configs if c.repository != str(repository)]
            removed = (len(files), len(configs)) != (len(store.files), len(store.configs))
            store.files, store.configs = files, configs
        for config in self.configs():
            if config.repository == str(repository):
                with contextlib.suppress(FileNotFoundError):
                    (self.runs_dir / config.sha256).unlink()
                    removed = True
        return removed

    def _write_config(self, config: TrustedConfig) -> None:
        """`config` as its own file, whole or not at all (written aside, flushed, then
        renamed into place)."""
        import tempfile

        try:
            self.runs_dir.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(dir=self.runs_dir, prefix=".new-")
        except OSError as exc:
            raise self._unusable(exc) from None
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(msgspec.json.encode(config) + b"\n")
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, self.runs_dir / config.sha256)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            if isinstance(exc, OSError):
                raise self._unusable(exc) from None
            raise

    def _unusable(self, exc: OSError) -> ConfigError:
        return ConfigError(
            f"{self.runs_dir}: cannot keep the trusted runs there ({exc.strerror})",
            hint="it must be a directory you can write; move aside what is in its place",
        )

    def _config_file(self, path: Path) -> TrustedConfig | None:
        try:
            config = msgspec.json.decode(path.read_bytes(), type=TrustedConfig)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            return None
        return config if config.sha256 == path.name else None

    @staticmethod
    def _entry(store: _StoreFile, path: Path) -> TrustedFile | None:
        return next((f for f in store.files if f.path == str(path)), None)

    def _read(self) -> _StoreFile:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return _StoreFile()
        except OSError as exc:
            raise ConfigError(
                f"{self.path}: cannot read the trusted files ({exc.strerror})"
            ) from None
        try:
            store = msgspec.json.decode(data, type=_StoreFile)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ConfigError(
                f"{self.path}: not a trusted-files record ({exc})",
                hint="remove it and trust your repositories again with `git fabro trust`",
            ) from None
        if store.version != STORE_VERSION:
            raise ConfigError(f"{self.path}: unsupported version {store.version}")
        return store

    @contextlib.contextmanager
    def _locked(self) -> Iterator[_StoreFile]:
        import fcntl
        import tempfile

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            store = self._read()
            yield store
            fd, temp = tempfile.mkstemp(dir=self.path.parent, prefix=".trusted-", suffix=".json")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(msgspec.json.format(msgspec.json.encode(store)) + b"\n")
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(temp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                raise


# -- the gate a run passes ---------------------------------------------------------------------


def untrusted_words(project: ProjectFile, status: str) -> str:
    """The opening of every message about an untrusted file: which, and what it would do."""
    state = "has changed since you trusted it" if status == "changed" else "is not trusted"
    return f"{project.path} {state}; it would:\n{describe(project.actions)}"


def trusted_project_layer(
    repo_root: Path,
    *,
    ask: Callable[[str], bool] | None,
    store: TrustStore | None = None,
    file: Path | None = None,
) -> Layer:
    """The repository's project layer, once its acting keys are trusted.

    A file with no acting keys, or whose bytes are trusted, is the layer as read. An
    untrusted one is put to `ask` (a terminal's y/N, given the summary; yes records
    the trust) or, with no `ask`, refused; a refusal raises `ConfigError` naming the
    keys and `git fabro trust`, before anything of a run exists.
    """
    project = read_project(repo_root, file)
    if not project.actions:
        return project.layer
    if project.digest in os.environ.get(VOUCHED_VARIABLE, "").split(","):
        return project.layer
    store = store if store is not None else TrustStore()
    status = store.status(project)
    if status == "trusted":
        return project.layer
    summary = untrusted_words(project, status)
    if ask is not None and ask(summary):
        store.trust(project)
        return project.layer
    if file is not None:
        relpath = os.path.relpath(project.path)
        raise ConfigError(
            f"{summary}\nnothing was started: the repository's workflow of that name comes"
            " with the repository, and its run config acts only as your own choice",
            hint="read it, then run it by its path, which is that choice: "
            f"`git fabro run {shlex.quote(relpath)}`",
        )
    raise ConfigError(
        f"{summary}\nnothing was started: {', '.join(_owners(project.actions))}"
        f" in {project.path} act only once you trust the file",
        hint=TRUST_HINT,
    )


def ask_on_terminal(question: str) -> Callable[[str], bool] | None:
    """A y/N prompt on the terminal, or None when stdin or stderr is not one."""
    try:
        if not (sys.stdin is not None and sys.stdin.isatty() and sys.stderr.isatty()):
            return None
    except (OSError, ValueError):
        return None

    def ask(summary: str) -> bool:
        sys.stderr.write(f"{summary}\n{question} [y/N] ")
        sys.stderr.flush()
        answer = sys.stdin.readline()
        return answer.strip().lower() in ("y", "yes")

    return ask


# -- a run's recorded configuration ----------------------------------------------------------

# The keys of a run's recorded `[run]` table whose values act (the rest only shape it).
_ACTING_KEYS = ("hooks", "events", "agent", "prepare", "git", "sandbox")


class RunConfigActions(msgspec.Struct, frozen=True):
    """What a run's recorded configuration would do on resume, and its digest."""

    actions: list[Action]
    digest: str


class RecordedWorkflow(msgspec.Struct, frozen=True):
    """The workflow a run recorded, as a resume walks it: the digest of what makes it
    (its source and the files it names, as the run's meta ref stores them, its goal and
    inputs) and what its stages would do, in words (`fabro_git.engine.stored_run`)."""

    digest: str
    actions: list[Action]


def recorded_actions(
    settings: Mapping[str, object], workflow: RecordedWorkflow | None = None
) -> RunConfigActions:
    """The acting keys of a run's manifest settings (`settings["config"]`, and the
    setup commands it runs before the first stage, `settings["setup_commands"]`), and
    the stages of its recorded `workflow` that act, in words, and the sha256 of their
    canonical JSON. A resume acts on what the run records, not on today's project file
    or workflow: a fetched run's manifest and graph are its author's."""
    raw = settings.get("config") or {}
    config = raw if isinstance(raw, dict) else {}
    # The digest is of the recorded values as they are, read or not.
    acting: dict[str, object] = {key: config[key] for key in _ACTING_KEYS if config.get(key)}
    # What setup runs is its own copy (the prepare steps and the graph's `setup`).
    setup = settings.get("setup_commands") or []
    if setup:
        acting["setup_commands"] = setup
    staged = workflow.actions if workflow is not None else []
    if workflow is not None and staged:
        acting["workflow"] = workflow.digest
    digest = hashlib.sha256(msgspec.json.encode(acting, order="sorted")).hexdigest()
    recorded = read_recorded(config)
    commands = setup if isinstance(setup, list) else None
    if recorded.unreadable or commands is None or not all(isinstance(c, str) for c in commands):
        # A manifest this version cannot read whole: say so rather than guess what it does.
        found = [
            Action("run", "acts in ways this version cannot read (an unreadable configuration)")
        ]
        return RunConfigActions(found + staged if acting else [], digest)
    found = actions(recorded.run)
    prepared = (
        {step.shell() for step in recorded.run.prepare.steps} if recorded.run.prepare else set()
    )
    found += [
        Action(f"setup_commands[{i}]", f"runs {shown(command)} before the first stage")
        for i, command in enumerate(commands)
        if command not in prepared
    ]
    return RunConfigActions(found + staged, digest)


def batch_actions(workflow: str, remote: str | None) -> RunConfigActions:
    """What resuming a batch record does on its own say: the workflow each row runs and
    the remote every run pushes to. A record comes with `git fabro fetch` as a run does,
    so what it chooses acts, as a run's recorded configuration, once trusted."""
    acting = {"workflow": workflow, "remote": remote}
    digest = hashlib.sha256(msgspec.json.encode(acting, order="sorted")).hexdigest()
    found = [Action("workflow", f"runs the workflow {shown(workflow)} for each row not finished")]
    if remote:
        found.append(Action("remote", f"pushes each run's branch and metadata to {shown(remote)}"))
    return RunConfigActions(found, digest)


def record_run_config(repo_root: Path, run_id: str, recorded: RunConfigActions) -> None:
    """A run the user starts here acts with their consent (a trusted project file or
    their own config, their own workflow): remember what it recorded (`recorded`), so
    its resumes do not ask again."""
    if recorded.actions:
        TrustStore().trust_config(recorded.digest, repository=repo_root, run_id=run_id)


def check_run_config(
    run_id: str,
    recorded: RunConfigActions,
    *,
    ask: Callable[[str], bool] | None,
    repo_root: Path,
    store: TrustStore | None = None,
) -> None:
    """Refuse to resume a run whose recorded configuration or workflow would act
    (`recorded`: hooks, servers, pushes, the commands and agents of its stages) unless
    the user approved exactly that: by starting the run here, by `git fabro trust
    --run`, or now, at `ask`."""
    if not recorded.actions:
        return
    if recorded.digest in os.environ.get(VOUCHED_CONFIG_VARIABLE, "").split(","):
        return
    store = store if store is not None else TrustStore()
    if store.trusts_config(recorded.digest):
        return
    summary = f"run {run_id}'s recorded configuration is not trusted; it would:\n{describe(recorded.actions)}"
    if ask is not None and ask(summary):
        store.trust_config(recorded.digest, repository=repo_root, run_id=run_id)
        return
    raise ConfigError(
        f"{summary}\nnothing was resumed: the run was made elsewhere (or its configuration"
        " was never approved here)",
        hint=f"read it with `git fabro inspect {run_id}`, then run `git fabro trust --run {run_id}`",
    )


def default_layers(
    repo_root: Path | None, *, ask: Callable[[str], bool] | None = None
) -> list[Layer]:
    """The project and user layers, highest first. The project layer's acting keys
    need the user's trust (`trusted_project_layer`): `ask` puts an untrusted file to
    the user, and without it such a file is refused."""
    layers = []
    if repo_root is not None:
        layers.append(trusted_project_layer(repo_root, ask=ask))
    layers.append(load_layer(user_settings_path(), "user settings", run_config=False))
    return layers
