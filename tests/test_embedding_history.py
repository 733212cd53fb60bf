"""A function history an embedder hands the engine in its request (SPEC T7, S1): an entry
given only its call and result reaches the model as a successful call with no text of the
model's before it."""

from __future__ import annotations

from fsm.engine.provider import HistoryEntry, PassRequest
from providers.anthropic import anthropic_messages
from providers.context import normalize_items


def test_a_bare_history_entry_is_a_successful_call_with_no_text_before_it() -> None:
    # covers T7: the defaults of a history entry are a call that succeeded and streamed no
    # text before it: Anthropic gets the tool use alone and a result that is no error
    entry = HistoryEntry(tool_name="weather", arguments={"city": "Oslo"},
                         result={"success": True, "data": {"sky": "sun"}}, call_id="call_1")
    request = PassRequest(context_items=[{"role": "user", "content": "weather?"}],
                          function_history=[entry])
    blocks = anthropic_messages(request, normalize_items(request.context_items))
    assert [m["role"] for m in blocks] == ["user", "assistant", "user"]
    assert [b["type"] for b in blocks[1]["content"]] == ["tool_use"]
    (result,) = blocks[2]["content"]
    assert result["type"] == "tool_result" and result["is_error"] is False
