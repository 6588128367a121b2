"""Incremental detokenisation and stop strings, on the real byte-level tokenizer of the tiny bundle.

The oracle is the tokenizer's own full decode: pieces released one token at a time must concatenate to exactly it
(multi-byte characters split across tokens included), and with stop strings to exactly the unary text, which is the
full text cut before the first stop string.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqserve.contract.tokenizer import load_tokenizer
from seqserve.engine.decoding.detokenizer import TextStream, held_back

ALPHABET = st.sampled_from(list("ab c0é日本🙂\u00a0\n") + ["\u0301", "ß"])  # ASCII, 2-, 3- and 4-byte UTF-8


@pytest.fixture(scope="module")
def tok(tiny_bundle):
    return load_tokenizer(tiny_bundle / "tokenizer.json")


def stream(tok, ids: list[int], stops: tuple[str, ...] = ()) -> tuple[list[str], TextStream]:
    """Every piece released, in order, as the engine releases them (push per token, close at the end)."""
    text, pieces = TextStream(tok, stops), []
    for i, token in enumerate(ids):
        pieces.append(text.push(token))
        if text.stopped:
            return pieces + [text.close(ids[: i + 1])], text
    return pieces + [text.close(ids)], text


def test_multibyte_characters_split_across_tokens_are_held_until_complete(tok):
    ids = tok.encode("é日🙂").ids[:-1]  # byte-level: each character spans several tokens (the end token dropped)
    assert len(ids) > 3
    pieces, _ = stream(tok, ids)
    assert "".join(pieces) == "é日🙂" and "\ufffd" not in "".join(pieces)
    assert all(p == "" or p in ("é", "日", "🙂") for p in pieces)  # never half a character


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.text(ALPHABET, max_size=24))
def test_pieces_concatenate_to_the_full_decode(tok, text):
    ids = tok.encode(text).ids[:-1]
    pieces, _ = stream(tok, ids)
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("text, stops, unary", [
    ("a b c d", ("a b c d",), ""),  # the case: the stream used to send 'a',' ','b',' ','c',' '
    ("a b c d", (" b",), "a"),  # ... and 'a ' here
    ("a b c d", ("c", "b c"), "a "),  # the earliest stop string wins
    ("a b c d", ("x",), "a b c d"),
    ("a b a b", ("a b a",), ""),
    ("a b c d", ("d e",), "a b c d"),  # a prefix held back at the end is released when the text ends
])
def test_stream_equals_unary_with_stop_strings(tok, text, stops, unary):
    ids = tok.encode(text).ids[:-1]
    pieces, state = stream(tok, ids, stops)
    assert "".join(pieces) == state.text == unary
    assert state.stopped == (unary != text)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.text(ALPHABET, max_size=20), st.lists(st.text(ALPHABET, min_size=1, max_size=4), max_size=3))
def test_any_text_and_stops_stream_exactly_the_unary_text(tok, text, stops):
    ids = tok.encode(text).ids[:-1]
    pieces, state = stream(tok, ids, tuple(stops))
    assert "".join(pieces) == state.text == _unary(tok, ids, stops)
    assert state.stopped == any(s in tok.decode(ids, skip_special_tokens=True) for s in stops)


def _unary(tok, ids: list[int], stops: list[str]) -> str:
    """What generation returns, by its definition: after each token, the text so far (a character still incomplete
    left out) is searched for the stop strings; at the first token where one appears, the text is cut before the
    earliest-starting one and generation stops (a later token never arrives)."""
    for i in range(len(ids)):
        text = tok.decode(ids[: i + 1], skip_special_tokens=True).rstrip("\ufffd")
        found = [text.find(s) for s in stops if s in text]
        if found:
            return text[: min(found)]
    return tok.decode(ids, skip_special_tokens=True)


def test_held_back_is_the_longest_end_that_could_grow_into_a_stop_string():
    assert held_back("xx a b", ("a b c",)) == 3
    assert held_back("xx a", ("a b c", "xx a b")) == 4
    assert held_back("xx", ("yz",)) == 0


def test_a_stop_string_the_final_decode_completes_ends_the_text_stop(tok):
    """The whole-output decode at the end writes U+FFFD for an unfinished UTF-8 character, which the token-by-token
    text never showed: a stop string of U+FFFD must still cut it, and the request ends STOP (issue 16, item 9)."""
    ids = tok.encode("aé").ids[:-2]  # "a" and the first byte of "é" (the end token dropped)
    assert tok.decode(ids, skip_special_tokens=True).endswith("\ufffd")
    pieces, text = stream(tok, ids, ("\ufffd",))
    assert "\ufffd" not in text.text and "".join(pieces) == text.text and text.stopped
