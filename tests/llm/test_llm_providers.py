"""The provider adapters through the real SDKs, under trio, against the local server.

Each protocol is exercised the same way: Anthropic's Messages API, OpenAI's Responses
API, Gemini's Chat Completions endpoint and a local OpenAI-compatible server (Ollama).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from llm_server import LlmServer, Reply, ToolUse, provider_env

from fabro_git.llm.client import complete
from fabro_git.llm.types import (
    Completed,
    Message,
    OutputStart,
    ReasoningDelta,
    Request,
    Response,
    StreamEvent,
    Target,
    TextDelta,
    ToolCall,
    ToolCallReady,
    ToolResult,
    ToolSpec,
)
from fabro_git.llm.usage import estimate_cost, message_event, stream_event

TARGETS = {
    "anthropic": Target("anthropic", "claude-sonnet-4-6"),
    "openai": Target("openai", "gpt-5.4"),
    "gemini": Target("gemini", "gemini-3.1-pro-preview"),
    "ollama": Target("ollama", "llama3.2"),
}
WIRE = {"anthropic": "anthropic", "openai": "responses", "gemini": "chat", "ollama": "chat"}
KEYS = {"anthropic": "test-anthropic-key", "openai": "test-openai-key", "gemini": "test-gemini-key"}

READ_FILE = ToolSpec(
    name="read_file",
    description="Read a file of the worktree.",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
)


def call(server: LlmServer, target: Target, request: Request) -> tuple[Response, list[StreamEvent]]:
    events: list[StreamEvent] = []

    async def sink(event: StreamEvent) -> None:
        events.append(event)

    async def main() -> Response:
        return await complete(request, target, env=provider_env(server), sink=sink)

    return trio.run(main), events


def ask(text: str, **fields: Any) -> Request:
    return Request(messages=(Message.user(text),), **fields)


@pytest.mark.parametrize("name", list(TARGETS))
def test_text_streams_as_deltas_and_the_request_is_the_providers_own(
    llm_server: LlmServer, name: str
) -> None:
    llm_server.script(Reply(text="the quick brown fox"))
    response, events = call(llm_server, TARGETS[name], ask("say it", system="be brief"))

    assert response.text == "the quick brown fox"
    assert response.stop_reason == "end_turn"
    assert isinstance(events[0], OutputStart) and events[0].target == TARGETS[name]
    deltas = [event.delta for event in events if isinstance(event, TextDelta)]
    assert len(deltas) == 4 and "".join(deltas) == "the quick brown fox"
    assert isinstance(events[-1], Completed) and events[-1].response == response

    [sent] = llm_server.requests
    assert sent.api == WIRE[name]
    assert sent.body["model"] == TARGETS[name].model
    assert sent.body["stream"] is True
    if name in KEYS:
        credentials = sent.headers.get("x-api-key", "") + sent.headers.get("authorization", "")
        assert KEYS[name] in credentials
    if WIRE[name] == "anthropic":
        assert sent.body["system"] == "be brief"
        assert sent.body["messages"] == [{"role": "user", "content": "say it"}]
    elif WIRE[name] == "responses":
        assert sent.body["instructions"] == "be brief"
        assert sent.body["input"] == [{"role": "user", "content": "say it"}]
    else:
        assert sent.body["messages"][0] == {"role": "system", "content": "be brief"}
        assert sent.body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("name", list(TARGETS))
def test_tool_call_round_trip(llm_server: LlmServer, name: str) -> None:
    target = TARGETS[name]
    llm_server.script(
        Reply(
            text="Reading it.",
            tool_calls=(ToolUse("read_file", {"path": "src/a.py"}, id="call_7"),),
        ),
        Reply(text="It defines main."),
    )
    first, events = call(llm_server, target, ask("what is in src/a.py?", tools=(READ_FILE,)))

    assert first.stop_reason == "tool_use"
    [tool_call] = first.tool_calls
    assert (tool_call.id, tool_call.name, tool_call.arguments) == (
        "call_7",
        "read_file",
        {"path": "src/a.py"},
    )
    assert [e.call for e in events if isinstance(e, ToolCallReady)] == [tool_call]

    conversation = (
        Message.user("what is in src/a.py?"),
        first.as_message(),
        Message.tool([ToolResult(tool_call_id="call_7", content="def main(): ...")]),
    )
    second, _ = call(llm_server, target, Request(messages=conversation, tools=(READ_FILE,)))
    assert second.text == "It defines main." and second.tool_calls == ()

    sent_tools, replayed = llm_server.requests[0].body["tools"], llm_server.requests[1].body
    if WIRE[name] == "anthropic":
        assert sent_tools == [
            {
                "name": "read_file",
                "description": READ_FILE.description,
                "input_schema": READ_FILE.parameters,
            }
        ]
        assistant, result = replayed["messages"][1], replayed["messages"][2]
        assert {
            "type": "tool_use",
            "id": "call_7",
            "name": "read_file",
            "input": {"path": "src/a.py"},
        } in assistant["content"]
        assert result == {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "call_7",
                    "content": "def main(): ...",
                    "is_error": False,
                }
            ],
        }
    elif WIRE[name] == "responses":
        assert sent_tools[0]["type"] == "function" and sent_tools[0]["name"] == "read_file"
        assert sent_tools[0]["parameters"] == READ_FILE.parameters
        items = replayed["input"]
        call_item = next(item for item in items if item.get("type") == "function_call")
        assert call_item["call_id"] == "call_7" and json.loads(call_item["arguments"]) == {
            "path": "src/a.py"
        }
        assert {
            "type": "function_call_output",
            "call_id": "call_7",
            "output": "def main(): ...",
        } in items
    else:
        assert sent_tools == [
            {
                "type": "function",
                "function": {
                    "name": "read_file",
                    "description": READ_FILE.description,
                    "parameters": READ_FILE.parameters,
                },
            }
        ]
        assistant = replayed["messages"][1]
        assert assistant["tool_calls"][0]["id"] == "call_7"
        assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {
            "path": "src/a.py"
        }
        assert replayed["messages"][2] == {
            "role": "tool",
            "tool_call_id": "call_7",
            "content": "def main(): ...",
        }


@pytest.mark.parametrize("name", list(TARGETS))
def test_reasoning_streams_as_its_own_deltas(llm_server: LlmServer, name: str) -> None:
    llm_server.script(
        Reply(text="42", reasoning="six times seven", reasoning_tokens=9, output_tokens=20)
    )
    response, events = call(llm_server, TARGETS[name], ask("the answer?", reasoning_effort="high"))

    assert "".join(e.delta for e in events if isinstance(e, ReasoningDelta)) == "six times seven"
    assert response.reasoning == "six times seven" and response.text == "42"
    assert response.usage.reasoning_tokens == 9
    body = llm_server.requests[0].body
    if WIRE[name] == "anthropic":
        # Thinking needs its budget on top of the answer's own allowance.
        assert body["thinking"] == {"type": "enabled", "budget_tokens": 16384}
        assert body["max_tokens"] == 4096 + 16384
        assert response.reasoning_signature == "sig_1"
        # The signed thinking goes back with the next turn, as Anthropic requires.
        follow_up = Request(
            messages=(Message.user("the answer?"), response.as_message(), Message.user("why?"))
        )
        call(llm_server, TARGETS[name], follow_up)
        replayed = llm_server.requests[1].body["messages"][1]["content"][0]
        assert replayed == {"type": "thinking", "thinking": "six times seven", "signature": "sig_1"}
    elif WIRE[name] == "responses":
        assert body["reasoning"] == {"effort": "high", "summary": "auto"}
    else:
        assert body["reasoning_effort"] == "high"


@pytest.mark.parametrize("name", list(TARGETS))
def test_usage_and_cost(llm_server: LlmServer, name: str) -> None:
    llm_server.script(
        Reply(
            text="done",
            input_tokens=1000,
            output_tokens=200,
            cache_read_tokens=400,
            cache_write_tokens=100,
        )
    )
    response, _ = call(llm_server, TARGETS[name], ask("go"))
    usage = response.usage
    if WIRE[name] == "anthropic":
        # Anthropic counts cached input apart; the adapter adds it back.
        assert usage.input_tokens == 1500
        assert (usage.cache_read_tokens, usage.cache_write_tokens) == (400, 100)
    elif WIRE[name] == "responses":
        assert usage.input_tokens == 1000
        assert (usage.cache_read_tokens, usage.cache_write_tokens) == (400, 100)
    else:
        assert usage.input_tokens == 1000 and usage.cache_read_tokens == 400
    assert usage.output_tokens == 200 and usage.total_tokens == usage.input_tokens + 200

    message = message_event(response)
    assert message.usage.input_tokens == usage.input_tokens
    assert message.usage.total_tokens == usage.total_tokens
    assert message.model == TARGETS[name].model and message.tool_call_count == 0

    cost = estimate_cost(TARGETS[name].model, usage)
    if name == "ollama":
        assert cost is None  # a local model has no price
    else:
        assert cost is not None and cost > 0


def test_cost_follows_the_catalogue_prices(llm_server: LlmServer) -> None:
    llm_server.script(Reply(text="x", input_tokens=1_000_000, output_tokens=100_000))
    response, _ = call(llm_server, TARGETS["anthropic"], ask("go"))
    # claude-sonnet-4-6: $3 in, $15 out per million tokens.
    assert estimate_cost("claude-sonnet-4-6", response.usage) == pytest.approx(3.0 + 1.5)


def test_stream_events_map_to_the_agent_events(llm_server: LlmServer) -> None:
    llm_server.script(Reply(text="hi there", reasoning="hmm"))
    _, events = call(llm_server, TARGETS["anthropic"], ask("hello"))
    names = [mapped.NAME for mapped in map(stream_event, events) if mapped is not None]
    assert names == [
        "agent.output.start",
        "agent.reasoning.delta",
        "agent.text.delta",
        "agent.text.delta",
    ]


@pytest.mark.parametrize("name", ["anthropic", "openai", "gemini"])
def test_the_server_also_answers_without_streaming(llm_server: LlmServer, name: str) -> None:
    """The SDKs' plain (non-streaming) calls parse the server's replies, tool call included."""
    import anthropic
    import openai

    llm_server.script(
        Reply(text="plain", tool_calls=(ToolUse("read_file", {"path": "x"}, id="c1"),))
    )
    env = provider_env(llm_server)

    async def main() -> tuple[str, str]:
        if name == "anthropic":
            async with anthropic.AsyncAnthropic(
                api_key="k", base_url=env["ANTHROPIC_BASE_URL"], max_retries=0
            ) as client:
                message = await client.messages.create(
                    model="claude-haiku-4-5",
                    max_tokens=10,
                    messages=[{"role": "user", "content": "hi"}],
                )
            tool = next(block for block in message.content if block.type == "tool_use")
            text = next(block for block in message.content if block.type == "text")
            return text.text, tool.id
        base_url = env["OPENAI_BASE_URL" if name == "openai" else "GEMINI_BASE_URL"]
        async with openai.AsyncOpenAI(api_key="k", base_url=base_url, max_retries=0) as oa:
            if name == "openai":
                response = await oa.responses.create(model="gpt-5.4", input="hi")
                calls = [item for item in response.output if item.type == "function_call"]
                return response.output_text, calls[0].call_id
            completion = await oa.chat.completions.create(
                model="gemini-3-flash-preview", messages=[{"role": "user", "content": "hi"}]
            )
        choice = completion.choices[0].message
        assert choice.tool_calls is not None
        return choice.content or "", choice.tool_calls[0].id

    assert trio.run(main) == ("plain", "c1")


@pytest.mark.parametrize("name", ["anthropic", "openai", "gemini"])
def test_a_reply_allowance_and_effort_reach_each_wire(llm_server: LlmServer, name: str) -> None:
    """A node's `max_tokens` and `reasoning_effort` in each provider's own fields."""
    llm_server.script(Reply(text="ok"))
    call(llm_server, TARGETS[name], ask("go", max_tokens=900, reasoning_effort="high"))
    body = llm_server.requests[0].body
    if WIRE[name] == "anthropic":
        # The thinking budget comes on top of the answer's own 900.
        assert body["thinking"]["type"] == "enabled"
        assert body["max_tokens"] == 900 + body["thinking"]["budget_tokens"]
    elif WIRE[name] == "responses":
        assert (body["reasoning"]["effort"], body["max_output_tokens"]) == ("high", 900)
    else:
        assert (body["reasoning_effort"], body["max_tokens"]) == ("high", 900)


def test_anthropic_thinking_before_a_tool_call_goes_back_first_in_its_turn(
    llm_server: LlmServer,
) -> None:
    """With thinking on, a tool round's assistant turn must open with its signed thinking
    block, or Anthropic refuses the request."""
    llm_server.script(
        Reply(
            text="",
            reasoning="first look at the file",
            tool_calls=(ToolUse("read_file", {"path": "a.py"}, id="r1"),),
        ),
        Reply(text="Looked."),
    )
    question = Message.user("look")
    first, _ = call(
        llm_server,
        TARGETS["anthropic"],
        Request(messages=(question,), tools=(READ_FILE,), reasoning_effort="low"),
    )
    conversation = (
        question,
        first.as_message(),
        Message.tool([ToolResult(tool_call_id="r1", content="print(1)")]),
    )
    call(
        llm_server,
        TARGETS["anthropic"],
        Request(messages=conversation, tools=(READ_FILE,), reasoning_effort="low"),
    )
    turn = llm_server.requests[1].body["messages"][1]
    assert turn["role"] == "assistant"
    assert turn["content"][0] == {
        "type": "thinking",
        "thinking": "first look at the file",
        "signature": "sig_1",
    }
    assert turn["content"][-1]["type"] == "tool_use" and turn["content"][-1]["id"] == "r1"


def test_gemini_gets_its_signed_call_back_signed_and_a_foreign_call_the_stand_in(
    llm_server: LlmServer,
) -> None:
    """Gemini 3 signs each tool call and refuses one sent back without its signature (the
    local server does too); a call another provider made carries the stand-in value
    Google documents for a conversation begun elsewhere."""
    gemini = TARGETS["gemini"]
    llm_server.script(
        Reply(
            text="",
            tool_calls=(
                ToolUse("read_file", {"path": "a.py"}, id="g1", thought_signature="sig-g1"),
            ),
        ),
        Reply(text="Read it."),
        Reply(text="Carried on."),
    )
    question = Message.user("look")
    first, _ = call(llm_server, gemini, Request(messages=(question,), tools=(READ_FILE,)))
    signed = (
        question,
        first.as_message(),
        Message.tool([ToolResult(tool_call_id="g1", content="print(1)")]),
    )
    second, _ = call(llm_server, gemini, Request(messages=signed, tools=(READ_FILE,)))
    assert second.text == "Read it."
    [sent] = llm_server.requests[1].body["messages"][1]["tool_calls"]
    assert sent["extra_content"] == {"google": {"thought_signature": "sig-g1"}}

    foreign = (
        question,
        Message(
            role="assistant",
            tool_calls=(ToolCall(id="a1", name="read_file", arguments={"path": "a.py"}),),
        ),
        Message.tool([ToolResult(tool_call_id="a1", content="print(1)")]),
    )
    third, _ = call(llm_server, gemini, Request(messages=foreign, tools=(READ_FILE,)))
    assert third.text == "Carried on."
    [sent] = llm_server.requests[2].body["messages"][1]["tool_calls"]
    assert sent["extra_content"] == {
        "google": {"thought_signature": "skip_thought_signature_validator"}
    }
