"""Choosing a provider and model: aliases, defaults by keys, precedence, suggestions."""

from __future__ import annotations

import pytest

from fabro_git.llm import catalogue
from fabro_git.llm.errors import UnknownModel
from fabro_git.llm.resolve import (
    ModelChoice,
    default_provider,
    fallback_targets,
    resolve_model,
    resolve_target,
)
from fabro_git.llm.types import Target
from fabro_git.workflow import catalogue as workflow_catalogue


@pytest.mark.parametrize(
    ("name", "target"),
    [
        ("sonnet", Target("anthropic", "claude-sonnet-4-6")),
        ("opus", Target("anthropic", "claude-opus-4-7")),
        ("haiku", Target("anthropic", "claude-haiku-4-5")),
        ("gpt54", Target("openai", "gpt-5.4")),
        ("codex", Target("openai", "gpt-5.3-codex")),
        ("gemini-pro", Target("gemini", "gemini-3.1-pro-preview")),
        ("glm", Target("zai", "glm-4.7")),
        ("mercury", Target("inception", "mercury-2")),
        ("claude-sonnet-4-5", Target("anthropic", "claude-sonnet-4-5")),
        ("anthropic/claude-opus-9", Target("anthropic", "claude-opus-9")),
        ("ollama/llama3.2", Target("ollama", "llama3.2")),
        (
            "openrouter/anthropic/claude-sonnet-4.5",
            Target("openrouter", "anthropic/claude-sonnet-4.5"),
        ),
    ],
)
def test_names_resolve_through_the_catalogue(name: str, target: Target) -> None:
    assert resolve_model(name) == target


def test_unknown_model_suggests_the_closest_names() -> None:
    with pytest.raises(UnknownModel) as caught:
        resolve_model("claude-sonet-4-6")
    assert caught.value.suggestions[0] == "claude-sonnet-4-6"
    assert "did you mean claude-sonnet-4-6" in str(caught.value)
    with pytest.raises(UnknownModel) as caught:
        resolve_model("gpt-5.9")
    assert "gpt-5.5" in caught.value.suggestions


def test_unknown_provider_suggests_the_closest_names() -> None:
    with pytest.raises(UnknownModel) as caught:
        resolve_target([ModelChoice(provider="antropic")], {})
    assert caught.value.suggestions == ["anthropic"]


def test_a_model_of_another_provider_is_refused_but_a_gateway_takes_any_name() -> None:
    with pytest.raises(UnknownModel, match="served by 'openai', not 'anthropic'"):
        resolve_model("gpt54", "anthropic")
    assert resolve_model("my-finetune", "vllm") == Target("vllm", "my-finetune")


@pytest.mark.parametrize(
    ("keys", "provider"),
    [
        ({"ANTHROPIC_API_KEY": "a", "OPENAI_API_KEY": "o", "GEMINI_API_KEY": "g"}, "anthropic"),
        ({"OPENAI_API_KEY": "o", "GEMINI_API_KEY": "g"}, "openai"),
        ({"GEMINI_API_KEY": "g"}, "gemini"),
        ({"GOOGLE_API_KEY": "g"}, "gemini"),
        (
            {"ANTHROPIC_API_KEY": "  "},
            "anthropic",
        ),  # blank is unset; none set falls back to the first
        ({}, "anthropic"),
    ],
)
def test_default_provider_follows_the_keys_present(keys: dict[str, str], provider: str) -> None:
    assert default_provider(keys) == provider
    expected = catalogue.PROVIDERS[provider].default_model
    assert resolve_target([None, ModelChoice()], keys) == Target(provider, str(expected))


def test_precedence_the_first_layer_naming_a_model_wins() -> None:
    env = {"OPENAI_API_KEY": "o"}
    node, stylesheet = ModelChoice(model="haiku"), ModelChoice(model="gemini-pro")
    cli, run_config = ModelChoice(model="gpt54", provider="openai"), ModelChoice(model="opus")
    assert resolve_target([node, stylesheet, cli, run_config], env) == Target(
        "anthropic", "claude-haiku-4-5"
    )
    assert resolve_target([None, stylesheet, cli, run_config], env) == Target(
        "gemini", "gemini-3.1-pro-preview"
    )
    assert resolve_target([None, None, cli, run_config], env) == Target("openai", "gpt-5.4")
    assert resolve_target([None, None, None, run_config], env) == Target(
        "anthropic", "claude-opus-4-7"
    )
    # A provider named above the model's layer serves it; one named below does not.
    assert resolve_target(
        [ModelChoice(provider="ollama"), None, ModelChoice(model="qwen3")], env
    ) == Target("ollama", "qwen3")
    assert resolve_target(
        [ModelChoice(model="haiku"), ModelChoice(provider="openai")], env
    ) == Target("anthropic", "claude-haiku-4-5")
    # Only a provider: its default model.
    assert resolve_target([None, ModelChoice(provider="gemini")], env) == Target(
        "gemini", "gemini-3-flash-preview"
    )


def test_a_local_server_needs_a_model_name() -> None:
    with pytest.raises(UnknownModel, match="no default model"):
        resolve_target([ModelChoice(provider="ollama")], {})


def test_fallback_entries_are_providers_models_or_qualified() -> None:
    assert fallback_targets(["gemini", "gpt-5.4", "zai/glm-4.7"]) == [
        Target("gemini", "gemini-3-flash-preview"),
        Target("openai", "gpt-5.4"),
        Target("zai", "glm-4.7"),
    ]


def test_one_catalogue_serves_the_validator_too() -> None:
    for model in catalogue.MODELS:
        assert workflow_catalogue.provider_for_model(model.id) == model.provider
        for alias in model.aliases:
            assert workflow_catalogue.canonical_model(alias) == model.id
    assert set(catalogue.names()) == set(workflow_catalogue.KNOWN_MODELS)
    for info in catalogue.PROVIDERS.values():
        assert info.default_model is None or catalogue.lookup(info.default_model) is not None, (
            info.name
        )


def _price(info: catalogue.ModelInfo) -> float:
    assert info.input_price is not None and info.output_price is not None
    return info.input_price + info.output_price


@pytest.mark.parametrize("name", ["anthropic", "openai", "gemini"])
def test_a_providers_default_model_is_mid_priced_not_its_priciest(name: str) -> None:
    # With one key and no model named, every LLM stage runs on this model: it must not
    # be the most expensive the provider sells (nor its cheapest, weakest one).
    default = catalogue.lookup(catalogue.PROVIDERS[name].default_model or "")
    assert default is not None and default.provider == name
    priced = [m for m in catalogue.MODELS if m.provider == name and m.input_price is not None]
    prices = sorted({_price(m) for m in priced})
    assert prices[0] < _price(default) < prices[-1]
    # Only a key set: that provider's default model serves the run.
    env = {catalogue.PROVIDERS[name].key_env[0]: "k"}
    assert resolve_target([None], env) == Target(name, default.id)
