"""How a refusal quotes what the client sent: cut, so a status detail stays small whatever the client sent.

A status detail travels as the `grpc-message` trailer; one over the client's metadata limit (8 KiB by default)
reaches it as RESOURCE_EXHAUSTED instead of the refusal, and a client with a larger limit would get its own
40 KB string back. Every status detail that quotes a client's value goes through `quoted`.
"""
from __future__ import annotations

ECHO_CHARS = 64  # characters of a client's value a status detail quotes
LISTED_NAMES = 16  # served model names a NOT_FOUND lists (names are up to 128 characters; GetModelInfo lists all)


def quoted(value: str) -> str:
    """repr(value) when it is short; else its first ECHO_CHARS characters' repr, an ellipsis and its length."""
    if len(value) <= ECHO_CHARS:
        return repr(value)
    return f"{value[:ECHO_CHARS]!r}... ({len(value)} characters)"


def listed(names) -> str:
    """The served names a refusal lists, sorted: at most LISTED_NAMES, then how many more (a repository of hundreds
    of models must not make the detail outgrow the client's metadata limit)."""
    names = sorted(names)
    shown = ", ".join(names[:LISTED_NAMES])
    more = len(names) - LISTED_NAMES
    return shown + (f" and {more} more (GetModelInfo lists every one)" if more > 0 else "")
