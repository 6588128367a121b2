"""CPU lists as `taskset -c` writes them (0 | 0,2 | 1-3): where an engine process runs (--engine-cpus)."""
from __future__ import annotations

import os


def cpu_list(text: str) -> set[int]:
    """The CPUs a list names; ValueError on anything else (an empty list included)."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"not a CPU list (like 0 or 0,2-3): {text!r}")
        first, last = int(lo), int(hi or lo)
        if last < first or last >= 4096:
            raise ValueError(f"not a CPU list (like 0 or 0,2-3): {text!r}")
        cpus.update(range(first, last + 1))
    return cpus


def cpu_problem(text: str) -> str | None:
    """Why a CPU list cannot pin an engine process on this machine, or None. (The server's own pinning, taskset, does
    not bind its engine processes: any CPU of the machine will do.)"""
    try:
        missing = cpu_list(text) - set(range(os.cpu_count() or 1))
    except ValueError as exc:
        return str(exc)
    return f"{text!r} names CPUs this machine does not have (it has 0-{(os.cpu_count() or 1) - 1})" if missing else None
