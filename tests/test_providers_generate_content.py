"""What Gemini requests carry and what its streams' less common shapes make of the turn
(issue 29's mutation run over providers/gemini.py). Streams go over loopback HTTP through
the real adapter."""

from __future__ import annotations

import pytest

from fsm.engine.provider import PassRequest
from providers.gemini import ProviderIds
from providers.replay_server import ReplayServer

from providers_support import OK_STREAMS, collect, run, sse


def test_the_most_recent_provider_call_ids_are_kept() -> None:
    """covers T7, P3: a function response carries an id only when its call had one; the
    adapter remembers the most recent ids the model sent, forgetting the oldest first."""
    ids = ProviderIds(capacity=3)
    for call_id in ("a", "b", "c"):
        ids.remember(call_id)
    assert all(call_id in ids for call_id in ("a", "b", "c"))
    ids.remember("a")
    ids.remember("d")
    assert ("b" in ids, "a" in ids, "c" in ids, "d" in ids) == (False, True, True, True)


@pytest.mark.asyncio
async def test_a_model_named_with_its_models_prefix_is_not_doubled() -> None:
    """covers P3: `model: models/gemini-2.5-flash` (as Google's model list names it) asks
    for that model, not for `models/models/...`."""
    async with ReplayServer(OK_STREAMS["gemini"]) as server:
        _, summary = await collect(server, "gemini", model="models/gemini-2.5-flash")
    assert summary.error is None
    [recorded] = server.requests
    assert recorded.path == "/models/gemini-2.5-flash:streamGenerateContent"


@pytest.mark.asyncio
async def test_images_by_url_go_as_file_data_or_as_a_named_link() -> None:
    """covers R7, P3: an image URL whose type is known goes as `fileData`; one of unknown
    type (Gemini requires a type) is named in the text instead of being dropped."""
    item = {"role": "user", "content": [
        {"type": "text", "text": "bob: look"},
        {"type": "image", "url": "https://x.example/cat.png", "mime_type": "image/png"},
        {"type": "image", "url": "https://x.example/dog"}]}
    request = PassRequest(context_items=[item], function_history=[])
    async with ReplayServer(OK_STREAMS["gemini"]) as server:
        _, summary = await collect(server, "gemini", request=request)
    assert summary.error is None
    [recorded] = server.requests
    assert recorded.json()["contents"][0]["parts"] == [
        {"text": "bob: look"},
        {"fileData": {"mimeType": "image/png", "fileUri": "https://x.example/cat.png"}},
        {"text": "[image: https://x.example/dog]"}]


def chunk(*parts: object, finish: str | None = None) -> dict[str, object]:
    candidate: dict[str, object] = {"content": {"role": "model", "parts": list(parts)}}
    if finish:
        candidate["finishReason"] = finish
    return {"candidates": [candidate]}


@pytest.mark.asyncio
async def test_a_stream_without_a_finish_reason_names_what_was_missing() -> None:
    """covers S8, S13: a Gemini stream closed before any chunk with a finishReason is an
    incomplete stream, and the error names what never came."""
    _, summary, _ = await run("gemini", sse(chunk({"text": "cut"})))
    assert "".join(summary.text) == "cut"
    assert summary.error is not None and summary.error.type == "incomplete_stream"
    assert summary.error.message == "stream ended before a chunk with a finishReason"


@pytest.mark.asyncio
async def test_parts_that_are_not_objects_or_text_that_is_not_a_string_are_skipped() -> None:
    """covers S8: a part that is not an object, or whose `text` is not a string, adds
    nothing; the parts after it still reach the user."""
    script = sse(chunk("junk", {"text": 42}, {"text": "Hi"}),
                 chunk({"text": " there"}, finish="STOP"))
    _, summary, _ = await run("gemini", script)
    assert ("".join(summary.text), summary.finish_reason, summary.error) == ("Hi there", "STOP",
                                                                            None)


@pytest.mark.asyncio
async def test_a_streamed_call_begun_after_the_finish_and_never_closed_is_cut() -> None:
    """covers T4: a streamed call (Vertex `partialArgs`) that starts after the finish chunk
    and is still open when the stream ends was cut; it never runs."""
    partial = {"functionCall": {"name": "get_weather", "willContinue": True,
                                "partialArgs": [{"jsonPath": "$.city", "stringValue": "Os",
                                                 "willContinue": True}]}}
    script = sse(chunk({"text": "Checking."}, finish="STOP"), chunk(partial))
    _, summary, _ = await run("gemini", script)
    [call] = summary.tool_calls
    assert (call.name, call.truncated) == ("get_weather", True)


