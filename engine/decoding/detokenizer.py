"""Incremental detokenisation with stop strings: one request's text, built one token at a time.

tokenizers' DecodeStream turns each new id into the new text in O(1) (it holds back a piece until a UTF-8 character
split across byte-level tokens completes), instead of decoding the whole output again at every step. Text that a stop
string may still cut is held back, so the pieces a stream sends always concatenate to exactly the unary text.
"""
from __future__ import annotations

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream


class TextStream:
    def __init__(self, tokenizer: Tokenizer, stops: tuple[str, ...] = ()) -> None:
        self.tokenizer, self.stops = tokenizer, stops
        self.longest = max(map(len, stops), default=0)
        self._decode = DecodeStream(skip_special_tokens=True)
        self.text = ""  # decoded so far (cut at a stop string once one appeared)
        self.sent = 0  # characters of text already released
        self.stopped = False  # a stop string appeared: the request ends with FINISH_REASON_STOP

    def push(self, token_id: int) -> str:
        """Adds one generated id; returns the text now safe to release ('' while held back)."""
        piece = self._decode.step(self.tokenizer, token_id)
        if not self.stops:  # nothing to hold back: every piece goes out as it comes
            if piece:
                self.text += piece
                self.sent = len(self.text)
            return piece or ""
        if piece:
            start = max(0, len(self.text) - self.longest + 1)  # a stop string may straddle the previous text
            self.text += piece
            at = first_stop(self.text, self.stops, start)
            if at is not None:
                self.text, self.stopped = self.text[:at], True
                return self._release(len(self.text))
        return self._release(len(self.text) - held_back(self.text, self.stops))

    def close(self, ids: list[int]) -> str:
        """At the end: the final text (the whole output decoded once, unless a stop string cut it) minus what was
        already released; returns the rest. The whole decode can end with text the tokens never showed (U+FFFD for
        an unfinished UTF-8 character), so the stop strings are looked for in it again: one there ends it STOP."""
        if not self.stopped:
            start = max(0, len(self.text) - self.longest + 1)  # the incremental text was already searched
            self.text = self.tokenizer.decode(ids, skip_special_tokens=True)
            at = first_stop(self.text, self.stops, start)
            if at is not None:
                self.text, self.stopped = self.text[: max(at, self.sent)], True
        return self._release(len(self.text))

    def _release(self, upto: int) -> str:
        if upto <= self.sent:
            return ""
        piece, self.sent = self.text[self.sent : upto], upto
        return piece


def first_stop(text: str, stops: tuple[str, ...], start: int = 0) -> int | None:
    """Where the earliest stop string begins in text (searching from start), or None."""
    found = [at for at in (text.find(s, start) for s in stops) if at >= 0]
    return min(found) if found else None


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest end of text that is the beginning of a stop string (it may still grow into one)."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if stop[k - 1] == text[-1] and text.endswith(stop[:k]):
                best = k
                break
    return best
