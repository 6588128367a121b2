"""The rules that end a request, and where the others live (docs/architecture.md has the table):

    EOS        the chosen token is the end token (it is not returned or counted): after_token; beams in beam.py
    LENGTH     max_new_tokens generated: after_token; beams in beam.py
    STOP       a stop string appeared in the text: detokenizer.TextStream (the text is cut before it)
    CANCELLED  the client went away (or the server stopped before the request finished): an abort the scheduler drains
    DEADLINE   the call's deadline passed: the scheduler's deadline heap, or an abort that says so
    ERROR      a failure this request caused: isolation.py (the message names no internals)
"""
from __future__ import annotations

import numpy as np

from seqserve.engine.request import FinishReason

ERROR_MESSAGE = "inference failed for this request; the server log has the details"


GOES_ON, EOS, LENGTH, STOP = 0, 1, 2, 3  # a row's state after a step, as one small integer per row
REASONS = {EOS: FinishReason.EOS, LENGTH: FinishReason.LENGTH, STOP: FinishReason.STOP}


def after_token(chosen: np.ndarray, length: np.ndarray, max_new: np.ndarray, eos_id: int) -> np.ndarray:
    """For every stepped row at once: GOES_ON, EOS or LENGTH. chosen (B,) is this step's token, length (B,) counts
    tokens generated before it, max_new (B,) is each row's limit (EOS wins over LENGTH). STOP comes from the text."""
    eos = chosen == eos_id  # (B,)
    full = length + 1 >= max_new  # (B,) the token about to be appended is the last one allowed
    return np.where(eos, EOS, np.where(full, LENGTH, GOES_ON))
