"""Lifecycle hooks: the user's commands and webhooks, fired at the run's decision points.

A run's `[[run.hooks]]` (from the run config, `.fabro/project.toml` and the user's
settings, recorded in the manifest so a resume fires the same ones) name an event, an
optional `matcher` and a kind: `command` runs `sh -c` in the run's worktree (or, with
`sandbox = false`, in the user's checkout), `http` POSTs the event's JSON, `prompt` asks
the hook's model once (its `prompt`, then the event's JSON), and `agent` gives the same
to an agent session in the run's worktree, which may use its tools for at most
`max_tool_rounds` rounds before it answers.

A model's reply decides as a webhook's answer does: a JSON object in it, with `ok`
(true or false) or `decision` (proceed, skip, block, override) and a `reason`. A reply
with no such object, a model error and a timeout all proceed, each with a notice, as
Fabro's model hooks fail open: a model that rambles or an outage is not a verdict, and a
guard meant to hold must be a command hook, whose stray exit status blocks. What the
model spent is counted in the run's tokens and cost (`on_usage`).

A *blocking* hook is awaited and may decide: proceed, skip, block, or (for
`edge_selected`) override the edge. A non-blocking one runs beside the run, in the
nursery `running()` opens, and only its failures are heard of. The call sites in the
engine say what each decision means for their event; `fire` only gathers it.

A run that finishes waits for its non-blocking hooks (each bounded by its timeout). A
run told to stop (Ctrl-C, SIGTERM, `git fabro interrupt`, an error that ends it) waits
for none: `stop()` cancels those still running, which kills a command hook's process
group and abandons a webhook's request, and starts no more of them.

A `--dry-run` run fires none: it simulates, and a hook is there for its side effects
(a command, a POST). One notice names the hooks it did not run.

Hooks are the user's code, not the run's: a hook that fails to start, exits with a
stray status on a non-blocking event, times out, or whose endpoint is down never
fails the run by itself. Each becomes a `run.notice` (redacted on the bus, as every
event), and its output stays in the private scratch dir: nothing a hook prints is
committed. A hook in the worktree gets a stage's environment (`fabro_git.engine.stage_env`:
no secret-named variable but what `[run.sandbox.env]` passes), so it cannot write a key
into files the run commits; a host hook gets the user's. Either carries the run's hook
mark, so nothing it starts outlives the run (`fabro_git.engine.reaper`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import trio

from fabro_git import redact
from fabro_git.config.locations import make_private_dir, open_private
from fabro_git.engine.emit import Emit
from fabro_git.events.catalogue import NoticeLevel, RunNotice
from fabro_git.jsondata import JsonObject, JsonValue
from fabro_git.llm import types as llm

if TYPE_CHECKING:
    from fabro_git.engine.checkpoint import Manifest
    from fabro_git.engine.outcome import Usage
from fabro_git.engine.hook_spec import (
    HOOK_MAX_TOKENS,
    JUDGE_INSTRUCTIONS,
    PROCEED,
    RANK,
    RUNNABLE,
    Hook,
    HookDecision,
    check_hook_models,
)

# Re-exported: the engine and the handlers name them here.
__all__ = [
    "HOOK_MAX_TOKENS",
    "JUDGE_INSTRUCTIONS",
    "TOOL_EVENTS",
    "AgentReply",
    "Hook",
    "HookDecision",
    "LifecycleHooks",
    "StageToolHooks",
    "check_hook_models",
    "unheard",
]


BLOCK_EXIT = 2


OUTPUT_EXCERPT = 2000


# What answers an `agent` hook: the hooks, the hook, the question, the model and its
# fallbacks in; the reply's text, or why there is none, out.
AgentReply = Callable[
    ["LifecycleHooks", "Hook", str, llm.Target, list[llm.Target]],
    Awaitable[tuple[str, str | None]],
]


class LifecycleHooks:
    """A run's hooks and what firing them needs. `worktree` is where sandbox hooks run
    (set once the run's worktree is ready); `host_dir` is the user's checkout."""

    def __init__(
        self,
        hooks: list[Hook],
        *,
        run_id: str,
        workflow: str,
        host_dir: Path,
        scratch: Path,
        emit: Emit,
        dry_run: bool = False,
        sandbox_env: Mapping[str, str] | None = None,
        model: tuple[str | None, str | None] = (None, None),
        fallbacks: tuple[str, ...] = (),
    ) -> None:
        self.hooks = hooks
        # The run's model and provider, and its `[run.model] fallbacks`: a prompt or
        # agent hook's model when it names none.
        self.model = model
        self.fallbacks = fallbacks
        # Told what each model call of a prompt or agent hook spent (the run's tokens
        # and cost count it).
        self.on_usage: Callable[[Usage], None] | None = None
        # Runs an `agent` hook's session (`fabro_git.handlers.hooks.agent_hook_reply`).
        self.agent_reply: AgentReply | None = None
        self.sandbox_env = dict(sandbox_env or {})
        self.run_id = run_id
        self.workflow = workflow
        self.host_dir = host_dir
        self.scratch = scratch
        self.worktree: Path | None = None
        self._emit = emit
        self._nursery: trio.Nursery | None = None
        self._numbers = itertools.count(1)
        self._dry_run = dry_run
        self._events = frozenset(
            hook.event for hook in hooks if hook.kind in RUNNABLE and not dry_run
        )
        # Non-blocking hooks started and not yet done: all of them (the run's final
        # record waits for them, so their notices are in it), and those running in the
        # worktree (which is removed only once they are done).
        self._beside = _Tally()
        self._in_worktree = _Tally()
        # How many hooks have started so far: a hook may change the worktree, so what
        # was known of it before one started is no longer.
        self.started = 0
        # The non-blocking hooks started and not yet done, each with the scope that
        # stops it; and whether the run was told to stop.
        self._stoppable: dict[trio.CancelScope, Hook] = {}
        self._stopping = False
        # The blocking hook running now, with the scope that cuts it short; and whether
        # the user asked a second time, after which no hook runs at all.
        self._blocking: tuple[trio.CancelScope, Hook] | None = None
        self._cut = False

    @classmethod
    def from_manifest(
        cls,
        manifest: Manifest,
        *,
        run_id: str,
        workflow: str,
        host_dir: Path,
        scratch: Path,
        emit: Emit,
    ) -> LifecycleHooks:
        """The hooks the run's manifest records (its effective configuration)."""
        recorded = manifest.run_config
        options = manifest.options
        hooks = []
        for i, entry in enumerate(recorded.hooks):
            try:
                hooks.append(Hook.from_config(entry, i))
            except re.error as exc:
                # Checked when the run was made: only a manifest from another version
                # gets here, and a hook must not be what stops its run.
                emit(
                    RunNotice(
                        level="warn",
                        code="hook_unreadable",
                        message=f"hook {i + 1} of the run's configuration cannot be read ({exc}); it will not fire",
                    )
                )
        return cls(
            hooks,
            run_id=run_id,
            workflow=workflow,
            host_dir=host_dir,
            scratch=scratch,
            emit=emit,
            dry_run=options.dry_run,
            sandbox_env=recorded.sandbox_env,
            model=(options.model, options.provider),
            fallbacks=tuple(recorded.model_fallbacks),
        )

    def wants(self, event: str) -> bool:
        """Whether any hook listens for `event`: a caller can skip building its payload."""
        return event in self._events

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The lifetime of non-blocking hooks: they run in here, and leaving waits for
        those still running (each is bounded by its timeout), unless the body raised:
        then they are stopped."""
        unsupported = [hook for hook in self.hooks if hook.kind not in RUNNABLE]
        for hook in unsupported:
            self._notice(
                "hook_unsupported",
                f"hook {hook.name}: {hook.kind} hooks are not supported by this version; "
                "it will not fire",
            )
        skipped = [hook.name for hook in self.hooks if hook.kind in RUNNABLE and self._dry_run]
        if skipped:
            self._notice(
                "hooks_skipped",
                f"--dry-run: lifecycle hooks are not run ({', '.join(skipped)})",
                level="info",
            )
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    yield
                except BaseException:
                    self.stop()
                    raise
                finally:
                    self._nursery = None
        except BaseExceptionGroup as group:
            # The hooks' tasks raise nothing of their own: what comes out is the body's
            # error (a store error, Ctrl-C), which callers expect as it was raised.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise

    async def fire(self, event: str, **fields: JsonValue) -> HookDecision:
        """Fire `event`: start its non-blocking hooks, run its blocking ones in turn (a
        block ends the turn), and return their merged decision."""
        if event not in self._events:
            return PROCEED
        payload = self._payload(event, fields)
        decision = PROCEED
        for hook in self.hooks:
            if hook.kind not in RUNNABLE or not hook.matches(event, payload):
                continue
            if self._cut or (not hook.blocking and self._stopping):
                self._notice(
                    "hooks_stopped",
                    f"{event} hook {hook.name} was not started: the run is stopping",
                    payload,
                )
                continue
            self.started += 1
            if not hook.blocking:
                if self._nursery is not None:
                    # Counted now: the task starts later.
                    self._beside.add()
                    if _in_worktree(hook):
                        self._in_worktree.add()
                    scope = trio.CancelScope()
                    self._stoppable[scope] = hook
                    self._nursery.start_soon(self._run_beside, hook, payload, scope)
                else:
                    await self._run(hook, payload)
                continue
            with trio.CancelScope() as cutting:
                self._blocking = (cutting, hook)
                try:
                    outcome = await self._run(hook, payload)
                finally:
                    self._blocking = None
            if cutting.cancelled_caught:
                continue  # cut short by `cut_short`: it proceeds, as a timed-out hook does
            if RANK[outcome.action] > RANK[decision.action]:
                decision = outcome
            if decision.action == "block":
                break
        return decision

    def cut_short(self) -> None:
        """The user asked again while the run was finishing: stop the blocking hook
        running now (its process group is killed) and every hook still running beside
        the run, and run no more hooks. Each is named in a notice."""
        self._cut = True
        self.stop()
        if self._blocking is not None:
            scope, hook = self._blocking
            if not scope.cancel_called:
                scope.cancel()
                self._notice(
                    "hooks_stopped",
                    f"the run was asked again to stop: stopped {hook.event} hook {hook.name}",
                )

    @property
    def busy(self) -> bool:
        """Whether a non-blocking hook is still running."""
        return self._beside.count > 0

    def stop(self) -> None:
        """The run was told to stop: stop the non-blocking hooks still running, now, with
        a notice naming them, and start no more (a blocking hook runs on its own cancel
        scope: the stage's or the run's)."""
        self._stopping = True
        hooks = [hook for scope, hook in self._stoppable.items() if not scope.cancel_called]
        if not hooks:
            return
        for scope in self._stoppable:
            scope.cancel()
        names = ", ".join(f"{hook.event} hook {hook.name}" for hook in hooks)
        self._notice("hooks_stopped", f"the run is stopping: stopped {names}")

    async def wait_worktree_free(self) -> None:
        """Wait for the non-blocking hooks running in the worktree, before it goes."""
        await self._in_worktree.wait_zero()

    async def wait_all_done(self) -> None:
        """Wait for every non-blocking hook started so far."""
        await self._beside.wait_zero()

    async def _run_beside(self, hook: Hook, payload: JsonObject, scope: trio.CancelScope) -> None:
        said = PROCEED  # a stopped hook said nothing
        try:
            with scope:
                said = await self._run(hook, payload)
            if not said.proceeds:
                # Not a decision point: what it said is heard of, and the run goes on.
                self._notice(
                    "hook_not_blocking",
                    f"{said.describe(str(payload['event']))}, but it does not block (blocking = false); "
                    "the run goes on",
                    payload,
                    level="info",
                )
        finally:
            del self._stoppable[scope]
            self._beside.done()
            if _in_worktree(hook):
                self._in_worktree.done()

    def _payload(self, event: str, fields: Mapping[str, JsonValue]) -> JsonObject:
        payload: JsonObject = {
            "event": event,
            "run_id": self.run_id,
            "workflow_name": self.workflow,
            "cwd": str(self.worktree or self.host_dir),
        }
        payload.update((k, v) for k, v in fields.items() if v is not None)
        return payload

    # -- running one hook --------------------------------------------------------------

    async def _run(self, hook: Hook, payload: JsonObject) -> HookDecision:
        """Run `hook` on `payload` within its timeout. A failure is a notice, and the
        decision the hook's kind says it falls back to."""
        try:
            with trio.move_on_after(hook.timeout) as deadline:
                if hook.kind == "http":
                    decision = await self._post(hook, payload)
                elif hook.kind in ("prompt", "agent"):
                    decision = await self._ask_model(hook, payload)
                else:
                    decision = await self._command(hook, payload)
        except trio.Cancelled:
            raise
        except Exception as exc:  # a hook must never take the run down
            self._notice(
                "hook_failed",
                f"{payload['event']} hook {hook.name} failed: {type(exc).__name__}: {exc}",
                payload,
            )
            return PROCEED
        if deadline.cancelled_caught:
            self._notice(
                "hook_timeout",
                f"{payload['event']} hook {hook.name} timed out after {hook.timeout:g}s "
                "and was stopped; the run goes on",
                payload,
            )
            return PROCEED
        return decision

    async def _command(self, hook: Hook, payload: JsonObject) -> HookDecision:
        from fabro_git.engine import process_groups
        from fabro_git.engine.process import run_script

        assert hook.shell is not None
        logs = make_private_dir(self.scratch / "hooks")
        number = next(self._numbers)
        # The pid keeps a resumed run's hook files apart from the first process's.
        stem = logs / f"{os.getpid()}-{number:04d}-{payload['event']}"
        context = stem.with_suffix(".json")
        fd = open_private(context, os.O_WRONLY | os.O_TRUNC)
        with open(fd, "wb") as fh:
            fh.write(msgspec.json.encode(payload))
        out, err = Path(f"{stem}.stdout"), Path(f"{stem}.stderr")
        sandboxed = hook.sandbox and self.worktree is not None and self.worktree.is_dir()
        cwd = self.worktree if sandboxed and self.worktree is not None else self.host_dir
        env = self._environment(payload, context, sandboxed=sandboxed)
        shell = shutil.which("sh") or "/bin/sh"
        code, timed_out = await run_script(
            [shell, "-c", hook.shell],
            cwd=cwd,
            stdout=out,
            stderr=err,
            env=env,
            timeout=None,  # `_run`'s cancel scope bounds it; cancelling kills the group
            # Recorded, so the run's watcher kills it should `git fabro` die mid-hook.
            groups=process_groups.records_dir(self.scratch),
            group_kind="hook",
            stdin=context,
        )
        assert not timed_out
        said = _decision_in(_read(out))
        if code == 0:
            chosen = said or PROCEED
            return HookDecision(chosen.action, chosen.reason, chosen.edge_to, hook.name)
        if code == BLOCK_EXIT:
            reason = redact.clip(_read(err).strip(), OUTPUT_EXCERPT, end=True) or (
                f"hook exited with code {code}"
            )
            chosen = said or HookDecision("block", reason)
            return HookDecision(chosen.action, chosen.reason, chosen.edge_to, hook.name)
        detail = redact.clip(_read(err).strip(), OUTPUT_EXCERPT, end=True)
        message = f"{payload['event']} hook {hook.name} exited with code {code}"
        self._notice("hook_failed", message + (f": {detail}" if detail else ""), payload)
        if not hook.blocking:
            return PROCEED  # heard of in the notice; it decides nothing
        return HookDecision("block", f"hook exited with code {code}", hook=hook.name)

    def _environment(
        self, payload: Mapping[str, JsonValue], context: Path, *, sandboxed: bool
    ) -> dict[str, str]:
        from fabro_git.engine import process_groups
        from fabro_git.engine.reaper import MARK_VARIABLE
        from fabro_git.engine.stage_env import stage_environment

        mark = process_groups.process_mark(process_groups.records_dir(self.scratch), "hook")
        if sandboxed:
            env = stage_environment(sandbox=self.sandbox_env, mark=mark)
        else:
            env = dict(os.environ)
            env[MARK_VARIABLE] = mark
        env.update(
            FABRO_EVENT=str(payload["event"]),
            FABRO_RUN_ID=self.run_id,
            FABRO_WORKFLOW=self.workflow,
            FABRO_HOOK_CONTEXT=str(context),
        )
        node_id = payload.get("node_id")
        if isinstance(node_id, str):
            env["FABRO_NODE_ID"] = node_id
        else:
            env.pop("FABRO_NODE_ID", None)
        return env

    async def _post(self, hook: Hook, payload: JsonObject) -> HookDecision:
        """POST the payload. HTTP hooks fail open: a refused connection or a non-2xx
        answer is a notice and a proceed."""
        assert hook.url is not None
        headers = {"Content-Type": "application/json", "User-Agent": "git-fabro"}
        for name, value in (hook.headers or {}).items():
            headers[name] = _interpolate(value, hook.allowed_env_vars)
        body = msgspec.json.encode(payload)
        try:
            status, answer = await trio.to_thread.run_sync(
                _post_blocking,
                hook.url,
                body,
                headers,
                hook.tls,
                hook.timeout,
                abandon_on_cancel=True,
            )
        except OSError as exc:
            reason = getattr(exc, "reason", None) or exc
            self._notice(
                "hook_failed",
                f"{payload['event']} hook {hook.name}: POST {hook.url} failed: {reason}",
                payload,
            )
            return PROCEED
        if not 200 <= status < 300:
            self._notice(
                "hook_failed",
                f"{payload['event']} hook {hook.name}: POST {hook.url} answered {status}",
                payload,
            )
            return PROCEED
        said = _decision_in(answer)
        if said is None:
            return HookDecision(hook=hook.name)
        return HookDecision(said.action, said.reason, said.edge_to, hook.name)

    async def _ask_model(self, hook: Hook, payload: JsonObject) -> HookDecision:
        """A prompt hook's one model call, or an agent hook's session in the worktree,
        on the hook's prompt and the event's JSON. Model hooks fail open: a model error
        or a reply without a decision is a notice, and the run goes on."""
        from fabro_git.llm.resolve import ModelChoice, fallback_targets, resolve_target

        event = payload["event"]
        model, provider = self.model
        run_choice = ModelChoice(model=model, provider=provider) if model or provider else None
        hook_choice = ModelChoice(model=hook.model) if hook.model else None
        target = resolve_target([hook_choice, run_choice], os.environ)
        fallbacks = fallback_targets(list(self.fallbacks))
        # The same JSON a command hook reads on stdin.
        question = (
            f"{(hook.prompt or '').strip()}\n\nThe event:\n{msgspec.json.encode(payload).decode()}"
        )
        if hook.kind == "prompt":
            reply, error = await self._prompt_reply(question, target, fallbacks)
        else:
            reply, error = await self._agent_reply(hook, question, target, fallbacks)
        if error is not None:
            self._notice(
                "hook_failed",
                f"{event} hook {hook.name} ({target.provider}/{target.model}) failed: "
                f"{error}; the run goes on",
                payload,
            )
            return PROCEED
        said = _decision_in_reply(reply)
        if said is None:
            excerpt = " ".join(redact.masked(reply).split())[:200] or "(an empty reply)"
            self._notice(
                "hook_unreadable_reply",
                f"{event} hook {hook.name}: the model's reply holds no decision "
                f'({{"ok": true}} or {{"ok": false, "reason": ...}}); the run goes on. '
                f"It said: {excerpt}",
                payload,
            )
            return PROCEED
        return HookDecision(said.action, said.reason, said.edge_to, hook.name)

    async def _prompt_reply(
        self, question: str, target: llm.Target, fallbacks: list[llm.Target]
    ) -> tuple[str, str | None]:
        """One call without tools: its text, or why it failed."""
        from fabro_git.llm.client import complete
        from fabro_git.llm.errors import LlmError

        request = llm.Request(
            system=JUDGE_INSTRUCTIONS,
            messages=(llm.Message.user(question),),
            max_tokens=HOOK_MAX_TOKENS,
        )
        try:
            response = await complete(request, target, fallbacks=fallbacks, env=os.environ)
        except LlmError as err:
            return "", str(err)
        self.spent(response.target.model, response.usage, None)
        return response.text, None

    async def _agent_reply(
        self,
        hook: Hook,
        question: str,
        target: llm.Target,
        fallbacks: list[llm.Target],
    ) -> tuple[str, str | None]:
        """An agent session's answer (`agent_reply`, which the layer that has agents
        gives: the engine does not import them), or why there is none."""
        if self.agent_reply is None:
            return "", "agent hooks cannot run here (no agent was given to the run)"
        return await self.agent_reply(self, hook, question, target, fallbacks)

    def spent(self, model: str, used: llm.Usage, cost: float | None) -> None:
        """Count a model hook's tokens and cost in the run's."""
        from fabro_git.engine.outcome import Usage
        from fabro_git.llm.usage import estimate_cost

        if self.on_usage is None:
            return
        if cost is None:
            cost = estimate_cost(model, used)
        self.on_usage(
            Usage(
                model=model,
                input_tokens=used.input_tokens,
                output_tokens=used.output_tokens,
                cache_read_tokens=used.cache_read_tokens or None,
                cache_write_tokens=used.cache_write_tokens or None,
                reasoning_tokens=used.reasoning_tokens or None,
                cost=cost,
            )
        )

    def _notice(
        self,
        code: str,
        message: str,
        payload: Mapping[str, JsonValue] | None = None,
        *,
        level: NoticeLevel = "warn",
    ) -> None:
        node_id = payload.get("node_id") if payload else None
        self._emit(
            RunNotice(level=level, code=code, message=message),
            node_id=node_id if isinstance(node_id, str) else None,
        )


def _in_worktree(hook: Hook) -> bool:
    return (hook.kind == "command" and hook.sandbox) or hook.kind == "agent"


class _Tally:
    """A count of tasks in flight that can be waited down to zero."""

    def __init__(self) -> None:
        self.count = 0
        self._zero = trio.Event()
        self._zero.set()

    def add(self) -> None:
        if self.count == 0:
            self._zero = trio.Event()
        self.count += 1

    def done(self) -> None:
        self.count -= 1
        if self.count == 0:
            self._zero.set()

    async def wait_zero(self) -> None:
        await self._zero.wait()


TOOL_EVENTS = ("pre_tool_use", "post_tool_use", "post_tool_use_failure")


class StageToolHooks:
    """The tool events of one agent stage, in the shape the agent loop calls (its
    `ToolHooks`): a blocking `pre_tool_use` hook that blocks or skips refuses the call,
    and the model reads why as the tool's error; a block from a `post_tool_use` hook
    becomes a note after the tool's output."""

    def __init__(self, hooks: LifecycleHooks, *, node_id: str, node_label: str | None) -> None:
        self.hooks = hooks
        self.node_id = node_id
        self.node_label = node_label

    async def before_tool(
        self, name: str, call_id: str, arguments: Mapping[str, JsonValue]
    ) -> str | None:
        said = await self.hooks.fire(
            "pre_tool_use",
            node_id=self.node_id,
            node_label=self.node_label,
            tool_name=name,
            tool_call_id=call_id,
            tool_input=dict(arguments),
        )
        if said.proceeds:
            return None
        return f"This {name} call was not run: {said.describe('pre_tool_use')}"

    async def after_tool(self, name: str, call_id: str, output: str, is_error: bool) -> str | None:
        event = "post_tool_use_failure" if is_error else "post_tool_use"
        said = await self.hooks.fire(
            event,
            node_id=self.node_id,
            node_label=self.node_label,
            tool_name=name,
            tool_call_id=call_id,
            tool_output=None if is_error else output,
            error_message=output if is_error else None,
        )
        if said.action != "block":
            return None
        return f"[{said.describe(event)}]"


def _read(path: Path) -> str:
    try:
        with path.open("rb") as fh:
            return fh.read(64_000).decode("utf-8", "replace")
    except OSError:
        return ""


def _decision_in(text: str) -> HookDecision | None:
    """A decision a hook printed: a JSON object, the whole output or its last line, with
    `decision` (proceed, skip, block, override) or Fabro's `ok` form."""
    text = text.strip()
    if not text:
        return None
    lines = [line for line in text.split("\n") if line.strip()]  # JSON may hold U+2028 raw
    for candidate in (text, lines[-1]):
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if not isinstance(value, dict):
            continue
        reason = value.get("reason")
        reason = reason if isinstance(reason, str) else None
        action = value.get("decision")
        if action in RANK:
            edge_to = value.get("edge_to")
            if action == "override" and not isinstance(edge_to, str):
                return HookDecision("block", "override decision without edge_to")
            return HookDecision(action, reason, edge_to if action == "override" else None)
        if isinstance(value.get("ok"), bool):
            return HookDecision("proceed" if value["ok"] else "block", reason)
    return None


def _decision_in_reply(text: str) -> HookDecision | None:
    """The decision in a model's reply: as a hook's printed output says it, or else the
    last JSON object in the reply that holds one (a model wraps it in prose or a code
    fence)."""
    said = _decision_in(text)
    if said is not None:
        return said
    decoder = json.JSONDecoder()
    found = None
    for start in (i for i, char in enumerate(text) if char == "{"):
        try:
            value, _end = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(value, dict):
            found = _decision_in(json.dumps(value)) or found
    return found


def unheard(props: object) -> None:
    """An agent hook's session events: not the run's (they are no stage's)."""


_VAR_RE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def _interpolate(value: str, allowed: tuple[str, ...]) -> str:
    """`$VAR` and `${VAR}` in a header, for the variables `allowed_env_vars` names;
    any other stays as written."""

    def sub(match: re.Match[str]) -> str:
        name = match[1] or match[2]
        if name in allowed and name in os.environ:
            return os.environ[name]
        return match[0]

    return _VAR_RE.sub(sub, value)


def _post_blocking(
    url: str, body: bytes, headers: dict[str, str], tls: str, timeout: float
) -> tuple[int, str]:
    import ssl
    import urllib.error
    import urllib.request

    context = None
    if url.lower().startswith("https:"):
        context = ssl.create_default_context()
        if tls == "no_verify":
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        # A redirect is answered as the status it is: followed, the request's headers
        # (their secrets too) would go to a host the trusted configuration never named,
        # and from https down to plain http.
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context), NoRedirect)
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with opener.open(request, timeout=timeout) as response:
            return response.status, response.read(64_000).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
