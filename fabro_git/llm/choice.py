"""Which provider, model and backend an LLM stage uses, and the check a run makes before
it exists.

A stage's target comes from, highest first: the node's `model`/`provider` attributes
(the model stylesheet has already written its choices there), the run's model (the
`--model`/`--provider` flags merged over `[run.model]`), then the default of the first
provider whose key is set. `check_stages` resolves every LLM stage of a workflow and its
children up front, so a misspelt model or a missing key stops the run before it starts
rather than at its fifth stage.

This package sits below `workflow/`, so a node is whatever answers `StageNode` (the
workflow's `Node` does), and a mistake in one of its attributes is a `StageChoiceError`
naming the node and the key: the engine turns it into an error at the attribute's line
in the workflow file.
"""

from __future__ import annotations

import difflib
import shutil
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import msgspec

from fabro_git.errors import ConfigError
from fabro_git.llm import catalogue
from fabro_git.llm.cli import PROFILES, program_for
from fabro_git.llm.errors import MissingCredentials, UnknownModel
from fabro_git.llm.resolve import ModelChoice, fallback_targets, resolve_target
from fabro_git.llm.types import ReasoningEffort, Target

LLM_TYPES = ("agent", "prompt", "codergen")
BACKENDS = ("api", "cli")
EFFORTS: tuple[ReasoningEffort, ...] = ("low", "medium", "high")
CLI_ALTERNATIVES = (
    "install it, name another program in the run config ([run.agent] cli_command), "
    'run the built-in agent with backend="api", or simulate the stage with --dry-run'
)


class StageNode(Protocol):
    """What model choice reads of a workflow node: its id, its handler type and its
    attributes (`model`, `provider`, `llm_model`, `llm_provider`, `reasoning_effort`,
    `backend`)."""

    @property
    def id(self) -> str: ...

    @property
    def handler_type(self) -> str: ...

    def get(self, key: str, /) -> str | None: ...


class StageChoiceError(ConfigError):
    """A node attribute that model choice cannot use: `key` names it, `detail` says why
    (the message adds the node's id)."""

    def __init__(self, node: StageNode, key: str, detail: str, *, hint: str | None = None) -> None:
        self.node = node
        self.key = key
        self.detail = detail
        super().__init__(f"node {node.id!r}: {detail}", hint=hint)


def is_llm(node: StageNode) -> bool:
    return node.handler_type in LLM_TYPES


def node_choice(node: StageNode) -> ModelChoice | None:
    model = node.get("model") or node.get("llm_model")
    provider = node.get("provider") or node.get("llm_provider")
    if not (model or provider):
        return None
    return ModelChoice(model=model or None, provider=provider or None)


def stage_target(
    node: StageNode, *, model: str | None, provider: str | None, env: Mapping[str, str]
) -> Target:
    """The target of `node`'s stage; `UnknownModel` names the closest catalogue names."""
    run_choice = ModelChoice(model=model, provider=provider) if (model or provider) else None
    return resolve_target([node_choice(node), run_choice], env)


def flag_provider(flag_model: str, merged_provider: str | None) -> str | None:
    """The run's provider once `--model` alone was given over configuration that names a
    provider: a model the catalogue puts with another provider (or a `provider/model`
    naming another) takes that provider, since the flag names the model as a whole and a
    lower layer's provider must not pair with it; any other model keeps the provider (a
    local server's models are not in the catalogue)."""
    if merged_provider is None:
        return None
    model = flag_model.strip()
    head, _, rest = model.partition("/")
    if rest and head in catalogue.PROVIDERS:
        return None if head != merged_provider.strip() else merged_provider
    info = catalogue.lookup(model)
    if info is not None and info.provider != merged_provider.strip():
        return None
    return merged_provider


def stage_fallbacks(entries: Sequence[str] | None) -> list[Target]:
    return fallback_targets(list(entries or ()))


def effort_of(node: StageNode) -> ReasoningEffort | None:
    """The node's `reasoning_effort`, or None; a `StageChoiceError` for a value not in
    `EFFORTS`."""
    value = (node.get("reasoning_effort") or "").strip().lower()
    if not value:
        return None
    for effort in EFFORTS:
        if value == effort:
            return effort
    raise StageChoiceError(
        node,
        "reasoning_effort",
        f"reasoning_effort={value!r} is not one of {', '.join(EFFORTS)}",
    )


def backend_of(node: StageNode) -> str:
    """What runs the stage: `api` (a prompt stage's one call, an agent stage's built-in
    loop) unless an agent node names another backend (`cli`: an installed agent CLI)."""
    if node.handler_type == "prompt":
        return "api"
    return (node.get("backend") or "api").strip().lower()


