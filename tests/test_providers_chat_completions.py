"""What a Chat Completions stream's less common shapes make of the turn (issue 29's mutation
run over providers/openai.py): which choice's text reaches the user, which error a turn
ends with when the server reports one in band or sends a chunk of the wrong shape, and what
a stream cut after `[DONE]` says. Each stream is served over loopback HTTP to the real
adapter."""

from __future__ import annotations

from typing import Any

import pytest

from providers.replay_server import ReplayServer

from providers_support import collect, run, sse

pytestmark = pytest.mark.asyncio


def choice(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"delta": delta, "finish_reason": finish, **extra}


async def test_only_the_first_choice_reaches_the_user() -> None:
    """covers S8: a server asked for one choice may still stream others (`n` > 1, some
    proxies); only choice 0's text is the reply, whichever order the choices come in."""
    script = sse(
        {"choices": [choice({"content": "other "}, index=1), choice({"content": "Hi"}, index=0)]},
        {"choices": [choice({"content": " there"}, index=0), choice({}, "stop", index=1)]},
        {"choices": [choice({}, "stop", index=0)]},
        "[DONE]",
    )
    _, summary, _ = await run("openai", script)
    assert ("".join(summary.text), summary.finish_reason, summary.error) == ("Hi there", "stop",
                                                                            None)


async def test_a_choice_without_an_index_is_the_first() -> None:
    """covers S8: servers that leave out `index` on their only choice are still read."""
    script = sse({"choices": [choice({"content": "Hello"})]},
                 {"choices": [choice({}, "stop")]}, "[DONE]")
    _, summary, _ = await run("openai", script)
    assert ("".join(summary.text), summary.finish_reason, summary.error) == ("Hello", "stop", None)


@pytest.mark.parametrize(("end", "message"), [
    (("[DONE]",), "stream ended before a finish reason ([DONE] came without one)"),
    ((), "stream ended before a finish reason"),
])
async def test_an_end_without_a_finish_reason_says_which(end: tuple[str, ...],
                                                         message: str) -> None:
    """covers S8, S13: `[DONE]` or a clean close with no finish reason before it is an
    incomplete stream (the reply may be cut), and the operator reads which of the two
    happened."""
    _, summary, _ = await run("openai", sse({"choices": [choice({"content": "cut"})]}, *end))
    assert "".join(summary.text) == "cut" and summary.finish_reason is None
    assert summary.error is not None and summary.error.type == "incomplete_stream"
    assert summary.error.message == message


async def test_an_in_band_error_object_keeps_its_message_and_type() -> None:
    """covers S8: OpenRouter's `data: {"error": {...}}` after HTTP 200 ends the turn with the
    provider's own message and type, not a generic one."""
    script = sse({"choices": [choice({"content": "Par"})]},
                 {"error": {"message": "Upstream overloaded", "type": "server_error",
                            "code": 502}})
    _, summary, _ = await run("openai", script)
    assert "".join(summary.text) == "Par"
    assert summary.error is not None and summary.error.kind == "provider_stream_error"
    assert "Upstream overloaded" in summary.error.message


async def test_an_error_flag_beside_its_message_keeps_the_message() -> None:
    """covers S8: a gateway's `{"error": true, "message": ...}` (no error object) still
    ends the turn with that message."""
    _, summary, _ = await run("openai", sse({"error": True, "message": "quota exhausted"}))
    assert summary.error is not None and summary.error.message == "quota exhausted"


async def test_choices_that_are_not_a_list_end_the_turn_with_a_clear_error() -> None:
    """covers S8: a chunk whose `choices` is an object is a malformed stream, reported as
    such, never read as an empty chunk."""
    script = sse({"choices": {"index": 0, "delta": {"content": "x"}}},
                 {"choices": [choice({}, "stop")]}, "[DONE]")
    _, summary, _ = await run("openai", script)
    assert summary.error is not None
    assert (summary.error.kind, summary.error.type) == ("provider_stream_error",
                                                        "malformed_event")
    assert "not a list" in summary.error.message


async def test_a_refusal_reaches_the_user_as_the_reply() -> None:
    """covers S8: OpenAI streams a model's refusal in `delta.refusal`, not `content`; the
    user reads it as the reply instead of getting an empty one."""
    script = sse({"choices": [choice({"refusal": "I can't help with that."})]},
                 {"choices": [choice({}, "stop")]}, "[DONE]")
    _, summary, _ = await run("openai", script)
    assert ("".join(summary.text), summary.error) == ("I can't help with that.", None)


