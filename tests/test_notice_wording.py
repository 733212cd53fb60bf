"""The words a user reads in each notice (SPEC G2, S12, T1, T6, D5): the title and text
of every notice kind, pinned so a change of wording is a deliberate one, reviewed here."""

from __future__ import annotations

from fsm.engine.channel import NOTICE_TEXT, Notice

WORDING = {
    'timeout_first_token': ('No response from the model',
        'The model never started answering, so I stopped waiting. Please try again.'),
    'timeout_idle': ('The model went quiet',
        'The model stopped sending text partway through, so I stopped waiting.'),
    'still_working': ('Still working',
        "This is taking many steps; I'm still on it."),
    'tool_error_loop': ('Tools keep failing',
        'Several tool calls in a row failed, so I stopped this reply.'),
    'max_iterations': ('Too many steps',
        'This reply reached its step limit, so I stopped it here.'),
    'failed_context_too_long': ('Conversation too long',
        'The conversation is too long for the model to read, so it could not answer.'),
    'failed_unreachable': ('Model unreachable',
        'I could not reach the model right now. Please try again in a little while.'),
    'failed_rejected_key': ('Model access refused',
        "The model refused the bot's API key, so it could not answer. The bot's operator "
        "needs to check it."),
    'failed_rate_limited': ('Rate limited',
        'The model is rate limiting the bot right now. Please try again in a little while.'),
    'failed_blocked': ('Reply blocked',
        "The model's safety filter blocked this reply."),
    'failed_empty_reply': ('Empty reply',
        'The model answered with nothing. Please try again.'),
    'failed_other': ('Reply failed',
        'Something went wrong while answering, so I stopped this reply.'),
    'delivery_cap': ('Reply too long',
        'This reply reached its length limit, so I stopped it here.'),
    'answered_by_fallback': ('Fallback model',
        'The main model failed; a fallback model answered.'),
}


def test_every_notice_reads_as_worded() -> None:
    # covers G2, S12, T1, T6, D5: what the embed shows for each kind of notice
    assert {kind: (Notice.of(kind).title, Notice.of(kind).description)
            for kind in NOTICE_TEXT} == WORDING
