"""The Python client class against a real server (`seqserve generate`: tests/cli)."""
from __future__ import annotations

import grpc
import pytest
from grpc_harness import PROVIDER

from seqserve.client.client import Client


def test_client_generate_stream_batch_and_model_info(served, heldout, reference):
    src, src2 = heldout[0][0], heldout[1][0]
    tgt, tgt2 = reference(src)[1], reference(src2)[1]  # PyTorch's greedy text
    with Client(served.address, timeout=30) as client:
        result = client.generate(src)
        assert result.text == tgt and result.finish_reason == "eos" and result.generated_tokens == len(result.token_ids)
        pieces = list(client.stream(src))
        assert all(p.result is None for p in pieces[:-1]) and pieces[-1].result.text == tgt
        assert pieces[-1].result.token_ids == result.token_ids
        assert [r.text for r in client.generate_batch([src, src2])] == [tgt, tgt2]
        sampled = client.generate(src, temperature=3.0, seed=5, top_k=10, top_p=0.9, repetition_penalty=1.1)
        assert client.generate(src, temperature=3.0, seed=5, top_k=10, top_p=0.9,
                               repetition_penalty=1.1).token_ids == sampled.token_ids
        info = client.model_info()
        assert info["execution_provider"] == PROVIDER and info["limits"]["max_new_tokens"] > 0
        with pytest.raises(ValueError, match="unknown decoding option"):
            client.generate(src, max_tokens=3)
        with pytest.raises(grpc.RpcError) as err:
            client.generate(src, top_p=2.0)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