async def test_a_trailing_empty_finish_reason_leaves_the_reply_complete() -> None:
    """covers P6, P7: the first finish reason is the one that counts; a usage chunk after it
    that says `finish_reason: ""` (some proxies) neither replaces it nor loses the usage."""
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    script = sse({"choices": [choice({"content": "Done."}, "stop")]},
                 {"choices": [choice({}, "", index=0)], "usage": usage}, "[DONE]")
    _, summary, _ = await run("openai", script)
    assert ("".join(summary.text), summary.finish_reason, summary.error) == ("Done.", "stop",
                                                                            None)
    assert summary.as_json()["usage"] == {"input_tokens": 3, "output_tokens": 1,
                                          "total_tokens": 4}


@pytest.mark.parametrize("repeated", [{"name": ""}, {"name": "get_time", "id": ""},
                                      {"name": "get_time"}, {"name": "get_time", "id": "call_t1"}])
async def test_empty_names_and_ids_on_later_deltas_keep_one_call(
        repeated: dict[str, str]) -> None:
    """covers T4: servers that repeat `name` and `id` on every delta, empty after the first,
    still make one call with its arguments and id, never a second call without them."""
    first = {"index": 0, "id": "call_t1", "type": "function",
             "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}}
    later = {"index": 0, "id": repeated.get("id"), "type": "function",
             "function": {"name": repeated["name"], "arguments": ""}}
    script = sse({"choices": [choice({"tool_calls": [first]})]},
                 {"choices": [choice({"tool_calls": [later]})]},
                 {"choices": [choice({}, "tool_calls")]}, "[DONE]")
    _, summary, _ = await run("openai", script)
    [call] = summary.tool_calls
    assert (call.name, call.arguments, call.id, call.truncated) == ("get_time", {"tz": "UTC"},
                                                                    "call_t1", False)


async def test_parallel_calls_streamed_interleaved_stay_apart() -> None:
    """covers T4: two calls of one function streamed at indexes 0 and 1 with their argument
    fragments interleaved are two whole calls, each with its own arguments."""
    def part(index: int, arguments: str, call_id: str | None = None) -> dict[str, Any]:
        head = {"id": call_id, "function": {"name": "get_weather", "arguments": arguments}} \
            if call_id else {"function": {"arguments": arguments}}
        return {"choices": [choice({"tool_calls": [{"index": index, **head}]})]}

    script = sse(part(0, '{"city": ', "call_a"), part(1, '{"city": ', "call_b"),
                 part(0, '"Oslo"}'), part(1, '"Rome"}'),
                 {"choices": [choice({}, "tool_calls")]}, "[DONE]")
    _, summary, _ = await run("openai", script)
    assert [(c.id, c.arguments, c.truncated) for c in summary.tool_calls] == [
        ("call_a", {"city": "Oslo"}, False), ("call_b", {"city": "Rome"}, False)]


async def test_an_index_that_is_not_a_number_counts_as_none() -> None:
    # covers T4: a gateway that writes a call's `index` as a string ("0") or `true` on some
    # deltas and leaves it off others: an index that is not a number is read as no index,
    # so the calls are followed by their names, as for a server that sends none, and each
    # runs whole with its own arguments
    def part(index: object, call: dict[str, Any]) -> dict[str, Any]:
        head = {} if index is None else {"index": index}
        return {"choices": [choice({"tool_calls": [{**head, **call}]})]}

    script = sse(part("0", {"id": "call_a", "function": {"name": "get_weather",
                                                         "arguments": '{"city": '}}),
                 part(None, {"function": {"arguments": '"Oslo"}'}}),
                 part("1", {"id": "call_b", "function": {"name": "get_time",
                                                         "arguments": '{"zone": '}}),
                 part(True, {"function": {"arguments": '"CET"}'}}),
                 {"choices": [choice({}, "tool_calls")]}, "[DONE]")
    _, summary, _ = await run("openai", script)
    assert [(c.id, c.name, c.arguments, c.truncated) for c in summary.tool_calls] == [
        ("call_a", "get_weather", {"city": "Oslo"}, False),
        ("call_b", "get_time", {"zone": "CET"}, False)]


async def test_a_call_whose_name_never_came_has_an_empty_name() -> None:
    """covers T4: a call delta that never names its function still becomes a call (with an
    empty name, which the engine answers as an unknown tool), never a name of null."""
    call = {"index": 0, "id": "call_x", "function": {"arguments": "{}"}}
    script = sse({"choices": [choice({"tool_calls": [call]})]},
                 {"choices": [choice({}, "tool_calls")]}, "[DONE]")
    _, summary, _ = await run("openai", script)
    [tool] = summary.tool_calls
    assert (tool.name, tool.arguments, tool.id) == ("", {}, "call_x")


@pytest.mark.parametrize("reason", ["length", "model_length"])
async def test_a_length_stop_marks_only_the_last_call_cut(reason: str) -> None:
    """covers T4, P6: the output limit (`length`) or Mistral's filled context window
    (`model_length`) while calls streamed: the last call may have been cut even though its
    arguments parse, so it never runs; the calls before it do, and the turn is not an
    error."""
    first = {"index": 0, "id": "call_a",
             "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    second = {"index": 1, "id": "call_b",
              "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
    script = sse({"choices": [choice({"tool_calls": [first]})]},
                 {"choices": [choice({"tool_calls": [second]})]},
                 {"choices": [choice({}, reason)]}, "[DONE]")
    _, summary, _ = await run("openai", script)
    assert [(c.id, c.truncated) for c in summary.tool_calls] == [("call_a", False),
                                                                 ("call_b", True)]
    assert (summary.finish_reason, summary.error) == (reason, None)


async def test_calls_of_one_function_at_index_0_split_after_fragmented_arguments() -> None:
    """covers T4: a server that puts every call at index 0 (Ollama) starts the second call of
    the same function under a new id once the first one's fragments form a whole object."""
    def part(arguments: str, call_id: str | None = None) -> dict[str, Any]:
        head = {"id": call_id, "function": {"name": "get_weather", "arguments": arguments}} \
            if call_id else {"function": {"arguments": arguments}}
        return {"choices": [choice({"tool_calls": [{"index": 0, **head}]})]}

    script = sse(part('{"city": ', "call_a"), part('"Oslo"}'), part('{"city": "Rome"}', "call_b"),
                 {"choices": [choice({}, "tool_calls")]}, "[DONE]")
    _, summary, _ = await run("openai", script)
    assert [(c.id, c.arguments) for c in summary.tool_calls] == [
        ("call_a", {"city": "Oslo"}), ("call_b", {"city": "Rome"})]


async def test_an_id_minted_per_delta_does_not_split_a_call() -> None:
    """covers T4: servers that mint a new id on every delta (and repeat the name) while the
    arguments are still arriving make one call, with the first id."""
    def part(arguments: str, call_id: str) -> dict[str, Any]:
        call = {"index": 0, "id": call_id,
                "function": {"name": "get_weather", "arguments": arguments}}
        return {"choices": [choice({"tool_calls": [call]})]}

    script = sse(part('{"city": ', "call_1"), part('"Oslo"}', "call_2"),
                 {"choices": [choice({}, "tool_calls")]}, "[DONE]")
    _, summary, _ = await run("openai", script)
    [call] = summary.tool_calls
    assert (call.id, call.arguments, call.truncated) == ("call_1", {"city": "Oslo"}, False)


async def test_reasoning_tokens_are_counted() -> None:
    """covers P7: OpenAI's `completion_tokens_details.reasoning_tokens` is counted as the
    pass's reasoning tokens."""
    usage = {"prompt_tokens": 9, "completion_tokens": 30, "total_tokens": 39,
             "completion_tokens_details": {"reasoning_tokens": 24}}
    script = sse({"choices": [choice({"content": "42"}, "stop")]},
                 {"choices": [], "usage": usage}, "[DONE]")
    _, summary, _ = await run("openai", script)
    assert summary.as_json()["usage"] == {"input_tokens": 9, "output_tokens": 30,
                                          "total_tokens": 39, "thoughts_tokens": 24}


@pytest.mark.looptime
async def test_the_turn_ends_at_done_though_the_server_keeps_the_stream_open() -> None:
    """covers S8, S5: `[DONE]` ends the answer; a server that then holds the connection open
    does not keep the turn waiting into a stall error."""
    script = sse({"choices": [choice({"content": "Hi"}, "stop")]}, "[DONE]") + b":@hang\n"
    async with ReplayServer(script) as server:
        _, summary = await collect(server, "openai", read_timeout_s=45)
    assert ("".join(summary.text), summary.finish_reason, summary.error) == ("Hi", "stop", None)
