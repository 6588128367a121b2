"""A model whose generation_config.json leaves max_length unset: served with each side's defaults, the outputs equal
transformers' `generate()` with no arguments, which adds the decoder start token to its default max_length 20 and so
generates 20 tokens (contract/generation.py HF_DEFAULT_MAX_NEW_TOKENS)."""
from __future__ import annotations

import json

import hf_fixtures
import pytest
import torch
from grpc_harness import Served

from seqserve.cli.main import main
from seqserve.v1 import seqserve_pb2 as pb

pytest.importorskip("transformers")
N_SENTENCES = 50


@pytest.fixture(scope="module")
def unset_length(tmp_path_factory):
    """(server, HF model, tokenizer) of a Marian fixture whose generation_config.json has no max_length."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    root = tmp_path_factory.mktemp("marian-default-length")
    hf_dir = hf_fixtures.build_marian(root / "hf")
    path = hf_dir / "generation_config.json"
    generation = json.loads(path.read_text())
    del generation["max_length"]
    path.write_text(json.dumps(generation))
    assert "max_length" not in json.loads((hf_dir / "config.json").read_text())
    checkpoint, bundle = root / "checkpoint", root / "bundle"
    assert main(["import", str(hf_dir), "--out", str(checkpoint), "--quiet", "--no-verify"]) == 0
    assert main(["export", str(checkpoint), "--out", str(bundle), "--quiet"]) == 0
    model = AutoModelForSeq2SeqLM.from_pretrained(str(hf_dir)).eval()
    assert model.generation_config.max_length is None  # transformers applies its own default
    server = Served(bundle).wait_ready()
    yield server, model, AutoTokenizer.from_pretrained(str(hf_dir))
    server.stop()


def test_served_defaults_equal_transformers_generate_without_arguments(unset_length):
    server, model, tok = unset_length
    texts = [s for s in hf_fixtures.real_strings()[1::2] if s.strip()][:N_SENTENCES]
    eos = model.generation_config.eos_token_id
    reply = server.stub.GenerateBatch(pb.GenerateBatchRequest(inputs=texts), timeout=300)  # no options: the model's
    at_the_limit = 0
    for text, got in zip(texts, reply.results):
        ids = tok(text).input_ids
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor([ids]),
                                 attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        row = out[0].tolist()[1:]  # without the decoder start token
        want = row[: row.index(eos)] if eos in row else row
        assert list(got.token_ids) == want, text
        at_the_limit += len(row) == 20
    assert at_the_limit > 0  # some outputs reach the default length, so a length one short would differ
    info = server.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert info.limits.default_max_new_tokens == 20
