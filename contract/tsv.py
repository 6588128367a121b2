"""`source<TAB>target` files: bring-your-own corpora, and the held-out split a checkpoint and its bundle carry.

The held-out split has one name everywhere (HELDOUT): the checkpoint writes it, export copies it into the bundle,
and quality, bench and the load test read it.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

Pair = tuple[str, str]
HELDOUT = "heldout.tsv"  # the held-out (test) split, in a checkpoint and in its bundle
_MAX_REPORTED_LINES = 20


class CorpusError(ValueError):
    """A TSV corpus with malformed lines; .line_numbers lists all of them (1-based)."""

    def __init__(self, message: str, line_numbers: list[int]) -> None:
        super().__init__(message)
        self.line_numbers = line_numbers


def _malformed(line: str) -> bool:
    parts = line.split("\t")
    return len(parts) != 2 or not parts[0].strip() or not parts[1].strip()


def read_tsv(path: str | Path) -> list[Pair]:
    """Bring-your-own corpus, one `source<TAB>target` per line; any malformed line is an error, never dropped."""
    # split("\n") rather than splitlines(): the latter also breaks on characters such as U+2028 inside text.
    lines = Path(path).read_text(encoding="utf-8").split("\n")
    lines = [line.removesuffix("\r") for line in lines]  # tolerate CRLF files
    while lines and not lines[-1].strip():
        lines.pop()  # blank trailing lines are not data
    bad = [i for i, line in enumerate(lines, start=1) if _malformed(line)]
    if bad:
        shown = ", ".join(map(str, bad[:_MAX_REPORTED_LINES]))
        more = f" and {len(bad) - _MAX_REPORTED_LINES} more" if len(bad) > _MAX_REPORTED_LINES else ""
        raise CorpusError(f"{path}: {len(bad)} malformed line(s), expected 'source<TAB>target' with both sides "
                          f"non-empty: lines {shown}{more}", bad)
    return [(src, tgt) for src, tgt in (line.split("\t") for line in lines)]


def write_tsv(pairs: Iterable[Pair], path: str | Path) -> None:
    """Writes pairs so read_tsv reads them back exactly; refuses text that would break the format."""
    rows = []
    for i, (src, tgt) in enumerate(pairs):
        if any(c in side for side in (src, tgt) for c in "\t\n\r") or not src.strip() or not tgt.strip():
            raise ValueError(f"pair {i} cannot be written as TSV (empty side, TAB or newline): {(src, tgt)!r}")
        rows.append(f"{src}\t{tgt}\n")
    Path(path).write_text("".join(rows), encoding="utf-8", newline="\n")


def heldout_pairs(directory: str | Path, n: int | None = None) -> list[Pair]:
    """The first n (all when None) pairs of a checkpoint's or bundle's held-out split; [] when it has none."""
    path = Path(directory) / HELDOUT
    return read_tsv(path)[:n] if path.is_file() else []
