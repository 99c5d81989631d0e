"""Masking a stream piece by piece gives what masking the whole text gives.

Secrets (values, in raw and JSON-escaped forms, and key shapes) are placed in random
text, which is cut into random pieces; each stream kind's masker (text for the bus's
reply, reasoning and tool-output streams; bytes for files read into git) must give,
joined with its flush, exactly the whole text masked, so no boundary leaves a secret or
a part of one.
"""

from __future__ import annotations

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from fabro_git import redact
from fabro_git.events.bus import EventBus, MemorySink
from fabro_git.events.catalogue import (
    AgentMessage,
    AgentReasoningDelta,
    AgentTextDelta,
    AgentToolCompleted,
    AgentToolOutputDelta,
    TokenUsage,
)

VALUE = "tok-PLANTEDTOKEN5555abcdef"
QUOTED = 'pa"ss\\word-12345'  # JSON escapes it: its escaped form is matched too
REDACTOR = redact.Redactor([VALUE, QUOTED])

SECRETS = [
    VALUE,
    QUOTED,
    json.dumps(QUOTED)[1:-1],  # the JSON-escaped form, as a JSON line holds it
    "sk-ant-api03-" + "aB3_" * 8,
    "ghp_" + "Zx9" * 12,
    "AKIA" + "QWERTY0123456789",
    "ya29." + "t0k-" * 6,
    "xoxb-" + "1234567890-abc",
    "sk-" + "long" * 400,  # longer than the masker holds: held as head and tail
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nIBAAK\n-----END RSA PRIVATE KEY-----",
    *redact.encoded_forms(VALUE),  # hex and base64, as an encoded dump holds it
]
# Filler: words, separators, JSON escapes, quotes; and things that look like the start
# of a key without being one.
FILLER = (
    st.text(alphabet='ab xy-_.\n"\\:k', max_size=30)
    | st.sampled_from(
        [
            "risk-assessment-of-it",
            "sk-short",
            "ghp_",
            "-----BEGIN",
            "AKIA12",
            "\\n",
            "x" * 1500,
            'pa"ss',  # the start of a value, and no more
            VALUE.encode().hex()[:20],
        ]
    )
)
SEPARATOR = st.sampled_from([" ", "\n", ": ", '"', "\\n", "(", ""])


# A key shape that starts inside a word, right before a secret in the same word: the
# shape is left alone and the value inside it is masked all the same.
MID_WORD = st.sampled_from(
    ["risk-" + "x" * 20 + "tok-", "risk-" + "a" * 30, "ask-" + "b" * 1100, "risk-", "xghp_"]
)


@st.composite
def texts(draw: st.DrawFn) -> str:
    parts = []
    for _ in range(draw(st.integers(1, 6))):
        parts.append(draw(FILLER))
        if draw(st.booleans()):
            # A key shape counts only at the start of a word: a separator before it.
            parts.append(draw(SEPARATOR) or " ")
            parts.append(draw(st.sampled_from(SECRETS)))
        elif draw(st.booleans()):
            parts.append(draw(MID_WORD))
            parts.append(draw(st.sampled_from(SECRETS)))
    return "".join(parts)


@st.composite
def chunked(draw: st.DrawFn) -> tuple[str, list[int]]:
    text = draw(texts())
    cuts = draw(st.lists(st.integers(0, len(text)), max_size=12))
    return text, sorted(cuts)


def _pieces(data, cuts):  # type: ignore[no-untyped-def]
    edges = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


@settings(max_examples=400, deadline=None)
@given(chunked())
def test_a_text_stream_joins_to_the_whole_text_masked(case: tuple[str, list[int]]) -> None:
    text, cuts = case
    masker = REDACTOR.stream()
    out = [masker.feed(piece) for piece in _pieces(text, cuts)]
    out.append(masker.flush())
    assert "".join(out) == REDACTOR.mask_text(text)
    assert masker.holding == 0