class CliChoice(msgspec.Struct, frozen=True):
    """What a `backend="cli"` stage runs: the provider whose profile applies, the model
    to ask for (None leaves the CLI's own default), and the program's path."""

    provider: str
    model: str | None
    program: str


def cli_choice(
    node: StageNode,
    *,
    model: str | None,
    provider: str | None,
    env: Mapping[str, str],
    custom: Sequence[str] | None,
) -> CliChoice:
    """The CLI of `node`'s stage; a `FabroError` when its provider has no profile or its
    program is not installed."""
    chosen = node_choice(node)
    named = (chosen.model if chosen else None) or model
    try:
        target = stage_target(node, model=model, provider=provider, env=env)
    except UnknownModel as err:
        # A CLI may serve models the catalogue does not list: with the provider named,
        # the model goes to the CLI as written.
        named_provider = (chosen.provider if chosen else None) or provider
        if not (named and named_provider and named_provider.strip() in PROFILES):
            raise _unknown_model(node, err) from None
        target = Target(named_provider.strip(), named.strip())
    if not custom and target.provider not in PROFILES:
        raise StageChoiceError(
            node,
            "backend",
            f"backend=cli has no built-in agent CLI for provider {target.provider!r} "
            f"(built in: {', '.join(f'{p} ({c.program})' for p, c in PROFILES.items())})",
            hint="name the program in the run config: [run.agent] cli_command = [...]",
        )
    program = program_for(target.provider, custom)
    found = shutil.which(program, path=env.get("PATH"))
    if found is None:
        where = "[run.agent] cli_command" if custom else f"the {target.provider} profile"
        raise ConfigError(
            f"node {node.id!r}: backend=cli runs {program!r} ({where}), "
            "which is not installed or not on PATH",
            hint=CLI_ALTERNATIVES,
        )
    return CliChoice(target.provider, target.model if named else None, found)


def check_stage(
    node: StageNode,
    *,
    model: str | None,
    provider: str | None,
    env: Mapping[str, str],
    cli_command: Sequence[str] | None,
) -> Target | None:
    """The target of one LLM stage (None for an agent CLI stage), or the `FabroError`
    that says why it cannot run."""
    backend = backend_of(node)
    if backend not in BACKENDS:
        raise StageChoiceError(
            node, "backend", f"backend={backend!r} is not one of {', '.join(BACKENDS)}"
        )
    effort_of(node)
    if backend == "cli":
        # The CLI brings its own credentials: only that it is installed is checked.
        cli_choice(node, model=model, provider=provider, env=env, custom=cli_command)
        return None
    try:
        return stage_target(node, model=model, provider=provider, env=env)
    except UnknownModel as err:
        raise _unknown_model(node, err) from None


def check_stages(
    nodes: Iterable[StageNode],
    *,
    model: str | None,
    provider: str | None,
    fallbacks: Sequence[str] | None,
    env: Mapping[str, str],
    cli_command: Sequence[str] | None = None,
) -> dict[str, Target]:
    """The target of every LLM stage in `nodes`, by node id (agent CLI stages aside); a
    `FabroError` for the first stage that cannot run: an unknown model or provider, an
    unknown backend, a provider whose key is not set, or an agent CLI that is not
    installed."""
    for entry in fallbacks or ():
        try:
            stage_fallbacks([entry])
        except UnknownModel as err:
            near = difflib.get_close_matches(entry.strip(), list(catalogue.PROVIDERS), n=2)
            raise UnknownModel(
                f"[run.model] fallbacks: {err.message}", near + err.suggestions
            ) from None
    targets: dict[str, Target] = {}
    for node in nodes:
        target = check_stage(node, model=model, provider=provider, env=env, cli_command=cli_command)
        if target is not None:
            targets[node.id] = target
    if not targets:
        return targets  # the SDK layer is imported only for a run that calls a model
    from fabro_git.llm.providers import connect

    for name in dict.fromkeys(target.provider for target in targets.values()):
        stages = [node for node, target in targets.items() if target.provider == name]
        try:
            connect(targets[stages[0]], env)
        except MissingCredentials as err:
            raise ConfigError(
                f"{err.message} (the LLM stages {', '.join(stages)} call {name})",
                hint=f"{err.hint}; or run with --dry-run to simulate the LLM stages",
            ) from None
    return targets


def _unknown_model(node: StageNode, err: UnknownModel) -> ConfigError:
    """`err` said of the model or provider the node names (a `StageChoiceError` at that
    attribute), or of the run's model when the node names none."""
    chosen = node_choice(node)
    if chosen is None:
        return UnknownModel(f"the run's model: {err.message}", err.suggestions)
    key = "model" if chosen.model else "provider"
    return StageChoiceError(node, key, err.message, hint=err.hint)
