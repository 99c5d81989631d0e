"""Choosing the provider and model of a call from the layers that may name them.

The engine passes the layers in precedence order (node attribute, stylesheet, the
`--model`/`--provider` flags, run config); the first layer that names a model decides
it, and a provider named in that layer or a higher one decides who serves it. With no
provider named the catalogue infers it from the model; with nothing named at all the
first provider whose key is set (Anthropic, OpenAI, Gemini) serves its default model.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

import msgspec

from fabro_git.llm import catalogue
from fabro_git.llm.errors import UnknownModel
from fabro_git.llm.types import Target


class ModelChoice(msgspec.Struct, frozen=True, kw_only=True):
    """What one layer says; either part may be missing."""

    model: str | None = None
    provider: str | None = None


def default_provider(env: Mapping[str, str]) -> str:
    """The first provider in the default order whose key is set, else the first."""
    for name in catalogue.DEFAULT_PROVIDER_ORDER:
        if catalogue.configured(catalogue.PROVIDERS[name], env):
            return name
    return catalogue.DEFAULT_PROVIDER_ORDER[0]


def resolve_target(layers: Sequence[ModelChoice | None], env: Mapping[str, str]) -> Target:
    """The target the layers (highest precedence first) select."""
    provider: str | None = None
    for layer in layers:
        if layer is None:
            continue
        if layer.provider and provider is None:
            provider = layer.provider.strip()
        if layer.model:
            return _target_for(layer.model.strip(), provider)
    name = check_provider(provider) if provider else default_provider(env)
    info = catalogue.PROVIDERS[name]
    if info.default_model is None:
        raise UnknownModel(
            f"provider {name!r} has no default model: name one with --model or a node's model attribute",
            [],
        )
    return Target(name, info.default_model)


def resolve_model(model: str, provider: str | None = None) -> Target:
    """The target for one model name (an id, an alias or `provider/model`)."""
    return _target_for(model, provider)


def fallback_targets(entries: Sequence[str]) -> list[Target]:
    """Targets of a fallback list: provider tokens, model names or `provider/model`."""
    targets: list[Target] = []
    for entry in entries:
        entry = entry.strip()
        if entry in catalogue.PROVIDERS:
            targets.append(resolve_target([ModelChoice(provider=entry)], {}))
        else:
            targets.append(_target_for(entry, None))
    return targets


def check_provider(name: str) -> str:
    if name in catalogue.PROVIDERS:
        return name
    raise UnknownModel(f"unknown provider {name!r}", _closest(name, list(catalogue.PROVIDERS)))


def _target_for(model: str, provider: str | None) -> Target:
    if provider is None and "/" in model:
        head, _, rest = model.partition("/")
        if head in catalogue.PROVIDERS and rest:
            # `provider/model` is the escape hatch for ids newer than the catalogue.
            info = catalogue.lookup(rest)
            return Target(head, info.id if info and info.provider == head else rest)
    if provider is not None:
        provider = check_provider(provider)
        if catalogue.PROVIDERS[provider].open_models:
            return Target(provider, model)
    info = catalogue.lookup(model)
    if info is not None:
        if provider is not None and info.provider != provider:
            own = [m.id for m in catalogue.MODELS if m.provider == provider]
            raise UnknownModel(
                f"model {model!r} is served by {info.provider!r}, not {provider!r}",
                _closest(model, own),
            )
        return Target(info.provider, info.id)
    suggestions = _closest(model, catalogue.names())
    where = f" for provider {provider!r}" if provider else ""
    raise UnknownModel(
        f"unknown model {model!r}{where}; a model newer than the catalogue can be named as "
        "'provider/model'",
        suggestions,
    )


def _closest(name: str, candidates: list[str]) -> list[str]:
    return difflib.get_close_matches(name, candidates, n=3, cutoff=0.5)