@settings(max_examples=400, deadline=None)
@given(chunked())
def test_a_byte_stream_joins_to_the_whole_bytes_masked(case: tuple[str, list[int]]) -> None:
    text, _ = case
    data = text.encode()
    cuts = sorted(min(cut * 2, len(data)) for cut in case[1])  # cuts inside characters too
    masker = REDACTOR.stream_bytes()
    out = [masker.feed(piece) for piece in _pieces(data, cuts)]
    out.append(masker.flush())
    assert b"".join(out) == REDACTOR.mask_bytes(data)


@settings(max_examples=100, deadline=None)
@given(chunked(), chunked(), chunked())
def test_the_bus_masks_each_stream_whole(
    reply: tuple[str, list[int]], reasoning: tuple[str, list[int]], output: tuple[str, list[int]]
) -> None:
    """Reply text, reasoning and a tool's output, their pieces interleaved, each joined
    from its events: the whole of it masked (the text stopped at its limit)."""
    sink = MemorySink()
    bus = EventBus("run", [sink], redactor=REDACTOR)
    streams = [
        (AgentTextDelta, _pieces(*reply)),
        (AgentReasoningDelta, _pieces(*reasoning)),
    ]
    while any(pieces for _, pieces in streams):
        for kind, pieces in streams:
            if pieces:
                bus.emit(kind(delta=pieces.pop(0)), stage_id="s1", session_id="a")
    usage = TokenUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    bus.emit(AgentMessage(text="", model="m", usage=usage, tool_call_count=1), stage_id="s1")
    for piece in _pieces(*output):
        bus.emit(AgentToolOutputDelta(delta=piece), stage_id="s1", session_id="a")
    bus.emit(
        AgentToolCompleted(tool_name="shell", tool_call_id="t", output="", is_error=False),
        stage_id="s1",
        session_id="a",
    )

    def joined(kind: type) -> str:
        return "".join(env.properties.delta for env in sink.envelopes if env.event == kind.NAME)

    assert joined(AgentTextDelta) == REDACTOR.mask_text(reply[0])[: AgentTextDelta.STREAM_LIMIT]
    assert joined(AgentReasoningDelta) == REDACTOR.mask_text(reasoning[0])
    assert joined(AgentToolOutputDelta) == REDACTOR.mask_text(output[0])
    assert all(env.properties.delta for env in sink.envelopes if env.event.endswith(".delta"))


def test_a_long_key_is_held_in_short_and_masked_whole() -> None:
    """A key longer than the masker holds: memory stays bounded, the mask is the
    whole key's."""
    key = "sk-" + "k" * 100_000 + "tail"
    masker = REDACTOR.stream()
    out = [masker.feed("a key: ")]
    for start in range(0, len(key), 1000):
        out.append(masker.feed(key[start : start + 1000]))
        assert masker.holding <= redact.RUN_HOLD + 1000
    out.append(masker.feed(" end"))
    out.append(masker.flush())
    assert "".join(out) == "a key: ***tail end"


def test_a_value_inside_a_word_a_key_shape_starts_in_is_masked() -> None:
    """`risk-...` holds the shape `sk-...` mid-word, which is no key and stays; a
    secret value inside that word is masked all the same, whole and streamed."""
    text = f"risk-{'x' * 20}{VALUE}-rest and risk-{'a' * 40} and sk-{'k' * 24}"
    expected = f"risk-{'x' * 20}{redact.mask(VALUE)}-rest and risk-{'a' * 40} and ***kkkk"
    assert REDACTOR.mask_text(text) == expected
    assert REDACTOR.mask_bytes(text.encode()) == expected.encode()
    for size in (1, 7, 64):
        masker = REDACTOR.stream()
        out = [masker.feed(text[i : i + size]) for i in range(0, len(text), size)]
        assert "".join([*out, masker.flush()]) == expected


def test_a_stream_holds_back_only_what_may_begin_a_secret() -> None:
    """Text that can begin no secret goes on at once: a reply streamed word by word is
    shown as it comes, not a secret's length behind. What may still become one waits."""
    masker = REDACTOR.stream()
    assert masker.feed("All done here, the greeting is ") == "All done here, the greeting is "
    assert masker.feed('written: pa"s') == "written: "
    assert masker.holding == len('pa"s')
    assert masker.feed("s\\word-12345 and more ") == "***2345 and more "
    assert masker.flush() == ""