@pytest.mark.asyncio
async def test_a_whole_call_after_an_unclosed_streamed_one_cuts_it() -> None:
    """covers T4: a streamed call left open (its arguments complete so far) when a whole
    call of another function arrives was cut: it never runs, and the whole call, which
    came after it, does."""
    opened = {"functionCall": {"name": "get_weather", "willContinue": True,
                               "partialArgs": [{"jsonPath": "$.city", "stringValue": "Oslo"}]}}
    whole = {"functionCall": {"name": "get_time", "args": {"tz": "UTC"}}}
    script = sse(chunk(opened), chunk(whole), chunk(finish="STOP"))
    _, summary, _ = await run("gemini", script)
    assert [(c.name, c.arguments, c.truncated) for c in summary.tool_calls] == [
        ("get_weather", {"city": "Oslo"}, True), ("get_time", {"tz": "UTC"}, False)]


@pytest.mark.asyncio
@pytest.mark.parametrize("closing", [{}, {"name": "", "partialArgs": []}])
async def test_a_closing_part_with_no_call_open_invents_none(closing: dict[str, object]) -> None:
    """covers T4: a streamed call's closing part (`functionCall: {}`, or one with an empty
    name) when no call is open adds no call; the answer stands."""
    script = sse(chunk({"text": "Done."}), chunk({"functionCall": closing}, finish="STOP"))
    _, summary, _ = await run("gemini", script)
    assert ("".join(summary.text), summary.tool_calls, summary.error) == ("Done.", [], None)


@pytest.mark.asyncio
async def test_max_tokens_after_a_whole_call_is_no_error() -> None:
    """covers P6, T4: `MAX_TOKENS` while the model was making calls is not an error; the
    whole call it sent still runs (the engine continues the loop)."""
    whole = {"functionCall": {"name": "get_time", "args": {"tz": "UTC"}}}
    _, summary, _ = await run("gemini", sse(chunk(whole, finish="MAX_TOKENS")))
    [call] = summary.tool_calls
    assert (call.name, call.arguments, call.truncated) == ("get_time", {"tz": "UTC"}, False)
    assert (summary.finish_reason, summary.error) == ("MAX_TOKENS", None)


@pytest.mark.asyncio
async def test_a_call_with_a_bad_id_name_or_signature_is_still_a_clean_call() -> None:
    """covers T4, P5: a function call whose `id` is not a string gets a minted id, one with
    no name an empty name, and a thoughtSignature that is not a string is not carried
    back."""
    call = {"functionCall": {"id": 7, "args": {}}, "thoughtSignature": 12345}
    _, summary, _ = await run("gemini", sse(chunk(call, finish="STOP")))
    [tool] = summary.tool_calls
    assert tool.name == "" and tool.reasoning is None
    assert isinstance(tool.id, str) and tool.id.startswith("call_")


@pytest.mark.asyncio
async def test_a_finish_message_reaches_the_error() -> None:
    """covers P6, G2: Gemini's `finishMessage` beside a finish reason that is not an answer
    is kept in the error the turn ends with."""
    candidate = {"content": {"role": "model", "parts": [{"text": "x"}]},
                 "finishReason": "MALFORMED_FUNCTION_CALL",
                 "finishMessage": "Malformed function call: get_weather(city=)"}
    _, summary, _ = await run("gemini", sse({"candidates": [candidate]}))
    assert summary.error is not None and summary.error.type == "MALFORMED_FUNCTION_CALL"
    assert summary.error.message.endswith("(Malformed function call: get_weather(city=))")


@pytest.mark.asyncio
@pytest.mark.parametrize(("feedback", "message"), [
    ({"blockReason": "PROHIBITED_CONTENT", "blockReasonMessage": "The prompt was blocked."},
     "The prompt was blocked."),
    ({"blockReason": "SAFETY"}, "the provider blocked the prompt (SAFETY)"),
])
async def test_a_blocked_prompt_ends_the_turn_blocked_with_its_message(
        feedback: dict[str, str], message: str) -> None:
    """covers P6, G2: `promptFeedback.blockReason` ends the turn blocked, with Gemini's own
    message when it gave one and a plain one naming the reason otherwise."""
    _, summary, _ = await run("gemini", sse({"promptFeedback": feedback}))
    assert summary.error is not None
    assert (summary.error.kind, summary.error.type, summary.error.message) == (
        "blocked", feedback["blockReason"], message)
