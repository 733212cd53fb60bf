"""Real servers beyond the recorded fixtures: OpenAI-compatible servers (vLLM, llama.cpp,
Ollama, OpenRouter, Azure), Anthropic's newer blocks and events, Gemini's safety endings.
Each stream is written inline and served over loopback HTTP to the real adapter."""

from __future__ import annotations

from typing import Any

import pytest

from fsm.engine.provider import KeepAlive, ReasoningDelta, TextDelta, ToolCallRequest

from providers_support import anthropic_sse, run, sse


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    """One Chat Completions chunk, without the `id` some servers leave out."""
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }


# --- OpenAI-compatible -------------------------------------------------------------------


@pytest.mark.asyncio
async def test_vllm_without_usage_and_without_ids() -> None:
    """covers S8: vLLM without stream_options sends no usage; chunks carry no ids."""
    script = sse(
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hi"}),
        chunk({}, "stop"),
        "[DONE]",
    )
    _, summary, _ = await run("openai", script)
    assert summary.as_json()["usage"] is None
    assert (summary.as_json()["text"], summary.finish_reason, summary.error) == ("Hi", "stop", None)


@pytest.mark.asyncio
async def test_llamacpp_finish_stop_with_tool_calls() -> None:
    """covers T4, T7: llama.cpp says `finish_reason: "stop"` after tool calls; the calls are
    still delivered (whole, in one fragment, id minted when absent) after the text."""
    call = {"index": 0, "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}}
    script = sse(
        chunk({"content": "One moment."}),
        chunk({"tool_calls": [call]}),
        chunk({}, "stop"),
        "[DONE]",
    )
    events, summary, _ = await run("openai", script)
    assert summary.finish_reason == "stop"
    [tool] = summary.tool_calls
    assert (tool.name, tool.arguments, tool.truncated) == ("get_time", {"tz": "UTC"}, False)
    assert tool.id and tool.id.startswith("call_")
    assert events.index(tool) > events.index(TextDelta("One moment."))


@pytest.mark.asyncio
async def test_ollama_without_done_with_usage_in_the_finishing_chunk() -> None:
    """covers S8: Ollama /v1 may close without [DONE] and put usage in the choice chunk."""
    usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    script = sse(chunk({"content": "Hello"}), chunk({}, "stop", usage=usage))
    _, summary, _ = await run("openai", script)
    result = summary.as_json()
    assert (result["text"], result["finish_reason"], result["error"]) == ("Hello", "stop", None)
    assert result["usage"] == {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}


@pytest.mark.asyncio
async def test_ollama_parallel_calls_that_all_say_index_0() -> None:
    """covers T4: two complete calls that reuse index 0 but have distinct ids stay two calls."""
    first = {"id": "call_a", "index": 0, "function": {"name": "a", "arguments": '{"x": 1}'}}
    second = {"id": "call_b", "index": 0, "function": {"name": "b", "arguments": '{"y": 2}'}}
    script = sse(
        chunk({"tool_calls": [first]}), chunk({"tool_calls": [second]}), chunk({}, "tool_calls")
    )
    _, summary, _ = await run("openai", script)
    assert [(c.id, c.name, c.arguments) for c in summary.tool_calls] == [
        ("call_a", "a", {"x": 1}),
        ("call_b", "b", {"y": 2}),
    ]


@pytest.mark.asyncio
async def test_tool_call_fragments_without_index() -> None:
    """covers T4: a server that omits `index` is followed by id, then by position."""
    script = sse(
        chunk({"tool_calls": [{"id": "call_1", "function": {"name": "f", "arguments": '{"a"'}}]}),
        chunk({"tool_calls": [{"function": {"arguments": ": 1}"}}]}),
        chunk({}, "tool_calls"),
        "[DONE]",
    )
    _, summary, _ = await run("openai", script)
    assert [(c.id, c.arguments) for c in summary.tool_calls] == [("call_1", {"a": 1})]


@pytest.mark.asyncio
async def test_openrouter_error_chunk_with_integer_code() -> None:
    """covers S8, G1: OpenRouter reports an upstream failure in-band with an integer code;
    the text before it is kept and the error is retryable."""
    error_chunk = {
        "id": "gen-1",
        "object": "chat.completion.chunk",
        "error": {"code": 502, "message": "Provider returned error", "metadata": {"raw": "x"}},
        "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}],
    }
    script = b": OPENROUTER PROCESSING\n\n" + sse(chunk({"content": "Part"}), error_chunk)
    events, summary, _ = await run("openai", script)
    assert isinstance(events[0], KeepAlive)
    assert "".join(summary.text) == "Part"
    assert summary.error is not None
    assert (summary.error.kind, summary.error.status, summary.error.retryable) == (
        "provider_stream_error",
        502,
        True,
    )
    assert summary.error.message == "Provider returned error"
    assert summary.finish_reason is None


@pytest.mark.asyncio
async def test_reasoning_fields_are_kept_apart_from_the_reply() -> None:
    """covers S4: `reasoning_content` (vLLM, llama.cpp) and `reasoning` (OpenRouter, Ollama)
    are thinking text; an empty content delta is not a token."""
    script = sse(
        chunk({"reasoning_content": "Let me think. "}),
        chunk({"reasoning": "Done.", "content": ""}),
        chunk({"content": "Answer"}),
        chunk({}, "stop"),
        "[DONE]",
    )
    events, _, _ = await run("openai", script)
    assert [e for e in events if isinstance(e, ReasoningDelta)] == [
        ReasoningDelta("Let me think. "),
        ReasoningDelta("Done."),
    ]
    assert [e for e in events if isinstance(e, TextDelta)] == [TextDelta("Answer")]


@pytest.mark.asyncio
async def test_length_stop_cuts_the_last_tool_call() -> None:
    """covers T4: a `length` stop in the middle of a call's arguments yields a truncated call
    that must never run; a complete call before it is intact."""
    done = {"index": 0, "id": "c0", "function": {"name": "a", "arguments": "{}"}}
    cut = {"index": 1, "id": "c1", "function": {"name": "b", "arguments": '{"q": "par'}}
    script = sse(chunk({"tool_calls": [done, cut]}), chunk({}, "length"), "[DONE]")
    _, summary, _ = await run("openai", script)
    assert [(c.name, c.truncated) for c in summary.tool_calls] == [("a", False), ("b", True)]
    assert summary.tool_calls[1].raw_arguments == '{"q": "par'


UNREADABLE_ARGUMENTS = ('{"n": ' + "7" * 5000 + "}", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
"""Arguments JSON allows but Python will not read: an integer past the interpreter's digit
limit, nesting past its recursion limit."""


@pytest.mark.asyncio
@pytest.mark.parametrize("arguments", UNREADABLE_ARGUMENTS, ids=["huge-integer", "deep-nesting"])
async def test_arguments_python_cannot_read_are_a_call_that_never_runs(arguments: str) -> None:
    """covers T4: a call whose arguments cannot be read is marked as such and never runs;
    the stream goes on and the pass ends as the server said, whatever the arguments hold."""
    calls = [{"index": 0, "id": "c0", "function": {"name": "roll", "arguments": arguments}},
             {"index": 1, "id": "c1", "function": {"name": "time", "arguments": "{}"}}]
    script = sse(chunk({"tool_calls": calls}), chunk({}, "tool_calls"), "[DONE]")
    _, summary, _ = await run("openai", script)
    assert summary.error is None and summary.finish_reason == "tool_calls"
    assert [(c.name, c.truncated, c.arguments) for c in summary.tool_calls] == [
        ("roll", True, {}), ("time", False, {})]
    assert summary.tool_calls[0].raw_arguments == arguments


@pytest.mark.asyncio
async def test_azure_prompt_filter_chunk_and_content_filter_finish() -> None:
    """covers S8: Azure opens with a choices-less filter chunk, and a `content_filter` finish
    is reported as a block."""
    script = sse(
        {"choices": [], "prompt_filter_results": [{"prompt_index": 0}]},
        chunk({"content": "Some"}),
        chunk({}, "content_filter"),
        "[DONE]",
    )
    _, summary, _ = await run("openai", script)
    assert "".join(summary.text) == "Some"
    assert summary.error is not None
    assert (summary.error.kind, summary.error.type) == ("blocked", "content_filter")


# --- Anthropic -----------------------------------------------------------------------------


def _message_start(input_tokens: int = 10) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {"id": "msg_1", "usage": {"input_tokens": input_tokens, "output_tokens": 1}},
    }


@pytest.mark.asyncio
async def test_anthropic_thinking_blocks_and_unknown_event_types() -> None:
    """covers S4: thinking is reasoning, not reply; signature deltas, redacted thinking and
    event types invented after this code was written are ignored."""
    script = anthropic_sse(
        _message_start(),
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "thinking", "thinking": ""},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "Consider the user."},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "signature_delta", "signature": "EqQBCgIYAhIM"},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "redacted_thinking", "data": "abc"},
        },
        {"type": "content_block_stop", "index": 1},
        {"type": "future_event_type", "payload": {"anything": True}},
        {"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": ""}},
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "citations_delta", "citation": {}},
        },
        {"type": "content_block_delta", "index": 2, "delta": {"type": "text_delta", "text": "Hi!"}},
        {"type": "content_block_stop", "index": 2},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 20},
        },
        {"type": "message_stop"},
    )
    _, summary, _ = await run("anthropic", script)
    assert summary.as_json() == {
        "text": "Hi!",
        "reasoning": "Consider the user.",
        "tool_calls": [],
        "finish_reason": "end_turn",
        "usage": {"input_tokens": 10, "output_tokens": 20},
        "error": None,
    }


