"""Conventions every seqserve command shares: where a client looks for the server by default, how a field's name
becomes its flag, and the words a boolean flag or environment variable accepts."""
from __future__ import annotations

LOOPBACK = "127.0.0.1"
DEFAULT_PORT = 50051
DEFAULT_ADDRESS = f"{LOOPBACK}:{DEFAULT_PORT}"  # `seqserve serve`'s default bind and port, as a client reaches them

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def flag(name: str) -> str:
    """The flag of a field: `max_new_tokens` -> `--max-new-tokens`."""
    return "--" + name.replace("_", "-")


def parse_bool(text: str) -> bool:
    """A boolean given as text (an environment variable, locust's web UI form): true/false, 1/0, yes/no, on/off."""
    word = text.strip().lower()
    if word not in _TRUE + _FALSE:
        raise ValueError(f"not a boolean: {text!r} (true/false, 1/0, yes/no, on/off)")
    return word in _TRUE
