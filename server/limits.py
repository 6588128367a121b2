"""What a request may ask for once the bundle is known (server/settings.py Settings.limits resolves them)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """What a request may ask for, resolved against the bundle (GetModelInfo reports these)."""

    max_input_tokens: int
    max_new_tokens: int
    default_max_new_tokens: int
    max_stop_strings: int
    max_batch_inputs: int
    max_batch_size: int
    max_waiting: int
    max_stop_string_bytes: int
    max_stop_bytes: int
    max_receive_message_bytes: int
    max_inflight_bytes: int
    max_num_beams: int
    max_top_logprobs: int
