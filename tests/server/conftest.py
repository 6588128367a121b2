"""Server fixtures: the tiny ONNX bundle served for real (see tests/grpc_harness.py; the shared `served` server and
the held-out pairs are in tests/conftest.py)."""
from __future__ import annotations

import pytest
from grpc_harness import Served
from token_choice_bundle import with_token_choice

from seqserve.server.app import App


@pytest.fixture(scope="session")
def reference(tiny_checkpoint, served):
    """source -> (token ids, text) of PyTorch's reference greedy decoding at the server's default max_new_tokens.

    The oracle for the server's greedy outputs (docs/architecture.md, oracles 2 and 3): the tiny model copies most
    held-out lines but not all, so its held-out targets are not.
    """
    from seqserve.model.checkpoint import load_checkpoint
    from seqserve.model.decoding import greedy_decode
    from seqserve.v1 import seqserve_pb2 as pb

    model, tok = load_checkpoint(tiny_checkpoint)
    max_new = served.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).limits.default_max_new_tokens
    cache: dict[str, tuple[list[int], str]] = {}

    def decode(source: str) -> tuple[list[int], str]:
        if source not in cache:
            ids = greedy_decode(model, [tok.encode(source).ids], max_new)[0]
            cache[source] = ids, tok.decode(ids, skip_special_tokens=True)
        return cache[source]

    return decode


@pytest.fixture
def make_server(tiny_bundle):
    """A private server with its own settings (stopped at the end of the test)."""
    servers = []

    def make(app_class=App, ready: bool = True, **overrides) -> Served:
        s = Served(overrides.pop("bundle", tiny_bundle), app_class=app_class, **overrides)  # bundle: NAME=DIR specs
        servers.append(s)
        return s.wait_ready() if ready else s

    yield make
    for s in servers:
        s.stop()


@pytest.fixture(scope="session")
def choice_bundle(tiny_bundle, tmp_path_factory):
    """The tiny bundle with the token-choice outputs on its fp32 in-place decoder (token_choice_bundle.py)."""
    return with_token_choice(tiny_bundle, tmp_path_factory.mktemp("choice") / "bundle")
