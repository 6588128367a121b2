"""Shared fixtures: the tiny model is trained once per test session and exported once (tests/fixture_builds.py).

The builds the selected tests need run right after collection, before the first test, each with its own budget
(SEQSERVE_TEST_BUILD_TIMEOUT, default 1800 s) instead of pytest-timeout's per-test limit; a failure names the fixture.
SEQSERVE_TEST_ARTIFACTS=DIR keeps them in DIR/tiny and DIR/tiny-bundle across sessions (made on first use), so a
GPU machine can run tests/server on artifacts made here (SEQSERVE_TEST_DEVICE=cuda, see tests/grpc_harness.py).
SEQSERVE_TEST_THREADS=N (`make test THREADS=N`) sets torch's and onnxruntime's intra-op threads in the tests
(unset: 1; 0: one per core).
"""
from __future__ import annotations

import os
from pathlib import Path

import external_tools
import pytest
from fixture_builds import ARTIFACTS, BUILDS, THREADS, SharedArtifacts, fixture_directory

if THREADS:
    # Before any test module imports torch: torch sizes its intra-op pool from these on first use.
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(THREADS)


def pytest_configure(config: pytest.Config) -> None:
    config.stash[ARTIFACTS] = SharedArtifacts()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Builds the shared fixtures the selected tests need, before any test (and its per-test timeout) starts."""
    if session.config.option.collectonly:
        return
    requested = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    artifacts = session.config.stash[ARTIFACTS]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    report = reporter.write_line if reporter is not None else print
    for name in artifacts.needed(requested & set(BUILDS)):
        try:
            artifacts.get(name, report)
        except Exception as exc:  # recorded: each test that needs it errors with this message
            report(str(exc))


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outermost: after the short test summary
def pytest_terminal_summary(terminalreporter):
    """After the short summary: one line naming the external tools whose tests were skipped, and how to get them."""
    result = yield
    line = external_tools.summary()
    if line:
        terminalreporter.write_line(line, yellow=True, bold=True)
    return result


def pytest_unconfigure(config: pytest.Config) -> None:
    if ARTIFACTS in config.stash:
        config.stash[ARTIFACTS].cleanup()


@pytest.fixture(scope="session")
def tiny_checkpoint(request) -> Path:
    """The `tiny` preset trained on its copy task (1400 steps; built before the first test, see fixture_builds)."""
    return fixture_directory(request.config, "tiny_checkpoint")


@pytest.fixture(scope="session")
def tiny_bundle(request) -> Path:
    """The tiny checkpoint exported to an fp32 bundle."""
    return fixture_directory(request.config, "tiny_bundle")


@pytest.fixture(scope="session")
def full_bundle(request) -> Path:
    """`seqserve export CKPT --out BUNDLE --int8 --fp16` of the trained tiny model (quality: its 200 held-out lines);
    built once per session like tiny_checkpoint (tests/fixture_builds.py)."""
    return fixture_directory(request.config, "full_bundle")


@pytest.fixture(scope="session")
def heldout(tiny_bundle) -> list[tuple[str, str]]:
    """The tiny bundle's held-out (source, target) pairs."""
    lines = (tiny_bundle / "heldout.tsv").read_text().splitlines()
    return [tuple(line.split("\t")) for line in lines if line]


@pytest.fixture(scope="session")
def served(tiny_bundle):
    """The shared server (tests/grpc_harness.py) for tests that only need a healthy one (they must leave it idle)."""
    from grpc_harness import Served  # onnxruntime and grpc only for the tests that serve

    s = Served(tiny_bundle).wait_ready()
    yield s
    s.stop()
