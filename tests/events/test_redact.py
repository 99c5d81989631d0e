"""The redactor: which values count as secret, and what masking leaves."""

from __future__ import annotations

import json

import pytest

from fabro_git import redact
from fabro_git.events.bus import EventBus, MemorySink
from fabro_git.events.catalogue import CATALOGUE

ANTHROPIC = "sk-ant-api03-" + "a1B2" * 10


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("ANTHROPIC_API_KEY", True),
        ("openai_api_key", True),
        ("GITHUB_TOKEN", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("CLIENT_SECRET", True),
        ("DB_PASSWORD", True),
        ("PASSWORD", True),
        ("MYSQL_ROOT_PASSWORD_FILE", True),
        ("GOOGLE_CREDENTIALS", True),
        ("GH_PAT", True),
        ("GITHUB_TOKEN_2", True),
        ("OPENAI_API_KEYS", True),
        ("API_KEY2", True),
        ("DB_PASS", True),
        ("SERVICE_AUTH", True),
        ("PROXY_AUTH_TOKEN", True),
        ("GIT_AUTHOR_NAME", False),
        ("XAUTHORITY", False),
        ("BYPASS", False),
        ("PASSAGE", False),
        ("PWD", False),
        ("MONKEY", False),
        ("KEYBOARD_LAYOUT", False),
        ("TOKENIZERS_PARALLELISM", False),
        ("HOME", False),
        ("SSH_AUTH_SOCK", False),
    ],
)
def test_secret_names(name: str, secret: bool) -> None:
    assert redact.is_secret_name(name) is secret


def test_short_values_and_other_names_are_not_secrets() -> None:
    env = {"SHORT_KEY": "a", "SEVEN_TOKEN": "1234567", "PATH": "/usr/bin:/bin/long/enough"}
    assert redact.secret_values(env) == []
    masker = redact.from_environ(env)
    assert masker.mask_text("a 1234567 /usr/bin") == "a 1234567 /usr/bin"


def test_environment_values_are_masked_in_text_bytes_and_json() -> None:
    password = 'pa"ss\\word-2024'
    masker = redact.from_environ({"DB_PASSWORD": password, "ANTHROPIC_API_KEY": ANTHROPIC})
    assert masker.mask_text(f"key={ANTHROPIC}!") == "key=***a1B2!"
    assert masker.mask_bytes(f"pw {password}\n".encode()) == b"pw ***2024\n"
    doc = json.dumps({"out": f"DB_PASSWORD={password}\n", "k": [ANTHROPIC]}).encode()
    masked = masker.mask_bytes(doc)
    assert json.loads(masked) == {"out": "DB_PASSWORD=***2024\n", "k": ["***a1B2"]}
    assert masker.mask_value({"a": [password, 3]}) == {"a": ["***2024", 3]}


@pytest.mark.parametrize(
    "key",
    [
        "sk-proj-" + "x9" * 16,
        "sk-" + "Ab3" * 16,
        "ghp_" + "Z8" * 18,
        "gho_" + "Z8" * 18,
        "github_pat_11ABCDEFG0" + "q" * 40,
        "xoxb-123456789012-1234567890123-abcdefghijklmnopqrstuvwx",
        "xoxp-123456789012-abcdef",
        "AKIAIOSFODNN7EXAMPLE",
        "ASIAIOSFODNN7EXAMPLE",
        "glpat-" + "a" * 20,
        "AIza" + "b" * 35,
        "sk_live_" + "c" * 24,
        "hf_" + "d" * 34,
        "npm_" + "e" * 36,
    ],
)
def test_known_key_shapes_are_masked_anywhere(key: str) -> None:
    masker = redact.from_environ({})
    assert masker.mask_text(f"token: {key} end") == f"token: ***{key[-4:]} end"
    # After a JSON escape, as in an encoded multi-line output.
    assert (
        masker.mask_bytes(json.dumps(f"line\n{key}").encode())
        == json.dumps(f"line\n***{key[-4:]}").encode()
    )


def test_prefixes_inside_words_are_left_alone() -> None:
    masker = redact.from_environ({})
    text = "a risk-assessment-of-the-whole-thing and a task-0123456789abcdefghijkl"
    assert masker.mask_text(text) == text
    assert masker.mask_bytes(text.encode()) == text.encode()


def test_the_bus_masks_the_event_every_sink_sees() -> None:
    masker = redact.from_environ({"ANTHROPIC_API_KEY": ANTHROPIC})
    sink = MemorySink()
    bus = EventBus("run1", [sink], redactor=masker)
    props = CATALOGUE["run.notice"](level="info", code="c", message=f"using {ANTHROPIC}")
    bus.emit(props, node_id="n", node_label=f"label {ANTHROPIC}")
    (env,) = sink.envelopes
    assert env.properties.message == "using ***a1B2"  # type: ignore[attr-defined]
    assert env.node_label == "label ***a1B2"
    assert sink.lines[0] == bus.take_segment().rstrip(b"\n")
    assert ANTHROPIC.encode() not in sink.lines[0] and b"***a1B2" in sink.lines[0]
