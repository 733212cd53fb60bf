"""What the reply splitter sends at its edges (SPEC D1): whitespace tails longer than a
message, bare and long-named code fences carried across messages, where a message ends
around a code block, and replies that just fit. Each test reads the messages Discord would
get (and the text they account for), fed whole or streamed in pieces."""

from __future__ import annotations

import itertools

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


LIMIT = 64
OFFSETS = range(LIMIT - 24, LIMIT + 8)
PAIRS = [("\ud800", "\udc00"), ("\udbff", "\udfff"), ("\ud83d", "\ude00")]


def _both(text: str) -> list[list[Chunk]]:
    """The chunks of `text` split whole and streamed one character and five at a time."""
    return [_streamed(text, len(text), LIMIT), _streamed(text, 1, LIMIT),
            _streamed(text, 5, LIMIT)]


def _longest_prefix(text: str) -> str:
    """The most of `text` one message holds, counted in UTF-16 units."""
    units = 0
    for index, char in enumerate(text):
        units += 2 if ord(char) > 0xFFFF else 1
        if units > LIMIT:
            return text[:index]
    return text


@pytest.mark.parametrize(("high", "low"), PAIRS)
def test_an_emoji_arriving_as_two_surrogate_halves_is_never_cut_in_two(high: str,
                                                                      low: str) -> None:
    # covers D1: a broken stream's surrogate pair is delivered as its character, wherever
    # the message boundary falls
    joined = (high + low).encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    for offset in OFFSETS:
        text = "x" * offset + high + low + "y" * 100
        for chunks in _both(text):
            check(text, chunks, LIMIT)
            sent = _sent(chunks)
            assert "".join(sent) == "x" * offset + joined + "y" * 100, offset
            assert "\ufffd" not in "".join(sent)
        # whole, the first message holds all it can: up to the pair, or the pair too
        assert split_message(text, LIMIT)[0] == _longest_prefix(
            "x" * offset + joined + "y" * 100), offset


