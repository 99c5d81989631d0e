"""Model names the validator recognises, and the provider each belongs to.

A misspelt model name is otherwise discovered only when a run reaches that stage and
the provider rejects it, after minutes of work. The names come from the one model
catalogue (`fabro_git.llm.catalogue`); the check warns, never errors, so a brand-new
model still runs.
"""

from __future__ import annotations

from fabro_git.llm import catalogue as _llm

ALIASES: dict[str, str] = _llm.ALIASES
PROVIDERS: frozenset[str] = frozenset(_llm.PROVIDERS)
MODEL_PROVIDERS: dict[str, str] = {model.id: model.provider for model in _llm.MODELS}
# Every name a workflow may use for a model: ids and aliases.
KNOWN_MODELS: frozenset[str] = frozenset(MODEL_PROVIDERS) | frozenset(ALIASES)


def canonical_model(model: str) -> str:
    """The model id an alias stands for (ids map to themselves)."""
    return ALIASES.get(model, model)


def provider_for_model(model: str) -> str | None:
    """The provider serving `model` (an id, an alias or `provider/model`), if known."""
    if "/" in model:
        provider, _, _rest = model.partition("/")
        return provider if provider in PROVIDERS else None
    return MODEL_PROVIDERS.get(canonical_model(model))
