"""The pure reply splitter: natural boundaries, the 2,000 limit, code fences (D1)."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from discord_io.splitting import (
    MESSAGE_LIMIT,
    StreamSplitter,
    discord_length,
    split_message,
)


def _fence_lines(message: str) -> list[str]:
    return [line for line in message.split("\n") if line.lstrip().startswith("```")]


def _paragraph(index: int, words: int = 140) -> str:
    return f"Paragraph {index}: " + " ".join(f"word{index}_{n}" for n in range(words)) + "."


def test_long_reply_splits_at_paragraph_boundaries() -> None:
    # covers D1
    paragraphs = [_paragraph(i) for i in range(6)]
    text = "\n\n".join(paragraphs)
    assert len(text) > 3 * MESSAGE_LIMIT

    messages = split_message(text)

    assert len(messages) > 1
    assert all(len(m) <= MESSAGE_LIMIT for m in messages)
    # every message is whole paragraphs, and together they are the reply
    for message in messages:
        assert all(part in paragraphs for part in message.split("\n\n"))
    assert "\n\n".join(messages) == text


def test_paragraph_break_preferred_over_a_later_newline() -> None:
    # covers D1
    text = "Intro line.\n\n" + "\n".join(f"line {n} " + "x" * 60 for n in range(40))
    messages = split_message(text)
    assert messages[0] == "Intro line."


def test_newline_preferred_over_space_when_no_paragraph_break() -> None:
    # covers D1
    lines = [f"line {n}: " + "y " * 40 for n in range(40)]
    messages = split_message("\n".join(lines))
    assert len(messages) > 1
    for message in messages:
        assert message.split("\n")[-1].strip() in {line.strip() for line in lines}


def test_exactly_2000_characters_is_one_message_and_2001_is_two() -> None:
    # covers D1
    assert split_message("a" * 2000) == ["a" * 2000]
    assert [len(m) for m in split_message("a" * 2001)] == [2000, 1]


def test_unbroken_text_is_hard_cut_at_the_limit() -> None:
    # covers D1
    assert [len(m) for m in split_message("z" * 4500)] == [2000, 2000, 500]


def test_space_cut_when_a_single_line_is_too_long() -> None:
    # covers D1
    words = " ".join(f"w{n:04d}" for n in range(800))
    messages = split_message(words)
    assert all(len(m) <= MESSAGE_LIMIT for m in messages)
    assert " ".join(messages) == words


def test_indented_overlong_line_loses_no_text() -> None:
    # covers D1 (found by the property test below: a cut inside leading spaces)
    text = "0\n  " + "x" * 300
    splitter = StreamSplitter(80)
    chunks = [c for ch in text for c in splitter.feed(ch)] + splitter.flush()
    assert all(c.content for c in chunks)
    assert "".join(c.source for c in chunks) == text


def test_limit_counts_utf16_units_for_astral_emoji() -> None:
    # covers D1
    messages = split_message("😀" * 1500)
    assert [discord_length(m) for m in messages] == [2000, 1000]


def test_long_code_block_closes_and_reopens_its_fence_with_the_language() -> None:
    # covers D1
    code_lines = [f"value_{n} = compute({n})  # step {n}" for n in range(160)]
    text = "Here is the script:\n\n```python\n" + "\n".join(code_lines) + "\n```\n\nDone."

    messages = split_message(text)

    assert messages[0] == "Here is the script:"
    code_messages = messages[1:]
    assert len(code_messages) >= 2
    for message in code_messages:
        assert len(message) <= MESSAGE_LIMIT
        assert message.startswith("```python\n")
        assert len(_fence_lines(message)) % 2 == 0, "every message closes what it opens"
    for message in code_messages[:-1]:
        assert message.endswith("\n```")
    assert code_messages[-1].endswith("```\n\nDone.")
    recovered = [
        line
        for message in code_messages
        for line in message.split("\n")
        if line.startswith("value_")
    ]
    assert recovered == code_lines


def test_blank_line_inside_a_code_block_is_not_a_boundary() -> None:
    # covers D1
    block = "```js\nconst a = 1;\n\nconst b = 2;\n```"
    text = "A" * 1500 + "\n\n" + block + "\n\n" + "B" * 1000
    messages = split_message(text)
    assert any(block in message for message in messages)


def test_inline_triple_backticks_do_not_open_a_block() -> None:
    # covers D1
    text = "Use ```x``` inline.\n\n" + _paragraph(1) + "\n\n" + _paragraph(2)
    for message in split_message(text):
        assert not message.endswith("\n```")
        assert not message.startswith("```")


def test_fence_left_open_at_the_end_is_closed() -> None:
    # covers D1
    assert split_message("Look:\n```sh\nls -la") == ["Look:\n```sh\nls -la\n```"]


def test_streamed_feed_matches_whole_split_and_accounts_for_all_text() -> None:
    # covers D1
    text = (
        "\n\n".join(_paragraph(i) for i in range(3))
        + "\n\n```go\n"
        + "\n".join(f'fmt.Println("{n}")' for n in range(150))
        + "\n```\n\nThe end."
    )
    splitter = StreamSplitter()
    chunks = []
    for start in range(0, len(text), 13):
        chunks += splitter.feed(text[start : start + 13])
    streamed_early = len(chunks)
    chunks += splitter.flush()

    assert streamed_early >= 1, "messages go out while the stream is still running"
    assert [c.content for c in chunks] == split_message(text)
    assert "".join(c.source for c in chunks) == text


def test_flush_boundary_sends_complete_paragraphs_and_keeps_the_rest() -> None:
    # covers D1
    splitter = StreamSplitter()
    assert splitter.feed("First paragraph.\n\nSecond, still being wri") == []
    chunks = splitter.flush_boundary()
    assert [c.content for c in chunks] == ["First paragraph."]
    assert splitter.pending == "Second, still being wri"
    assert [c.content for c in splitter.flush()] == ["Second, still being wri"]


def test_flush_boundary_never_cuts_an_open_code_block() -> None:
    # covers D1
    splitter = StreamSplitter()
    splitter.feed("Intro.\n\n```py\nx = 1\n\ny = 2\n")
    assert [c.content for c in splitter.flush_boundary()] == ["Intro."]
    assert splitter.pending.startswith("```py")


_texts = st.lists(
    st.one_of(
        st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=300),
        st.sampled_from(["\n", "\n\n", "```", "```python\n", "\n```\n", " ", "😀", "x" * 700]),
    ),
    max_size=40,
).map("".join)


@settings(max_examples=400, deadline=None)
@given(
    text=_texts, piece=st.integers(min_value=1, max_value=400), limit=st.sampled_from([80, 2000])
)
# Found by this test on a fresh clone: a hard cut moved back to the space before a closing
# fence left the block open, and the fence the message then had to add overflowed by one.
@example(text="0\U00010000```" + "x" * 700 + "000000\U00010000\U00010000 ```" + "x" * 700,
         piece=105, limit=80)
def test_any_stream_yields_bounded_balanced_messages_covering_the_text(
    text: str, piece: int, limit: int
) -> None:
    # covers D1
    splitter = StreamSplitter(limit)
    chunks = []
    for start in range(0, len(text), piece):
        chunks += splitter.feed(text[start : start + piece])
    chunks += splitter.flush()

    # the messages account for the whole stream, trailing whitespace included (a trailer);
    # a stream of whitespace alone makes none
    delivered = "".join(c.source for c in chunks)
    assert delivered == text if chunks else not text.strip()
    messages = [c for c in chunks if not c.is_trailer]
    assert all(not c.is_trailer for c in chunks[:-1])
    for chunk in messages:
        assert chunk.content.strip()
        assert discord_length(chunk.content) <= limit
