"""Load-test fixtures: a fresh real server per test, and `seqserve loadtest` run in-process (locust runs in a child)."""
from __future__ import annotations

import pytest
from grpc_harness import Served

from seqserve.cli.main import main


@pytest.fixture
def server(tiny_bundle):
    """A fresh server, so its counters hold only this test's traffic."""
    s = Served(tiny_bundle).wait_ready()
    yield s
    s.stop()


@pytest.fixture
def loadtest(tiny_bundle, capsys):
    """Runs `seqserve loadtest` against a server with the tiny bundle's held-out split; returns (exit code, output)."""

    def run(server: Served, *argv: str) -> tuple[int, str]:
        code = main(["loadtest", "--target", server.address, "--heldout", str(tiny_bundle), *argv])
        captured = capsys.readouterr()
        return code, captured.out + captured.err

    return run
