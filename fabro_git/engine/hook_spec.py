"""What a lifecycle hook is and what it may decide: the `Hook` a run's `[[run.hooks]]`
entry becomes, the `HookDecision` of a firing, the events that block by default, and
the check a run makes of model hooks before it exists. `fabro_git.engine.lifecycle`
fires them."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

import msgspec

from fabro_git.jsondata import JsonValue

if TYPE_CHECKING:
    from fabro_git.config.run_config import HookConfig


# Decision points: a hook on these events is awaited unless it says `blocking = false`.
BLOCKING_BY_DEFAULT = frozenset(
    {"run_start", "stage_start", "edge_selected", "pre_tool_use", "sandbox_ready"}
)


# The payload fields a matcher is tried against, by event; other events ignore matchers.
MATCHED_FIELDS: dict[str, tuple[str, ...]] = {
    "stage_start": ("node_id", "handler_type"),
    "stage_complete": ("node_id", "handler_type"),
    "stage_failed": ("node_id", "handler_type"),
    "stage_retrying": ("node_id", "handler_type"),
    "edge_selected": ("edge_from", "edge_to"),
    "pre_tool_use": ("tool_name", "node_id"),
    "post_tool_use": ("tool_name", "node_id"),
    "post_tool_use_failure": ("tool_name", "node_id"),
    "checkpoint_saved": ("node_id",),
}


DEFAULT_TIMEOUT_MS = {"command": 60_000, "http": 60_000, "prompt": 30_000, "agent": 60_000}


# Tool rounds an agent hook may take before it must answer (`max_tool_rounds`).
DEFAULT_TOOL_ROUNDS = 10


HOOK_MAX_TOKENS = 1024


# What a prompt or agent hook is told beside its own prompt: how to answer.
JUDGE_INSTRUCTIONS = """\
You are a lifecycle hook of a git fabro workflow run. You are shown one event of the \
run, as JSON, and a question about it from the person who set up the hook. Decide \
whether the run may go on past this event.

End your answer with one JSON object on a line of its own: {"ok": true} to let the \
run go on, or {"ok": false, "reason": "<one sentence>"} to block it."""


Action = Literal["proceed", "skip", "block", "override"]


RANK: dict[str, int] = {"proceed": 0, "skip": 1, "override": 1, "block": 2}


class HookDecision(msgspec.Struct, frozen=True):
    """What the blocking hooks of one firing decided, merged: block over skip or
    override over proceed. `hook` names the hook that decided."""

    action: Action = "proceed"
    reason: str | None = None
    edge_to: str | None = None
    hook: str | None = None

    @property
    def proceeds(self) -> bool:
        return self.action == "proceed"

    def describe(self, event: str) -> str:
        verb = {"block": "blocked", "skip": "skipped", "override": "redirected"}.get(
            self.action, "passed"
        )
        said = f": {self.reason}" if self.reason else ""
        return f"{event} hook {self.hook or '(unnamed)'} {verb} it{said}"


PROCEED = HookDecision()


class Hook(msgspec.Struct, frozen=True):
    """One configured hook, with its defaults filled in."""

    name: str
    event: str
    kind: str
    blocking: bool
    timeout: float  # seconds
    sandbox: bool
    matcher: re.Pattern[str] | None
    shell: str | None = None
    url: str | None = None
    headers: Mapping[str, str] | None = None
    allowed_env_vars: tuple[str, ...] = ()
    tls: str = "verify"
    prompt: str | None = None
    model: str | None = None
    max_tool_rounds: int = DEFAULT_TOOL_ROUNDS

    @classmethod
    def from_config(cls, config: HookConfig, index: int) -> Hook:
        """The hook `[[run.hooks]]` entry number `index` (from 0) configures; a matcher
        that is no regular expression raises `re.error`."""
        from fabro_git.durations import parse_duration

        kind = config.kind
        if config.timeout_ms is not None:
            timeout = config.timeout_ms / 1000
        elif config.timeout is not None:
            timeout = parse_duration(config.timeout.strip()) or 0.0
        else:
            timeout = DEFAULT_TIMEOUT_MS[kind] / 1000
        blocking = (
            config.blocking if config.blocking is not None else config.event in BLOCKING_BY_DEFAULT
        )
        return cls(
            name=config.name or config.id or f"{config.event}-{kind}-{index + 1}",
            event=config.event,
            kind=kind,
            blocking=blocking,
            timeout=timeout,
            sandbox=config.sandbox if config.sandbox is not None else True,
            matcher=re.compile(config.matcher) if config.matcher else None,
            shell=config.shell,
            url=config.url,
            headers=config.headers,
            allowed_env_vars=tuple(config.allowed_env_vars or ()),
            tls=config.tls or "verify",
            prompt=config.prompt,
            model=config.model,
            max_tool_rounds=config.max_tool_rounds
            if config.max_tool_rounds is not None
            else DEFAULT_TOOL_ROUNDS,
        )

    def matches(self, event: str, payload: Mapping[str, JsonValue]) -> bool:
        if event != self.event:
            return False
        fields = MATCHED_FIELDS.get(event)
        if self.matcher is None or fields is None:
            return True
        values = (payload.get(name) for name in fields)
        return any(isinstance(value, str) and self.matcher.search(value) for value in values)


RUNNABLE = frozenset({"command", "http", "prompt", "agent"})


MODEL_KINDS = ("prompt", "agent")


def check_hook_models(
    hooks: Sequence[HookConfig],
    *,
    model: str | None,
    provider: str | None,
    env: Mapping[str, str],
) -> None:
    """Refuse, before the run exists, a prompt or agent hook whose model is unknown or
    whose provider has no key: such a hook would only fail open at every event."""
    if not any(hook.kind in MODEL_KINDS for hook in hooks):
        return  # the SDK layer is imported only for a run that calls a model
    from fabro_git.errors import ConfigError
    from fabro_git.llm.errors import MissingCredentials, UnknownModel
    from fabro_git.llm.providers import connect
    from fabro_git.llm.resolve import ModelChoice, resolve_target

    run_choice = ModelChoice(model=model, provider=provider) if model or provider else None
    for i, hook in enumerate(hooks):
        if hook.kind not in MODEL_KINDS:
            continue
        named = hook.name or hook.id or f"{hook.event}-{hook.kind}-{i + 1}"
        where = f"[[run.hooks]] {hook.kind} hook {named!r} ({hook.event})"
        try:
            connect(
                resolve_target(
                    [ModelChoice(model=hook.model) if hook.model else None, run_choice], env
                ),
                env,
            )
        except (UnknownModel, MissingCredentials) as err:
            raise ConfigError(
                f"{where}: {err.message}",
                hint=f"{err.hint}; or name another `model` for the hook"
                if err.hint
                else "name another `model` for the hook",
            ) from None
