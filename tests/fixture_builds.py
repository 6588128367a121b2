"""The shared trained fixtures (tiny_checkpoint, tiny_bundle, full_bundle), built once per session with their own
budget, outside pytest-timeout's per-test limit.

tests/conftest.py builds the ones the selected tests need right after collection (before any test runs), each in a
subprocess that is killed when it runs past SEQSERVE_TEST_BUILD_TIMEOUT seconds: on a loaded 2-core machine training
alone can take longer than one test may. A failed build makes every test that needs it error with a message naming
the fixture, instead of a bare per-test "Timeout". A fixture only reached through request.getfixturevalue is built
on first use, with pytest-timeout's alarm paused meanwhile.

SEQSERVE_TEST_ARTIFACTS=DIR keeps tiny_checkpoint and tiny_bundle in DIR/tiny and DIR/tiny-bundle across sessions
(made on first use: a directory counts as built when its last-written file exists).
SEQSERVE_TEST_THREADS=N (`make test THREADS=N`): torch and onnxruntime intra-op threads in the builds, the tests'
own torch and the served test servers (tests/grpc_harness.py); unset = 1, 0 = the libraries' default (one per core).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

KEEP = os.environ.get("SEQSERVE_TEST_ARTIFACTS")
# Tests check correctness, not speed: one thread unless told otherwise (a busy machine is the common case, and
# threads that outnumber the free cores made training the tiny model ten times slower there).
THREADS = int(os.environ.get("SEQSERVE_TEST_THREADS") or 1)
BUILD_TIMEOUT_S = float(os.environ.get("SEQSERVE_TEST_BUILD_TIMEOUT") or 1800)
_TAIL_LINES = 30  # of a failed build's output, shown in the error
_EXPORT_FP32 = "import sys; from seqserve.export.bundle import export_fp32; export_fp32(sys.argv[1], sys.argv[2])"


@dataclass(frozen=True)
class Build:
    what: str  # says what the build does, in the messages
    directory: str  # its name under SEQSERVE_TEST_ARTIFACTS or the session's temporary directory
    written_last: str  # the file whose presence means the directory is complete
    needs: str | None  # the fixture whose directory the command reads
    keep: bool  # whether SEQSERVE_TEST_ARTIFACTS keeps it across sessions

    def command(self, out: Path, needed: Path | None) -> list[str]:
        cli = [sys.executable, "-m", "seqserve.cli"]
        threads = ["--threads", str(THREADS)] if THREADS else []
        if self.directory == "tiny":
            return [*cli, "train", "--preset", "tiny", "--out", str(out), "--quiet", *threads]
        if self.directory == "tiny-bundle":
            return [sys.executable, "-c", _EXPORT_FP32, str(needed), str(out)]
        return [*cli, "export", str(needed), "--out", str(out), "--int8", "--fp16", "--quiet"]


BUILDS: dict[str, Build] = {
    "tiny_checkpoint": Build("training the tiny model", "tiny", "metrics.json", None, True),
    "tiny_bundle": Build("exporting the tiny model to an fp32 bundle", "tiny-bundle", "manifest.json",
                         "tiny_checkpoint", True),
    "full_bundle": Build("exporting the tiny model with --int8 --fp16 (and measuring their quality)", "full-bundle",
                         "manifest.json", "tiny_checkpoint", False),
}


class BuildFailed(Exception):
    pass


@dataclass
class SharedArtifacts:
    """Per session: where each fixture's directory is, or why it could not be built."""

    scratch: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="seqserve-fixtures-")))
    built: dict[str, Path] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    def needed(self, names: set[str]) -> list[str]:
        """The builds among these fixture names, dependencies first (BUILDS lists them in that order)."""
        return [name for name in BUILDS if name in names]

    def get(self, name: str, report=print) -> Path:
        """The fixture's directory, built now if it is not yet; raises BuildFailed naming the fixture."""
        if name in self.built:
            return self.built[name]
        if name not in self.failed:
            self._build(name, report)
        if name in self.failed:
            raise BuildFailed(self.failed[name])
        return self.built[name]

    def _build(self, name: str, report) -> None:
        build = BUILDS[name]
        needed = None
        if build.needs:
            try:
                needed = self.get(build.needs, report)
            except BuildFailed as exc:
                self.failed[name] = f"shared fixture {name} needs {build.needs}, which could not be built: {exc}"
                return
        out = Path(KEEP) / build.directory if KEEP and build.keep else self.scratch / build.directory
        if (out / build.written_last).is_file():
            self.built[name] = out
            return
        out.mkdir(parents=True, exist_ok=True)
        report(f"shared fixture {name}: {build.what} (budget {BUILD_TIMEOUT_S:.0f} s, SEQSERVE_TEST_BUILD_TIMEOUT)")
        started = time.monotonic()
        error, output = _run(build.command(out, needed))
        seconds = time.monotonic() - started
        if error is None and not (out / build.written_last).is_file():
            error = f"exited 0 but wrote no {build.written_last}"
        if error is None:
            report(f"shared fixture {name}: built in {seconds:.0f} s -> {out}")
            self.built[name] = out
        else:
            ended = f"; its output ended with:\n{output}\n" if output else ""
            self.failed[name] = f"{build.what} for the shared fixture {name} {error} after {seconds:.0f} s{ended}"

    def cleanup(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


def _run(command: list[str]) -> tuple[str | None, str]:
    """(None on success, else what went wrong: "timed out ..." / "failed with exit code N"; its output's last lines)."""
    env = {**os.environ, **({"OMP_NUM_THREADS": str(THREADS)} if THREADS else {})}
    try:
        done = subprocess.run(command, env=env, timeout=BUILD_TIMEOUT_S, capture_output=True, text=True)
    except subprocess.TimeoutExpired:  # subprocess.run kills the child before raising
        return f"timed out (SEQSERVE_TEST_BUILD_TIMEOUT={BUILD_TIMEOUT_S:.0f} s)", ""
    tail = "\n".join((done.stdout + done.stderr).splitlines()[-_TAIL_LINES:])
    if done.returncode < 0:
        return f"was killed by {signal.Signals(-done.returncode).name}", tail
    if done.returncode != 0:
        return f"failed with exit code {done.returncode}", tail
    return None, tail


def fixture_directory(config: pytest.Config, name: str) -> Path:
    """What the fixture returns; outside the pre-build (getfixturevalue) the build pauses the per-test alarm."""
    artifacts = config.stash[ARTIFACTS]
    try:
        if name in artifacts.built or name in artifacts.failed:
            return artifacts.get(name)
        with _per_test_alarm_paused():
            return artifacts.get(name)
    except BuildFailed as exc:
        message = str(exc)
    pytest.fail(message, pytrace=False)  # outside the except: the message alone, no chained traceback


class _per_test_alarm_paused:
    """Pauses pytest-timeout's signal-method alarm (ITIMER_REAL) and restarts it with the time that was left."""

    def __enter__(self) -> None:
        main = threading.current_thread() is threading.main_thread()
        self.left = signal.setitimer(signal.ITIMER_REAL, 0)[0] if main else 0.0

    def __exit__(self, *exc) -> None:
        if self.left > 0:
            signal.setitimer(signal.ITIMER_REAL, self.left)


ARTIFACTS = pytest.StashKey[SharedArtifacts]()
