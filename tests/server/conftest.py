"""Server fixtures: the tiny ONNX bundle served for real (see tests/grpc_harness.py)."""
from __future__ import annotations

import pytest

from grpc_harness import Served
from server.app import App


@pytest.fixture(scope="session")
def heldout(tiny_bundle) -> list[tuple[str, str]]:
    lines = (tiny_bundle / "heldout.tsv").read_text().splitlines()
    return [tuple(line.split("\t")) for line in lines if line]


@pytest.fixture(scope="session")
def served(tiny_bundle):
    """The shared server for tests that only need a healthy one (they must leave it idle)."""
    s = Served(tiny_bundle).wait_ready()
    yield s
    s.stop()


@pytest.fixture
def make_server(tiny_bundle):
    """A private server with its own settings (stopped at the end of the test)."""
    servers = []

    def make(app_class=App, ready: bool = True, **overrides) -> Served:
        s = Served(tiny_bundle, app_class=app_class, **overrides)
        servers.append(s)
        return s.wait_ready() if ready else s

    yield make
    for s in servers:
        s.stop()
