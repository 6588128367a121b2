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


class InvalidOption(ValueError):
    """An option outside its range: the message names the field (the service answers INVALID_ARGUMENT)."""


def check_stop(stop: tuple[str, ...], limits: Limits) -> None:
    """The stop strings within their limits (engine/remote/request_bounds.py asks the same of an engine process's
    requests)."""
    most = limits.max_stop_strings
    if len(stop) > most:
        raise InvalidOption(f"options.stop has {len(stop)} strings, more than max_stop_strings={most}")
    each, total = limits.max_stop_string_bytes, 0
    for i, s in enumerate(stop):
        if s == "":
            raise InvalidOption(f"options.stop[{i}] must not be empty")
        size = len(s.encode())
        if size > each:
            raise InvalidOption(f"options.stop[{i}] has {size} bytes, more than max_stop_string_bytes={each}")
        total += size
    if total > limits.max_stop_bytes:
        raise InvalidOption(f"options.stop has {total} bytes in all, more than "
                            f"max_stop_bytes={limits.max_stop_bytes}")