def test_unbroken_text_fills_every_message() -> None:
    # covers D1: a hard cut takes all a message can hold (an astral character counts two)
    # (streamed, a cut is made as soon as the buffer might not fit with a closing fence)
    for text in ["z" * 300, "😀" * 150, "z" + "😀" * 150, "\uffff" * 70 + "😀" * 70]:
        for chunks, least in zip(_both(text), [LIMIT - 1, LIMIT - 5, LIMIT - 5], strict=True):
            sent = _sent(chunks)
            assert "".join(sent) == text
            units = [len(m.encode("utf-16-le")) // 2 for m in sent]
            assert all(u >= least for u in units[:-1]), units


def test_prose_fills_every_message_up_to_its_last_word() -> None:
    # covers D1: a cut at a space leaves no word behind that would have fitted
    words = [("w" * (1 + (n * 7) % 13)) for n in range(120)]
    text = " ".join(words)
    for chunks in _both(text):
        assert " ".join(_sent(chunks)) == text
    sent = split_message(text, LIMIT)
    assert " ".join(sent) == text
    for message, following in itertools.pairwise(sent):
        assert len(message) + 1 + len(following.split(" ")[0]) > LIMIT


def test_lines_fill_every_message_up_to_its_last_line() -> None:
    # covers D1: a cut at a line end leaves no line behind that would have fitted
    lines = [("l" * (1 + (n * 5) % 17)) for n in range(120)]
    text = "\n".join(lines)
    for chunks in _both(text):
        assert "\n".join(_sent(chunks)) == text
    sent = split_message(text, LIMIT)
    assert "\n".join(sent) == text
    for message, following in itertools.pairwise(sent):
        assert len(message) + 1 + len(following.split("\n")[0]) > LIMIT


def test_code_fills_every_message_up_to_its_last_line() -> None:
    # covers D1: inside a block too, with the fences each message needs counted
    lines = [("c" * (1 + (n * 5) % 17)) for n in range(120)]
    text = FENCE + "\n" + "\n".join(lines) + "\n" + FENCE
    for chunks in _both(text):
        check(text, chunks, LIMIT)
    sent = split_message(text, LIMIT)
    bodies = [m.removeprefix(FENCE + "\n").removesuffix("\n" + FENCE) for m in sent]
    assert "\n".join(bodies) == "\n".join(lines)
    for message, following in itertools.pairwise(sent):
        first_line = following.split("\n")[1]
        assert len(message) + 1 + len(first_line) > LIMIT, (message, following)


@pytest.mark.parametrize("piece", [FENCE, FENCE + "py\n", "\n" + FENCE + "\n", "`", "``",
                                   " ", "\n", "\n\n", "😀", "\ufffd"])
def test_any_boundary_near_the_limit_keeps_every_promise(piece: str) -> None:
    # covers D1: a fence, space, line end or wide character at each offset around the cut
    for offset in OFFSETS:
        for tail in ("y" * 100, " word" * 20, "\n" + "y" * 100):
            text = "x" * offset + piece + tail
            for chunks in _both(text):
                check(text, chunks, LIMIT)


def test_a_line_end_is_preferred_to_a_space_that_would_fill_the_message() -> None:
    # covers D1
    text = "a\n" + "x" * 1998 + " " + "y" * 50
    assert split_message(text) == ["a", "x" * 1998, "y" * 50]


def test_a_line_of_exactly_a_message_is_one_message() -> None:
    # covers D1
    text = "x" * 2000 + "\n" + "y" * 10
    assert split_message(text) == ["x" * 2000, "y" * 10]
    text = "x" * 1995 + "\n\n" + "y" * 10 + "\n" + "z" * 1989
    assert split_message(text) == ["x" * 1995, "y" * 10 + "\n" + "z" * 1989]


def test_a_one_character_paragraph_before_unbroken_text_is_its_own_message() -> None:
    # covers D1
    assert split_message("a\n\n" + "x" * 3000) == ["a", "x" * 2000, "x" * 1000]


def test_leading_whitespace_does_not_shorten_the_first_message() -> None:
    # covers D1
    text = "\n" * 1000 + "y" * 1500 + "\n\n" + "z" * 1500
    assert split_message(text) == ["y" * 1500, "z" * 1500]


@pytest.mark.parametrize("lone", ["\ud83d", "\ude00"])
def test_a_lone_surrogate_is_one_unit_and_cut_like_any_character(lone: str) -> None:
    # covers D1: half an emoji (a broken stream) becomes U+FFFD and fills as one unit
    for offset in OFFSETS:
        text = "x" * offset + lone + "y" * 100
        sent = split_message(text, LIMIT)
        expected = text.replace(lone, "\ufffd")
        assert "".join(sent) == expected
        assert sent[0] == expected[:LIMIT], offset


@pytest.mark.parametrize("run", ["`", "``"])
def test_a_cut_never_splits_a_run_of_backticks_and_keeps_all_before_it(run: str) -> None:
    # covers D1: half a fence in each message would open a block the other never closes
    for offset in OFFSETS:
        text = "x" * offset + run + "y" * 100
        sent = split_message(text, LIMIT)
        assert "".join(sent) == text
        inside = offset < LIMIT < offset + len(run)
        assert sent[0] == ("x" * offset if inside else text[:LIMIT]), offset


@pytest.mark.parametrize("words", [70, 80, 90])
def test_backticks_ending_a_long_code_block_reopen_it_in_the_last_message(words: int) -> None:
    # covers D1: the cut is moved out of the run of backticks, back until the message, with
    # the fence it must then add to close its block, fits
    text = "text ```sh\n" + "word " * words + "``````"
    chunks = _streamed(text, 105, LIMIT)
    check(text, chunks, LIMIT)
    assert _sent(chunks)[-3:] == [
        "```sh\n" + "word " * 10 + "\n```",
        "```sh\n" + " ".join(["word"] * 11) + "\n```",
        "```sh\n ``````\n```",
    ]


def test_backticks_after_thousands_of_blank_lines_arrive_whole() -> None:
    # covers D1
    assert split_message("\n" * 5000 + "ab``") == ["ab``"]


def test_a_reply_that_is_one_long_run_of_backticks_is_delivered() -> None:
    # covers D1: a run longer than a message is cut inside (no cut outside it exists) and
    # never loops; text before it is its own message
    assert [len(m) for m in split_message("`" * 200, LIMIT)] == [62, 62, 62, 14]
    assert split_message("a" + "`" * 200, LIMIT)[0] == "a"


def test_when_the_stream_stops_anywhere_what_is_left_is_one_message() -> None:
    # covers D1: a feed holds back only what fits one message, with its carried fence
    texts = ["word " * 40, FENCE + "py\n" + "code " * 40, "😀 " * 60 + "😀"]
    for text in texts:
        for stop in range(1, len(text), 3):
            splitter = StreamSplitter(LIMIT)
            for start in range(0, stop, 5):
                splitter.feed(text[start : min(start + 5, stop)])
            assert len(_sent(splitter.flush())) <= 1, (text[:10], stop)


def test_a_stream_of_whitespace_alone_makes_no_message_and_no_trailer() -> None:
    # covers D1
    splitter = StreamSplitter(LIMIT)
    splitter.feed("  \n\n ")
    assert splitter.flush() == []


def test_whitespace_after_a_paused_streams_last_message_stays_in_its_account() -> None:
    # covers D1: the delivered account (what a fallback continues) keeps every character
    splitter = StreamSplitter(LIMIT)
    splitter.feed("First.\n\n")
    sent = splitter.flush_boundary()
    assert [c.content for c in sent] == ["First."]
    splitter.feed("  \n")
    trailer = splitter.flush()
    assert [c.content for c in trailer] == [""]
    assert "".join(c.source for c in sent + trailer) == "First.\n\n  \n"
