"""Tool-call arguments as the adapters read them: whatever text a model sends, the call
comes out storable, and arguments that are not one JSON object are marked unreadable
(the agent answers them with a tool error) instead of failing the stage."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from fabro_git.llm.errors import StreamDropped
from fabro_git.llm.providers import tool_call, translate
from fabro_git.llm.types import Target


def test_a_json_object_is_read() -> None:
    call = tool_call("c1", "read_file", '{"path": "a.txt"}')
    assert call.arguments == {"path": "a.txt"} and call.unreadable is None
    assert tool_call("c1", "t", "  ").arguments == {}
    assert tool_call("c1", "t", "[1]").arguments == {"value": [1]}


def test_undecodable_arguments_are_marked_not_raised() -> None:
    for raw in ('{"path": "\\udc80"}', '{"path": "\udc80"}', '{"path": "a', "not json"):
        call = tool_call("c1", "read_file", raw)
        assert call.arguments == {}
        assert call.unreadable, raw
        msgspec.json.encode(call)  # storable in events and checkpoints


def test_a_lone_surrogate_in_a_name_or_id_is_escaped() -> None:
    call = tool_call("c\udc80", "read\udc80file", "{}")
    assert call.name == "read\\udc80file" and call.id == "c\\udc80"


@given(st.text(), st.text(max_size=20))
def test_any_text_makes_a_storable_call(raw: str, name: str) -> None:
    call = tool_call("c1", name, raw)
    msgspec.json.encode(call)
    assert (call.unreadable is None) or call.arguments == {}


def test_a_stream_that_is_not_utf8_is_a_dropped_stream() -> None:
    exc = UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
    translated = translate(exc, Target("anthropic", "claude-sonnet-4-6"), streaming=True)
    assert isinstance(translated, StreamDropped)
    assert "not UTF-8" in str(translated)
