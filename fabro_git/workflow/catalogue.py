"""Model ids the validator recognises, and the provider each belongs to.

A misspelt model name is otherwise discovered only when a run reaches that stage and
the provider rejects it, after minutes of work. This list is deliberately small and
offline; it warns, never errors, so a brand-new model still runs.
"""

from __future__ import annotations

_BY_PROVIDER: dict[str, tuple[str, ...]] = {
    "anthropic": (
        "claude-opus-4-7",
        "claude-opus-4-6",
        "claude-opus-4-5",
        "claude-opus-4-1",
        "claude-opus-4-0",
        "claude-sonnet-4-6",
        "claude-sonnet-4-5",
        "claude-sonnet-4-0",
        "claude-3-7-sonnet-latest",
        "claude-haiku-4-5",
        "claude-3-5-haiku-latest",
    ),
    "openai": (
        "gpt-5",
        "gpt-5-mini",
        "gpt-5-nano",
        "gpt-5-codex",
        "gpt-5.1",
        "gpt-5.1-codex",
        "gpt-5.2",
        "gpt-5.2-codex",
        "gpt-5.3-codex",
        "gpt-5.3-codex-spark",
        "gpt-5.4",
        "gpt-5.4-mini",
        "gpt-5.4-pro",
        "gpt-5.5",
        "gpt-5.5-pro",
        "gpt-4.1",
        "gpt-4.1-mini",
        "gpt-4.1-nano",
        "gpt-4o",
        "gpt-4o-mini",
        "o3",
        "o3-mini",
        "o3-pro",
        "o4-mini",
    ),
    "gemini": (
        "gemini-3.1-pro-preview",
        "gemini-3.1-pro-preview-customtools",
        "gemini-3-pro-preview",
        "gemini-3-flash-preview",
        "gemini-3.1-flash-lite-preview",
        "gemini-2.5-pro",
        "gemini-2.5-flash",
        "gemini-2.5-flash-lite",
    ),
    "kimi": ("kimi-k2.5",),
    "zai": ("glm-4.7",),
    "minimax": ("minimax-m2.5",),
    "inception": ("mercury-2",),
}

ALIASES: dict[str, str] = {
    "opus": "claude-opus-4-7",
    "claude-opus": "claude-opus-4-7",
    "sonnet": "claude-sonnet-4-6",
    "claude-sonnet": "claude-sonnet-4-6",
    "haiku": "claude-haiku-4-5",
    "claude-haiku": "claude-haiku-4-5",
    "gpt5": "gpt-5.2",
    "gpt5-mini": "gpt-5-mini",
    "codex": "gpt-5.3-codex",
    "codex-spark": "gpt-5.3-codex-spark",
    "gpt54": "gpt-5.4",
    "gpt54-mini": "gpt-5.4-mini",
    "gpt54-pro": "gpt-5.4-pro",
    "gpt55": "gpt-5.5",
    "gpt55-pro": "gpt-5.5-pro",
    "gemini-pro": "gemini-3.1-pro-preview",
    "gemini-customtools": "gemini-3.1-pro-preview-customtools",
    "gemini-flash": "gemini-3-flash-preview",
    "gemini-flash-lite": "gemini-3.1-flash-lite-preview",
    "kimi": "kimi-k2.5",
    "glm": "glm-4.7",
    "glm4": "glm-4.7",
    "minimax": "minimax-m2.5",
    "mercury": "mercury-2",
}

PROVIDERS: frozenset[str] = frozenset(_BY_PROVIDER)
MODEL_PROVIDERS: dict[str, str] = {
    model: provider for provider, models in _BY_PROVIDER.items() for model in models
}
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
