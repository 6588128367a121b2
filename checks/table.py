"""The verify table: one Check per comparison, printed as aligned columns with a pass/fail count."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    check: str  # what was compared
    subject: str  # the output, variant or file it was compared on
    value: str  # what was measured
    limit: str  # the tolerance
    ok: bool


def format_table(rows: list[Check], skipped: list[str]) -> str:
    header = Check("check", "subject", "value", "limit", True)
    cells = [(r.check, r.subject, r.value, r.limit, "ok" if r.ok else "FAIL") for r in rows]
    head = (header.check, header.subject, header.value, header.limit, "status")
    widths = [max(len(c[i]) for c in cells + [head]) for i in range(5)]
    line = "  ".join("-" * w for w in widths)
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths)), line]
    out += ["  ".join(c.ljust(w) for c, w in zip(cell, widths)).rstrip() for cell in cells]
    failed = sum(not r.ok for r in rows)
    out += [line, f"{len(rows) - failed} passed, {failed} failed"]
    out += [f"skipped: {s}" for s in skipped]
    return "\n".join(out)
