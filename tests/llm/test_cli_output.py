"""Reading agent CLIs' machine output: each profile's reply text, usage and errors."""

from __future__ import annotations

import json

from fabro_git.llm.cli import invocation, parse_output


def _lines(*objects: dict) -> bytes:
    return "".join(json.dumps(o) + "\n" for o in objects).encode()


def test_claude_stream_json_takes_the_result_line_and_counts_tool_uses() -> None:
    out = _lines(
        {"type": "system", "subtype": "init", "session_id": "s"},
        {"type": "assistant", "message": {"content": [{"type": "tool_use", "name": "Edit"}]}},
        {"type": "assistant", "message": {"content": [{"type": "text", "text": "Done."}]}},
        {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "result": "Done.",
            "total_cost_usd": 0.5,
            "usage": {"input_tokens": 10, "cache_read_input_tokens": 90, "output_tokens": 5},
        },
    )
    reply = parse_output("claude-json", out)
    assert reply.text == "Done." and reply.error is None and reply.tool_calls == 1
    assert reply.usage is not None and reply.usage.input_tokens == 100
    assert reply.usage.cache_read_tokens == 90 and reply.cost == 0.5


def test_claude_error_result_is_an_error() -> None:
    out = _lines({"type": "result", "subtype": "error_max_turns", "is_error": True})
    assert "error_max_turns" in (parse_output("claude-json", out).error or "")


def test_codex_takes_the_last_agent_message_and_sums_turns() -> None:
    out = _lines(
        {"type": "item.completed", "item": {"type": "agent_message", "text": "first"}},
        {"type": "turn.completed", "usage": {"input_tokens": 5, "output_tokens": 1}},
        {"type": "item.completed", "item": {"type": "command_execution", "command": "ls"}},
        {"type": "item.completed", "item": {"type": "agent_message", "text": "last"}},
        {"type": "turn.completed", "usage": {"input_tokens": 7, "output_tokens": 2}},
    )
    reply = parse_output("codex-jsonl", out)
    assert reply.text == "last" and reply.tool_calls == 1
    assert reply.usage is not None and reply.usage.input_tokens == 12


def test_json_lines_are_cut_at_newlines_alone() -> None:
    """A CLI in JavaScript or Rust leaves U+2028 and U+0085 raw in its JSON strings."""
    text = "one\u2028two\x85three"
    out = "".join(
        json.dumps(o, ensure_ascii=False) + "\n"
        for o in (
            {"type": "item.completed", "item": {"type": "agent_message", "text": text}},
            {"type": "turn.completed", "usage": {"input_tokens": 1, "output_tokens": 1}},
        )
    ).encode()
    assert parse_output("codex-jsonl", out).text == text
    claude = "".join(
        json.dumps(o, ensure_ascii=False) + "\n"
        for o in ({"type": "system"}, {"type": "result", "is_error": False, "result": text})
    ).encode()
    assert parse_output("claude-json", claude).text == text


def test_codex_turn_failed_without_a_message_is_an_error() -> None:
    out = _lines({"type": "turn.failed", "error": {"message": "quota exceeded"}})
    assert parse_output("codex-jsonl", out).error == "codex: quota exceeded"


def test_gemini_error_and_garbage_output_are_errors() -> None:
    out = _lines({"error": {"type": "ApiError", "message": "bad key"}})
    assert parse_output("gemini-json", out).error == "gemini: bad key"
    garbage = parse_output("gemini-json", b"Loaded cached credentials.\n")
    assert garbage.error is not None and "Loaded cached credentials" in garbage.error


def test_text_output_is_the_reply_and_placeholders_fill_whole_items() -> None:
    assert parse_output("text", b"  hello\n").text == "hello"
    call = invocation(
        "anthropic",
        model=None,
        prompt="$(rm -rf /) {model} {node_id}",
        prompt_file="/tmp/p.md",
        worktree="/w",
        node_id="n",
        custom=["tool", "--in={prompt_file}", "{prompt}", "{model}"],
    )
    assert call.argv == ["tool", "--in=/tmp/p.md", "$(rm -rf /) {model} {node_id}", ""]
