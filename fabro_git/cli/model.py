"""`git fabro model list|test`: the model catalogue, and a live check of provider keys.

`test` sends one tiny prompt to each configured provider through the same provider
layer the stages use, so a passing test means the key, the endpoint and the SDK all
work. It does not retry: a rate limit or an outage is reported as it is.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping

import msgspec

from fabro_git.errors import ConfigError
from fabro_git.llm import catalogue
from fabro_git.llm.errors import README_SECTION
from fabro_git.llm.types import Target

PROBE_PROMPT = "Reply with the single word: ok"


def run_list(*, provider: str | None, json_output: bool) -> int:
    from fabro_git.llm.resolve import check_provider

    if provider is not None:
        provider = check_provider(provider)
    models = [m for m in catalogue.MODELS if provider is None or m.provider == provider]
    if json_output:
        print(json.dumps([msgspec.to_builtins(m) for m in models], indent=2))
        return 0
    if not models:
        print(
            f"provider {provider!r} serves any model its server has; name one with --model "
            f"(e.g. `git fabro model test --provider {provider} --model NAME`)",
            file=sys.stderr,
        )
        return 0
    rows = [("MODEL", "PROVIDER", "ALIASES", "CONTEXT", "INPUT $/MTOK", "OUTPUT $/MTOK")]
    rows += [
        (
            m.id,
            m.provider,
            ", ".join(m.aliases) or "-",
            _context(m.context_window),
            _price(m.input_price),
            _price(m.output_price),
        )
        for m in models
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    return 0


def _context(tokens: int | None) -> str:
    if tokens is None:
        return "-"
    if tokens >= 1_000_000 and tokens % 1_000_000 == 0:
        return f"{tokens // 1_000_000}M"
    return f"{tokens // 1000}K"


def _price(value: float | None) -> str:
    return "n/a" if value is None else f"${value:.2f}"


class _Outcome(msgspec.Struct):
    target: Target
    ok: bool
    seconds: float
    detail: str


def run_test(*, provider: str | None, model: str | None) -> int:
    import trio

    from fabro_git.terminal import printable

    env = dict(os.environ)
    targets, skipped = _targets(provider, model, env)
    for name, reason in skipped:
        print(f"{name}: skipped: {reason}", file=sys.stderr)
    if not targets:
        raise ConfigError(
            "no model provider is configured: set ANTHROPIC_API_KEY, OPENAI_API_KEY or "
            "GEMINI_API_KEY (or a local server's URL, such as OLLAMA_BASE_URL)",
            hint=f"see the {README_SECTION}",
        )
    from fabro_git.llm.providers import load_sdk

    # Import before the clock starts, so the latency shown is the provider's.
    for api in {catalogue.PROVIDERS[target.provider].api for target in targets}:
        load_sdk(api)
    outcomes = trio.run(_probe_all, targets, env)
    width = max(len(str(outcome.target)) for outcome in outcomes)
    for outcome in outcomes:
        status = "ok    " if outcome.ok else "FAILED"
        # The detail quotes the provider: its error body, or why it stopped.
        detail = printable(outcome.detail, one_line=True)
        print(f"{str(outcome.target).ljust(width)}  {status}  {outcome.seconds:6.2f}s  {detail}")
    failed = [outcome for outcome in outcomes if not outcome.ok]
    if failed:
        names = ", ".join(outcome.target.provider for outcome in failed)
        print(f"error: {len(failed)} of {len(outcomes)} providers failed: {names}", file=sys.stderr)
        return 1
    return 0


def _targets(
    provider: str | None, model: str | None, env: Mapping[str, str]
) -> tuple[list[Target], list[tuple[str, str]]]:
    from fabro_git.llm.resolve import ModelChoice, check_provider, resolve_model, resolve_target

    if model is not None:
        return [resolve_model(model, provider)], []
    if provider is not None:
        return [resolve_target([ModelChoice(provider=check_provider(provider))], env)], []
    targets: list[Target] = []
    skipped: list[tuple[str, str]] = []
    for info in catalogue.PROVIDERS.values():
        if not catalogue.configured(info, env):
            continue
        if info.default_model is None:
            skipped.append(
                (
                    info.name,
                    f"it has no default model; test it with --provider {info.name} --model NAME",
                )
            )
            continue
        targets.append(Target(info.name, info.default_model))
    return targets, skipped


async def _probe_all(targets: list[Target], env: Mapping[str, str]) -> list[_Outcome]:
    import trio

    outcomes: list[_Outcome | None] = [None] * len(targets)

    async def probe(index: int, target: Target) -> None:
        outcomes[index] = await _probe(target, env)

    async with trio.open_nursery() as nursery:
        for index, target in enumerate(targets):
            nursery.start_soon(probe, index, target)
    return [outcome for outcome in outcomes if outcome is not None]


async def _probe(target: Target, env: Mapping[str, str]) -> _Outcome:
    import trio

    from fabro_git.errors import FabroError
    from fabro_git.llm.client import NO_RETRIES, complete
    from fabro_git.llm.types import Message, Request

    # Room for the reasoning that models such as gpt-5 and Gemini 3 do before any text.
    request = Request(messages=(Message.user(PROBE_PROMPT),), max_tokens=512, timeout=60.0)
    started = trio.current_time()
    try:
        response = await complete(request, target, env=env, policy=NO_RETRIES)
    except FabroError as err:
        return _Outcome(target, False, trio.current_time() - started, str(err).replace("\n", "; "))
    reply = " ".join(response.text.split())
    if len(reply) > 40:
        reply = reply[:39] + "…"
    usage = response.usage
    said = repr(reply) if reply else f"no text (stopped: {response.stop_reason})"
    detail = f"{said} ({usage.input_tokens} in, {usage.output_tokens} out tokens)"
    return _Outcome(target, True, trio.current_time() - started, detail)
