"""The model catalogue: which models exist, who serves them, and what they cost.

One offline table, carried as data of our own, serves three callers: the validator
(`stylesheet_model_known` warns on a misspelt model before a run starts), the resolver
(aliases, the provider of a model, each provider's default) and cost accounting. Models
beyond the documented table (older ids a workflow may still name) are listed without a
context window or prices rather than with guessed figures.

Providers are listed here too, with the environment variables that configure them, so
the one place that knows `GEMINI_API_KEY` is this table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import msgspec

# Which wire protocol a provider speaks; each has one adapter in `fabro_git.llm.providers`.
Api = Literal["anthropic", "openai-responses", "chat-completions"]


class ModelInfo(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    provider: str
    aliases: tuple[str, ...] = ()
    context_window: int | None = None
    # US dollars per million tokens; None where the catalogue has no figure.
    input_price: float | None = None
    output_price: float | None = None


class ProviderInfo(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    api: Api
    # Checked in order; the first that is set is the key.
    key_env: tuple[str, ...]
    base_url_env: str
    default_base_url: str | None
    # What a stage with no model named runs on: a mid-priced model of the provider's
    # own (a Sonnet, not an Opus), since with one key set it serves every stage of every
    # run; a workflow that wants the priciest names it.
    default_model: str | None
    # Local servers need no key: they count as configured once their base URL is set.
    key_required: bool = True
    # Gateways and local servers serve any model name, so no catalogue check applies.
    open_models: bool = False


PROVIDERS: dict[str, ProviderInfo] = {
    info.name: info
    for info in (
        ProviderInfo(
            name="anthropic",
            api="anthropic",
            key_env=("ANTHROPIC_API_KEY",),
            base_url_env="ANTHROPIC_BASE_URL",
            default_base_url=None,
            default_model="claude-sonnet-4-6",
        ),
        ProviderInfo(
            name="openai",
            api="openai-responses",
            key_env=("OPENAI_API_KEY",),
            base_url_env="OPENAI_BASE_URL",
            default_base_url=None,
            default_model="gpt-5.4",
        ),
        ProviderInfo(
            name="gemini",
            api="chat-completions",
            key_env=("GEMINI_API_KEY", "GOOGLE_API_KEY"),
            base_url_env="GEMINI_BASE_URL",
            default_base_url="https://generativelanguage.googleapis.com/v1beta/openai/",
            default_model="gemini-3-flash-preview",
        ),
        ProviderInfo(
            name="kimi",
            api="chat-completions",
            key_env=("KIMI_API_KEY", "MOONSHOT_API_KEY"),
            base_url_env="KIMI_BASE_URL",
            default_base_url="https://api.moonshot.ai/v1",
            default_model="kimi-k2.5",
        ),
        ProviderInfo(
            name="zai",
            api="chat-completions",
            key_env=("ZAI_API_KEY",),
            base_url_env="ZAI_BASE_URL",
            default_base_url="https://api.z.ai/api/paas/v4",
            default_model="glm-4.7",
        ),
        ProviderInfo(
            name="minimax",
            api="chat-completions",
            key_env=("MINIMAX_API_KEY",),
            base_url_env="MINIMAX_BASE_URL",
            default_base_url="https://api.minimax.io/v1",
            default_model="minimax-m2.5",
        ),
        ProviderInfo(
            name="inception",
            api="chat-completions",
            key_env=("INCEPTION_API_KEY",),
            base_url_env="INCEPTION_BASE_URL",
            default_base_url="https://api.inceptionlabs.ai/v1",
            default_model="mercury-2",
        ),
        ProviderInfo(
            name="openrouter",
            api="chat-completions",
            key_env=("OPENROUTER_API_KEY",),
            base_url_env="OPENROUTER_BASE_URL",
            default_base_url="https://openrouter.ai/api/v1",
            default_model=None,
            open_models=True,
        ),
        ProviderInfo(
            name="ollama",
            api="chat-completions",
            key_env=("OLLAMA_API_KEY",),
            base_url_env="OLLAMA_BASE_URL",
            default_base_url=None,
            default_model=None,
            key_required=False,
            open_models=True,
        ),
        ProviderInfo(
            name="vllm",
            api="chat-completions",
            key_env=("VLLM_API_KEY",),
            base_url_env="VLLM_BASE_URL",
            default_base_url=None,
            default_model=None,
            key_required=False,
            open_models=True,
        ),
        ProviderInfo(
            name="llamacpp",
            api="chat-completions",
            key_env=("LLAMACPP_API_KEY",),
            base_url_env="LLAMACPP_BASE_URL",
            default_base_url=None,
            default_model=None,
            key_required=False,
            open_models=True,
        ),
        ProviderInfo(
            name="lmstudio",
            api="chat-completions",
            key_env=("LMSTUDIO_API_KEY",),
            base_url_env="LMSTUDIO_BASE_URL",
            default_base_url=None,
            default_model=None,
            key_required=False,
            open_models=True,
        ),
    )
}

# When nothing names a provider, the first one with a key wins; with none, the first.
DEFAULT_PROVIDER_ORDER: tuple[str, ...] = ("anthropic", "openai", "gemini")

_M = 1_000_000
_K = 1_000


def _model(
    id: str,
    provider: str,
    aliases: tuple[str, ...] = (),
    context: int | None = None,
    prices: tuple[float, float] | None = None,
) -> ModelInfo:
    return ModelInfo(
        id=id,
        provider=provider,
        aliases=aliases,
        context_window=context,
        input_price=prices[0] if prices else None,
        output_price=prices[1] if prices else None,
    )


MODELS: tuple[ModelInfo, ...] = (
    # The documented catalogue: context windows and prices known.
    _model("claude-opus-4-7", "anthropic", ("opus", "claude-opus"), 1 * _M, (5.00, 25.00)),
    _model("claude-opus-4-6", "anthropic", (), 1 * _M, (5.00, 25.00)),
    _model("claude-sonnet-4-6", "anthropic", ("sonnet", "claude-sonnet"), 200 * _K, (3.00, 15.00)),
    _model("claude-sonnet-4-5", "anthropic", (), 200 * _K, (3.00, 15.00)),
    _model("claude-haiku-4-5", "anthropic", ("haiku", "claude-haiku"), 200 * _K, (0.80, 4.00)),
    _model("gpt-5.2", "openai", ("gpt5",), 1 * _M, (1.80, 14.00)),
    _model("gpt-5-mini", "openai", ("gpt5-mini",), 1 * _M, (0.20, 2.00)),
    _model("gpt-5.2-codex", "openai", (), 1 * _M, (1.80, 14.00)),
    _model("gpt-5.3-codex", "openai", ("codex",), 1 * _M, (1.80, 14.00)),
    _model("gpt-5.3-codex-spark", "openai", ("codex-spark",), 128 * _K, None),
    _model("gpt-5.4", "openai", ("gpt54",), 1 * _M, (2.50, 15.00)),
    _model("gpt-5.5", "openai", ("gpt55",), 1 * _M, (5.00, 30.00)),
    _model("gpt-5.5-pro", "openai", ("gpt55-pro",), 1 * _M, (30.00, 180.00)),
    _model("gpt-5.4-mini", "openai", ("gpt54-mini",), 400 * _K, (0.75, 4.50)),
    _model("gpt-5.4-pro", "openai", ("gpt54-pro",), 1 * _M, (30.00, 180.00)),
    _model("gemini-3.1-pro-preview", "gemini", ("gemini-pro",), 1 * _M, (2.00, 12.00)),
    _model(
        "gemini-3.1-pro-preview-customtools",
        "gemini",
        ("gemini-customtools",),
        1 * _M,
        (2.00, 12.00),
    ),
    _model("gemini-3-flash-preview", "gemini", ("gemini-flash",), 1 * _M, (0.50, 3.00)),
    _model("gemini-3.1-flash-lite-preview", "gemini", ("gemini-flash-lite",), 1 * _M, (0.20, 1.50)),
    _model("kimi-k2.5", "kimi", ("kimi",), 262 * _K, (0.60, 3.00)),
    _model("glm-4.7", "zai", ("glm", "glm4"), 203 * _K, (0.60, 2.20)),
    _model("minimax-m2.5", "minimax", ("minimax",), 197 * _K, (0.30, 1.20)),
    _model("mercury-2", "inception", ("mercury",), 131 * _K, (0.20, 0.80)),
    # Older or less common ids a workflow may still name: known, but without figures.
    _model("claude-opus-4-5", "anthropic"),
    _model("claude-opus-4-1", "anthropic"),
    _model("claude-opus-4-0", "anthropic"),
    _model("claude-sonnet-4-0", "anthropic"),
    _model("claude-3-7-sonnet-latest", "anthropic"),
    _model("claude-3-5-haiku-latest", "anthropic"),
    _model("gpt-5", "openai"),
    _model("gpt-5-nano", "openai"),
    _model("gpt-5-codex", "openai"),
    _model("gpt-5.1", "openai"),
    _model("gpt-5.1-codex", "openai"),
    _model("gpt-4.1", "openai"),
    _model("gpt-4.1-mini", "openai"),
    _model("gpt-4.1-nano", "openai"),
    _model("gpt-4o", "openai"),
    _model("gpt-4o-mini", "openai"),
    _model("o3", "openai"),
    _model("o3-mini", "openai"),
    _model("o3-pro", "openai"),
    _model("o4-mini", "openai"),
    _model("gemini-3-pro-preview", "gemini"),
    _model("gemini-2.5-pro", "gemini"),
    _model("gemini-2.5-flash", "gemini"),
    _model("gemini-2.5-flash-lite", "gemini"),
)

MODELS_BY_ID: dict[str, ModelInfo] = {model.id: model for model in MODELS}
ALIASES: dict[str, str] = {alias: model.id for model in MODELS for alias in model.aliases}


def lookup(name: str) -> ModelInfo | None:
    """The catalogue entry for a model id or alias."""
    return MODELS_BY_ID.get(ALIASES.get(name, name))


def names() -> list[str]:
    """Every model id and alias, for suggestions."""
    return [*MODELS_BY_ID, *ALIASES]


def configured(provider: ProviderInfo, env: Mapping[str, str]) -> bool:
    """Whether the environment configures `provider`: its key, or for a local server its URL."""
    if provider.key_required:
        return api_key(provider, env) is not None
    return bool(env.get(provider.base_url_env, "").strip())


def api_key(provider: ProviderInfo, env: Mapping[str, str]) -> str | None:
    for var in provider.key_env:
        value = env.get(var, "").strip()
        if value:
            return value
    return None


def base_url(provider: ProviderInfo, env: Mapping[str, str]) -> str | None:
    return env.get(provider.base_url_env, "").strip() or provider.default_base_url
