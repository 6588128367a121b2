"""Incremental detokenisation and stop strings: turn one more token into the next piece of text."""
from __future__ import annotations

from tokenizers import Tokenizer

from seqserve.server.request import Request

REPLACEMENT = "\ufffd"  # byte-level BPE may split one UTF-8 character across tokens: hold the piece until it completes


def next_piece(tokenizer: Tokenizer, request: Request, final: bool) -> tuple[str, bool]:
    """Returns (new text since the last piece, whether a stop string ended it); updates request.text."""
    text = tokenizer.decode(request.output_ids, skip_special_tokens=True)
    for stop in request.params.stop:
        at = text.find(stop, max(0, len(request.text) - len(stop)))
        if at >= 0:  # the stop string is reported as the finish reason and cut from the text
            piece, request.text = text[len(request.text) : at], text[:at]
            return piece, True
    if (text.endswith(REPLACEMENT) and not final) or not text.startswith(request.text):
        return "", False
    piece, request.text = text[len(request.text) :], text
    return piece, False
