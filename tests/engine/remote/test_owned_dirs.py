"""engine/remote/owned_dirs.py: a private directory names its owner; making one sweeps those of its kind whose owner is
dead,
and only those (a live owner's, one without a record, one made in another pid namespace stay)."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from seqserve.engine.remote import owned_dirs


@pytest.fixture
def prefix():
    """A kind of directory of this test alone (removed after it)."""
    kind = f"seqserve-test-{uuid.uuid4().hex[:8]}-"
    yield kind
    for path in Path(tempfile.gettempdir()).glob(f"{kind}*"):
        shutil.rmtree(path, ignore_errors=True)


def _made_by_a_process_that_exited(prefix: str):
    out = subprocess.run([sys.executable, "-c", "import sys; from seqserve.engine.remote import owned_dirs; "
                          "print(owned_dirs.make(sys.argv[1]))", prefix], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def test_a_directory_whose_owner_exited_is_swept_by_the_next_one_made(prefix):
    stale = _made_by_a_process_that_exited(prefix)
    assert stale.is_dir() and stat.S_IMODE(stale.stat().st_mode) == 0o700
    fresh = owned_dirs.make(prefix)
    assert not stale.exists() and fresh.is_dir()
    assert owned_dirs.sweep(prefix) == []  # its own owner lives: it stays


def test_a_reused_pid_is_not_taken_for_the_owner(prefix):
    path = owned_dirs.make(prefix)
    pid, start, namespace = (path / owned_dirs.OWNER).read_text().split()
    (path / owned_dirs.OWNER).write_text(f"{pid} {int(start) - 1} {namespace}")  # the pid, an earlier process's start
    assert owned_dirs.sweep(prefix) == [path]


def test_what_is_not_ours_to_judge_stays(prefix):
    no_record = Path(tempfile.mkdtemp(prefix=prefix))
    elsewhere = _made_by_a_process_that_exited(prefix)
    pid, start, _ = (elsewhere / owned_dirs.OWNER).read_text().split()
    (elsewhere / owned_dirs.OWNER).write_text(f"{pid} {start} pid:[1]")  # made in another container's namespace
    not_a_dir = Path(tempfile.gettempdir()) / f"{prefix}file"
    not_a_dir.write_text("")
    assert owned_dirs.sweep(prefix) == []
    assert no_record.is_dir() and elsewhere.is_dir() and not_a_dir.is_file()
    os.remove(not_a_dir)
