"""The offline model catalogue behind `stylesheet_model_known`."""

from __future__ import annotations

import pytest

from fabro_git.workflow.catalogue import KNOWN_MODELS, canonical_model, provider_for_model


@pytest.mark.parametrize(
    ("model", "provider"),
    [
        ("claude-sonnet-4-5", "anthropic"),
        ("claude-opus-4-1", "anthropic"),
        ("claude-haiku-4-5", "anthropic"),
        ("gpt-5", "openai"),
        ("gpt-5.2-codex", "openai"),
        ("o3", "openai"),
        ("gemini-2.5-pro", "gemini"),
        ("opus", "anthropic"),
        ("gemini-flash", "gemini"),
        ("openai/some-future-model", "openai"),
        ("claude-sonnet-9", None),
        ("nobody/gpt-5", None),
    ],
)
def test_provider_for_model(model: str, provider: str | None) -> None:
    assert provider_for_model(model) == provider


def test_aliases_are_known_and_resolve_to_known_ids() -> None:
    assert {"opus", "sonnet", "haiku", "gpt-5.2", "gemini-2.5-flash"} <= KNOWN_MODELS
    assert canonical_model("sonnet") == "claude-sonnet-4-6"
    assert canonical_model("gpt-5") == "gpt-5"
    for name in KNOWN_MODELS:
        assert provider_for_model(name) is not None, name
