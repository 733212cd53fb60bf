"""What the `<details>` filter delivers at its edges (SPEC T8): a long opening tag is prose,
a tag split after long prose or inside its attributes is still caught, ordinary `<` text
goes out at once, several blocks are kept apart, and a summary is stripped whatever its
case or lines."""

from __future__ import annotations

from fsm.engine.details import DetailsFilter


def test_an_opening_tag_longer_than_the_bound_is_prose_delivered_at_once() -> None:
    # covers T8: up to the bound a `<details ...` with no `>` yet may still be a tag and is
    # held back; one character longer it is not one and goes out whole, at once
    held = "<details " + "a" * 191  # the bound: 200 characters
    assert DetailsFilter().feed("x " + held) == "x "
    prose = held + "a"
    assert DetailsFilter().feed("x " + prose) == "x " + prose


def test_a_tag_split_after_long_prose_is_still_caught() -> None:
    # covers T8: the bound measures the tag, not the text before it
    details = DetailsFilter()
    prose = "word " * 60
    out = details.feed(prose + "<det") + details.feed("ails>secret</details> end")
    assert out == prose + " end" and details.details == "secret"


def test_an_opening_tag_split_inside_its_attributes_is_still_caught() -> None:
    # covers T8
    details = DetailsFilter()
    out = details.feed('Hi <details class="meta"') + details.feed(">secret</details>!")
    assert out == "Hi !" and details.details == "secret"


def test_ordinary_angle_brackets_go_out_at_once() -> None:
    # covers T8: text whose `<` can no longer become a details tag is not held back
    for text in ("use <b> for bold", "I <3 you", "a <details-panel"):
        assert DetailsFilter().feed(text) == text


def test_several_blocks_of_one_pass_are_kept_apart() -> None:
    # covers T8
    details = DetailsFilter()
    assert details.feed("<details>one</details> mid <details>two</details>") == " mid "
    assert details.details == "one\n\ntwo"


def test_a_summary_is_stripped_whatever_its_case_or_lines() -> None:
    # covers T8: the kept body loses its summary, written in capitals over two lines too
    details = DetailsFilter()
    details.feed("<details><SUMMARY>Notes\nfor the bot</SUMMARY>the body</details>")
    assert details.details == "the body"