@pytest.mark.asyncio
async def test_anthropic_max_tokens_cutting_tool_json_is_truncated() -> None:
    """covers T4: `max_tokens` ends the message inside a tool_use's JSON: the call arrives
    marked truncated (never to run) with the raw fragment kept."""
    script = anthropic_sse(
        _message_start(),
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": "Writing the file."},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "write", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"path": "a.txt", "body": "lo'},
        },
        {"type": "content_block_stop", "index": 1},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "max_tokens"},
            "usage": {"output_tokens": 4096},
        },
        {"type": "message_stop"},
    )
    _, summary, _ = await run("anthropic", script)
    [call] = summary.tool_calls
    assert (call.id, call.name, call.truncated) == ("toolu_1", "write", True)
    assert call.raw_arguments == '{"path": "a.txt", "body": "lo'
    assert summary.finish_reason == "max_tokens"


@pytest.mark.asyncio
async def test_anthropic_max_tokens_right_after_tool_start_is_truncated() -> None:
    """covers T4: cut before any argument text arrived: the empty input must not pass for a
    call without arguments."""
    script = anthropic_sse(
        _message_start(),
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "toolu_2", "name": "write", "input": {}},
        },
        {
            "type": "message_delta",
            "delta": {"stop_reason": "max_tokens"},
            "usage": {"output_tokens": 1},
        },
        {"type": "message_stop"},
    )
    _, summary, _ = await run("anthropic", script)
    assert [(c.name, c.truncated) for c in summary.tool_calls] == [("write", True)]


