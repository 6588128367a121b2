"""The machinery of the hostile-import tests (tests/model/test_hostile_import.py, test_hostile_t5_import.py): each
case prepared from a healthy model directory, every import run in one child (tests/import_runner.py), and the
assertions a refusal must pass."""
from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from import_runner import RSS_MARGIN, Batch, import_argv, run_batch

HEALTHY = "healthy"  # the pristine directory's import: the baseline peak RSS, and the checkpoint to compare with


def snapshot(directory: Path) -> dict[str, str]:
    """Every entry under directory (symlinks not followed) -> what it is: a link's target, a file's sha256."""
    found = {}
    for path in sorted(directory.rglob("*")):
        name = str(path.relative_to(directory))
        if path.is_symlink():
            found[name] = f"link {os.readlink(path)}"
        elif path.is_file():
            found[name] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[name] = "directory"
    return found


def copy_of(source: Path, root: Path) -> Path:
    """root/hf, a copy of the healthy directory, beside an empty root/outside for the edits that move files out."""
    shutil.copytree(source, root / "hf")
    (root / "outside").mkdir()
    return root / "hf"


@dataclass(frozen=True)
class Case:
    hf: Path
    out: Path
    before: dict[str, str]  # snapshot(hf) before the import


@dataclass(frozen=True)
class Imports:
    cases: dict[str, Case]
    runs: Batch


def hostile(edit):
    def prepare(source: Path, root: Path) -> tuple[Path, Path]:
        hf = copy_of(source, root)
        return hf, edit(hf) or root / "ck"
    return prepare


def import_all(source: Path, cases: dict, prepared: dict, tmp_path_factory) -> Imports:
    """Every case prepared from source, then imported in one child: healthy, the hostile cases, the prepared ones."""
    found = {HEALTHY: Case(source, tmp_path_factory.mktemp(HEALTHY) / "ck", {})}
    for name, prepare in {**{case: hostile(edit) for case, (edit, _) in cases.items()}, **prepared}.items():
        hf, out = prepare(source, tmp_path_factory.mktemp(name))
        found[name] = Case(hf, out, snapshot(hf))
    runs = run_batch({name: import_argv(case.hf, case.out) for name, case in found.items()},
                     tmp_path_factory.mktemp("batch"))
    healthy = runs[HEALTHY]
    assert healthy.code == 0 and healthy.traceback is None, (healthy.traceback, healthy.stderr)
    return Imports(found, runs)


def assert_refused(imports: Imports, case: str, message: str) -> None:
    """Exit 2, one error line naming the file and the field, nothing written, within the healthy import's RSS."""
    hf, out, before = imports.cases[case].hf, imports.cases[case].out, imports.cases[case].before
    run = imports.runs[case]
    assert run.traceback is None, run.traceback
    assert run.code == 2, f"exit {run.code}\n{run.stderr[-2000:]}"
    last = run.stderr.splitlines()[-1] if run.stderr.strip() else ""
    assert last.startswith("seqserve import: error: ") and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert message in run.stderr and str(hf) in run.stderr, run.stderr
    assert snapshot(hf) == before  # nothing written into (or removed from) the source
    assert not (out / "metrics.json").exists() and not (hf.parent / "ck").exists()
    limit = imports.runs[HEALTHY].peak_rss + RSS_MARGIN
    assert run.peak_rss <= limit, (f"peak RSS {run.peak_rss >> 20} MiB > the healthy import's + {RSS_MARGIN >> 20} "
                                   f"MiB ({limit >> 20} MiB), first exceeded by {imports.runs.first_over(limit)}")
