"""The onnxruntime greedy loop (the server's engine, which verify and the quality measurement use) reproduces
PyTorch's reference greedy decoding token for token on the trained tiny model's held-out inputs."""
from __future__ import annotations

from seqserve.checks.quality import CPU, generate
from seqserve.contract.manifest import load_manifest
from seqserve.contract.tsv import heldout_pairs
from seqserve.engine.request import FinishReason
from seqserve.engine.runtime.runner import Runner
from seqserve.model.checkpoint import load_checkpoint
from seqserve.model.decoding import greedy_decode


def test_engine_greedy_equals_pytorch_greedy_on_heldout(tiny_checkpoint, tiny_bundle):
    model, tok = load_checkpoint(tiny_checkpoint)
    manifest = load_manifest(tiny_bundle)
    pairs = heldout_pairs(tiny_bundle, n=10_000)
    assert len(pairs) == 200  # the whole held-out split of the tiny preset
    sources = [tok.encode(s).ids for s, _ in pairs]
    want = []
    for start in range(0, len(sources), 64):
        want += greedy_decode(model, sources[start : start + 64], manifest.max_new_tokens)
    got = generate(Runner(tiny_bundle, CPU, "fp32"), tok, sources, manifest.max_new_tokens)
    assert all(r.finish_reason in (FinishReason.EOS, FinishReason.LENGTH) for r in got)
    mismatches = [i for i, (r, w) in enumerate(zip(got, want)) if r.output_ids != w]
    assert not mismatches, f"{len(mismatches)} of {len(sources)} differ, first at line {mismatches[:1]}"
    # The model is trained, so these are real outputs (the copy task), not a degenerate empty sequence.
    assert sum(r.text == t for r, (_, t) in zip(got, pairs)) >= 0.9 * len(pairs)
