"""Segment trimming keeps every character and never cuts inside a word or a CJK character."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from specfuse.segments import cut_at_stop, echoes_prompt, is_word_char, trim_to_word_boundary


def test_trimming_drops_a_half_word_and_the_space_before_it():
    assert trim_to_word_boundary("She eats three for") == "She eats three"
    assert trim_to_word_boundary("eggs = eggs_per_") == "eggs ="  # the reference broke `eggs_per_ breakfast`


def test_trimming_keeps_text_that_already_ends_at_a_boundary():
    for text in ("Hello, world. ", "x = 1\n", "价格是", "a (b)", "done!"):
        assert trim_to_word_boundary(text) == text


def test_trimming_never_leaves_nothing():
    assert trim_to_word_boundary("supercalifragilistic") == "supercalifragilistic"
    assert trim_to_word_boundary("  leading") == "  leading"


def test_cjk_characters_are_words_of_their_own():
    assert not is_word_char("猫") and not is_word_char("カ") and is_word_char("é") and is_word_char("_")
    assert trim_to_word_boundary("我们的答案是 forty") == "我们的答案是"


@given(st.text())
def test_trimming_returns_a_prefix_that_is_valid_text(text):
    out = trim_to_word_boundary(text)
    assert text.startswith(out)
    assert out or not text
    if out and out != text:  # a cut falls between words, never inside one
        assert not (is_word_char(out[-1]) and is_word_char(text[len(out)]))


@given(st.lists(st.text(min_size=1), min_size=1, max_size=8))
def test_concatenated_trimmed_segments_keep_every_character(parts):
    """What the engine appends is exactly the candidates' texts: nothing is stripped or replaced."""
    answer, rest = "", "".join(parts)
    while rest:
        piece = trim_to_word_boundary(rest[:7])
        answer += piece
        rest = rest[len(piece) :]
    assert answer == "".join(parts)


def test_cut_at_stop_finds_the_earliest_stop():
    assert cut_at_stop("a\nQuestion: b", ["Question:", "\nQ"]) == 1
    assert cut_at_stop("abc", ["x"]) is None


def test_an_echo_is_a_verbatim_piece_of_the_prompt_and_long_enough():
    prompt = "Janet's ducks lay 16 eggs per day."
    assert echoes_prompt(prompt, "", "Janet's ducks lay 16")
    assert echoes_prompt(prompt, "Janet's ducks", " lay 16 eggs")
    assert not echoes_prompt(prompt, "", "Janet's")  # too short to call a copy
    assert not echoes_prompt(prompt, "She has ", "16 eggs per day.")  # a quote inside a real answer