@pytest.mark.asyncio
async def test_anthropic_tool_without_arguments_is_complete() -> None:
    """covers T4: a finished call with no argument text is `{}`, not truncated."""
    script = anthropic_sse(
        _message_start(),
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "toolu_3", "name": "now", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": ""},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use"},
            "usage": {"output_tokens": 9},
        },
        {"type": "message_stop"},
    )
    _, summary, _ = await run("anthropic", script)
    [call] = summary.tool_calls
    assert (call.arguments, call.truncated) == ({}, False)


# --- Gemini -----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_gemini_blocked_prompt() -> None:
    """covers S8: a prompt blocked before any candidate is a `blocked` error, not an empty
    reply."""
    script = sse(
        {
            "promptFeedback": {"blockReason": "PROHIBITED_CONTENT"},
            "usageMetadata": {"promptTokenCount": 9, "totalTokenCount": 9},
        },
        eol="\r\n",
    )
    _, summary, _ = await run("gemini", script)
    assert summary.error is not None
    assert (summary.error.kind, summary.error.type) == ("blocked", "PROHIBITED_CONTENT")
    assert summary.as_json()["usage"] == {"input_tokens": 9, "total_tokens": 9}


@pytest.mark.asyncio
async def test_gemini_safety_finish_after_some_text() -> None:
    """covers S8, S13: a SAFETY finish mid-answer keeps the text and reports a block."""
    script = sse(
        {"candidates": [{"content": {"role": "model", "parts": [{"text": "Once upon"}]}}]},
        {
            "candidates": [
                {
                    "content": {"role": "model", "parts": [{"text": ""}]},
                    "finishReason": "SAFETY",
                    "safetyRatings": [
                        {"category": "HARM_CATEGORY_HARASSMENT", "probability": "HIGH"}
                    ],
                }
            ]
        },
        eol="\r\n",
    )
    _, summary, _ = await run("gemini", script)
    assert "".join(summary.text) == "Once upon"
    assert summary.error is not None
    assert (summary.error.kind, summary.error.type) == ("blocked", "SAFETY")
    assert summary.finish_reason == "SAFETY"  # the provider's word is kept beside the block


@pytest.mark.asyncio
async def test_gemini_parallel_function_calls_get_distinct_ids() -> None:
    """covers T4, T7: parallel calls in one chunk each get their own minted id; thought
    parts are reasoning."""
    parts = [
        {"text": "Planning.", "thought": True},
        {"functionCall": {"name": "a", "args": {"n": 1}}, "thoughtSignature": "c2ln"},
        {"functionCall": {"name": "b", "args": {}}},
        {"functionCall": {"name": "a", "args": {"n": 2}}},
    ]
    script = sse(
        {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP"}]},
        eol="\r\n",
    )
    events, summary, _ = await run("gemini", script)
    calls = [e for e in events if isinstance(e, ToolCallRequest)]
    assert [(c.name, c.arguments) for c in calls] == [("a", {"n": 1}), ("b", {}), ("a", {"n": 2})]
    assert len({c.id for c in calls}) == 3
    assert all(c.id and not c.truncated for c in calls)
    assert summary.as_json()["reasoning"] == "Planning."


@pytest.mark.asyncio
async def test_gemini_malformed_function_call_is_a_retryable_error() -> None:
    """covers S8, G1: MALFORMED_FUNCTION_CALL is a failed reply worth retrying."""
    script = sse(
        {"candidates": [{"content": {"parts": []}, "finishReason": "MALFORMED_FUNCTION_CALL"}]}
    )
    _, summary, _ = await run("gemini", script)
    assert summary.error is not None
    assert (summary.error.type, summary.error.retryable) == ("MALFORMED_FUNCTION_CALL", True)
