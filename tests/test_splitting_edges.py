"""What the reply splitter sends at its edges (SPEC D1): whitespace tails longer than a
message, bare and long-named code fences carried across messages, where a message ends
around a code block, and replies that just fit. Each test reads the messages Discord would
get (and the text they account for), fed whole or streamed in pieces."""

from __future__ import annotations

import pytest

from discord_io.splitting import FENCE, Chunk, StreamSplitter, split_message

from test_security_splitter import check


def _streamed(text: str, piece: int, limit: int = 2000) -> list[Chunk]:
    splitter = StreamSplitter(limit)
    chunks: list[Chunk] = []
    for start in range(0, len(text), piece):
        chunks += splitter.feed(text[start : start + piece])
    return chunks + splitter.flush()


def _sent(chunks: list[Chunk]) -> list[str]:
    return [chunk.content for chunk in chunks if not chunk.is_trailer]


@pytest.mark.parametrize("tail", ["\n" * 5000, " " * 4100, "\r\n" * 3000, "\t \n" * 2100])
def test_a_whitespace_tail_longer_than_a_message_is_delivered_not_raised(tail: str) -> None:
    # covers D1: models that spiral into thousands of newlines still get their reply out
    text = "The answer is 42." + tail
    assert split_message(text) == ["The answer is 42."]
    for piece in (1, 7, 4096, len(text)):
        chunks = _streamed(text, piece)
        assert _sent(chunks) == ["The answer is 42."]
        check(text, chunks, 2000)


def test_whitespace_longer_than_a_message_between_paragraphs_is_no_message() -> None:
    # covers D1
    text = "First." + "\n" * 4500 + "Second."
    assert split_message(text) == ["First.", "Second."]
    chunks = _streamed(text, 50)
    assert _sent(chunks) == ["First.", "Second."]
    check(text, chunks, 2000)


def _code_lines(count: int) -> str:
    return "\n".join(f"line_{n} = {n}" for n in range(count))


def test_a_bare_code_block_is_reopened_bare() -> None:
    # covers D1: a block without a language stays without one in every message
    text = "Here:\n" + FENCE + "\n" + _code_lines(300) + "\n" + FENCE
    messages = split_message(text)
    assert len(messages) >= 3
    for message in messages[1:]:
        assert message.startswith(FENCE + "\nline_")
    assert _sent(_streamed(text, 11)) == messages


def test_a_long_language_word_is_carried_cut_to_32_characters() -> None:
    # covers D1
    language = "x" * 40
    text = FENCE + language + " extra words\n" + _code_lines(300) + "\n" + FENCE
    messages = split_message(text)
    assert messages[0].startswith(FENCE + language + " extra words\n")
    for message in messages[1:]:
        assert message.startswith(FENCE + "x" * 32 + "\nline_")


def test_a_message_ends_at_the_end_of_a_closed_code_block() -> None:
    # covers D1: a closed block is a better place to cut than any later line of text
    block = FENCE + "py\nprint(1)\n" + FENCE
    text = block + "\n" + "".join(f"note {n}\n" for n in range(400))
    messages = split_message(text)
    assert messages[0] == block
    assert _sent(_streamed(text, 9)) == messages


def test_a_code_block_whose_first_line_overflows_starts_in_the_first_message() -> None:
    # covers D1: no message is an empty code block
    text = "Intro " + FENCE + "py\n" + "y" * 3000 + "\n" + FENCE
    for messages in (split_message(text), _sent(_streamed(text, 13))):
        assert messages[0].startswith("Intro " + FENCE + "py\ny")
        assert all(message.count("y") > 0 for message in messages)


def test_a_streamed_reply_that_fits_one_message_with_room_for_a_fence_is_one_message() -> None:
    # covers D1: only text that may not fit is cut while streaming
    text = ("word " * 400)[:1996]
    for piece in (1, 5, 100):
        assert _sent(_streamed(text, piece)) == [text.rstrip()]
