"""The Makefile's targets, run by make itself: training counts as done only once metrics.json exists, a bundle is
served only after `seqserve verify` passed, and a recipe that fails leaves no target behind (.DELETE_ON_ERROR).

A stand-in `seqserve` script records each call, so no model is trained or served here."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="make is not installed")

# Records its arguments; `verify` writes the marker as the real one does, then fails when FAIL_VERIFY is set (a
# recipe that made its target and then failed).
STAND_IN = """#!/bin/sh
echo "$*" >> "$CALLS"
if [ "$1" = verify ]; then
    echo '{}' > "$2/verified.json"
    [ -z "$FAIL_VERIFY" ]
fi
"""


@pytest.fixture
def tree(tmp_path) -> Path:
    """A venv that make counts as installed (its bin/seqserve is the stand-in), a finished checkpoint, a bundle."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "seqserve").write_text(STAND_IN)
    (bin_dir / "seqserve").chmod(0o755)
    (tmp_path / "venv" / ".installed").touch()  # newer than pyproject.toml
    checkpoint, bundle = tmp_path / "artifacts" / "default", tmp_path / "artifacts" / "bundle"
    checkpoint.mkdir(parents=True)
    bundle.mkdir()
    _write(checkpoint / "model.safetensors", 100)
    _write(checkpoint / "metrics.json", 101)
    _write(bundle / "manifest.json", 102)
    return tmp_path


def _write(path: Path, mtime: int) -> None:
    path.write_text("{}")
    os.utime(path, (mtime, mtime))  # make compares modification times: set them explicitly


def _make(tree: Path, *args: str, **env: str) -> tuple[int, list[str]]:
    calls = tree / "calls.txt"
    calls.write_text("")
    done = subprocess.run([MAKE, "-C", str(ROOT), f"VENV={tree / 'venv'}", f"ARTIFACTS={tree / 'artifacts'}", *args],
                          env={**os.environ, "CALLS": str(calls), **env}, capture_output=True, text=True, timeout=60)
    return done.returncode, [line.split()[0] for line in calls.read_text().splitlines()]


def test_serve_runs_verify_first_and_then_serves_the_verified_bundle(tree):
    assert _make(tree, "serve") == (0, ["verify", "serve"])
    assert (tree / "artifacts" / "bundle" / "verified.json").is_file()
    assert _make(tree, "serve") == (0, ["serve"])  # verified and up to date: served at once
    _write(tree / "artifacts" / "bundle" / "manifest.json", 2**31)  # a re-export
    assert _make(tree, "serve") == (0, ["verify", "serve"])


def test_a_failed_verify_serves_nothing_and_leaves_no_marker(tree):
    code, calls = _make(tree, "serve", FAIL_VERIFY="1")
    assert code != 0 and calls == ["verify"]
    assert not (tree / "artifacts" / "bundle" / "verified.json").exists()  # .DELETE_ON_ERROR removed it
    assert _make(tree, "serve", FAIL_VERIFY="1")[1] == ["verify"]  # and the next run does not serve either


def test_weights_without_metrics_are_an_unfinished_training_run(tree):
    (tree / "artifacts" / "default" / "metrics.json").unlink()  # what a crashed run leaves (model.safetensors stays)
    code, calls = _make(tree, "serve")
    assert code == 0 and calls == ["train", "export", "verify", "serve"]


def test_threads_reach_train_verify_serve_and_test(tree):
    done = subprocess.run([MAKE, "-n", "-C", str(ROOT), f"VENV={tree / 'venv'}", f"ARTIFACTS={tree / 'none'}",
                           "THREADS=3", "serve", "test"], capture_output=True, text=True, timeout=60)
    lines = done.stdout.splitlines()
    assert any(" train " in line and line.endswith("--threads 3") for line in lines)
    assert any(" verify " in line and line.endswith("--threads 3") for line in lines)
    assert any(line.strip() == "--intra-op-threads 3" for line in lines)  # serve's continuation line
    assert any(line.startswith("SEQSERVE_TEST_THREADS=3 ") and "pytest" in line for line in lines)


def test_the_venv_install_shows_progress_and_brings_sacremoses(tmp_path):
    """`make venv` takes minutes: pip prints what it fetches (no -q). The hf extra brings sacremoses, without which
    transformers warns on every Marian tokenizer load."""
    done = subprocess.run([MAKE, "-n", "-C", str(ROOT), f"VENV={tmp_path / 'venv'}", "venv"], capture_output=True,
                          text=True, timeout=60)
    installs = [shlex.split(line) for line in done.stdout.splitlines() if "pip install" in line]
    assert len(installs) == 2 and all("-q" not in words and "--quiet" not in words for words in installs)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(re.match(r"sacremoses\b", requirement) for requirement in extras["hf"])


def _train_call(tree: Path, *args: str) -> str:
    (tree / "artifacts" / "default" / "metrics.json").unlink()  # no finished training: make trains
    assert _make(tree, "serve", *args)[0] == 0
    return next(line for line in (tree / "calls.txt").read_text().splitlines() if line.startswith("train "))


def test_train_minutes_bounds_the_training_of_make_serve(tree):
    words = shlex.split(_train_call(tree, "TRAIN_MINUTES=20"))
    assert words[words.index("--max-minutes") + 1] == "20"


def test_without_train_minutes_training_runs_the_whole_preset(tree):
    assert "--max-minutes" not in _train_call(tree)
