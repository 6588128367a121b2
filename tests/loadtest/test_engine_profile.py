"""loadtest/engine_profile's split: onnxruntime's time goes to the decoder and the encoder by the time each spent in it."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from seqserve.loadtest.engine_profile import profile_sources, split

RUN = ("~", 0, "<built-in method onnxruntime.capi.onnxruntime_pybind11_state.run_with_iobinding>")
WRAPPER = ("/site-packages/onnxruntime/capi/onnxruntime_inference_collection.py", 538, "run_with_iobinding")
DECODER = ("/seqserve/engine/runtime/inplace_cache.py", 94, "run")
ENCODER = ("/seqserve/engine/runtime/runner.py", 80, "run_encoder")


def test_onnxruntime_time_is_split_by_time_spent_not_by_calls():
    # 90 cheap decoder steps (0.2 s in onnxruntime) and 10 expensive encoder calls (0.8 s): pstats' layout,
    # (calls, primitive calls, own s, cumulative s, {caller: (calls, primitive calls, own s, cumulative s)})
    stats = SimpleNamespace(stats={
        RUN: (100, 100, 1.0, 1.0, {WRAPPER: (100, 100, 1.0, 1.0)}),
        WRAPPER: (100, 100, 0.01, 1.01, {DECODER: (90, 90, 0.009, 0.209), ENCODER: (10, 10, 0.001, 0.801)}),
        DECODER: (90, 90, 0.0, 0.209, {}),
        ENCODER: (10, 10, 0.0, 0.801, {}),
    })
    parts = split(stats)
    assert parts["onnxruntime: encoder"] == pytest.approx(0.801 / 1.01)
    assert parts["onnxruntime: decoder step"] == pytest.approx(0.209 / 1.01)


def test_a_bundle_without_held_out_inputs_profiles_the_random_sources_bench_hf_decodes(tmp_path):
    # An imported model's bundle has no heldout.tsv: before, the profile decoded nothing at all.
    special = {"pad_id": 0, "eos_id": 1, "unk_id": 2, "decoder_start_id": 0}
    runner = SimpleNamespace(bundle=tmp_path, manifest=SimpleNamespace(model={"vocab_size": 50},
                                                                       special_tokens=special))
    sources = profile_sources(runner, tokenizer=None, n=5)
    assert len(sources) == 5 and all(s[-1] == 1 and len(s) == 16 for s in sources)
    assert not {0, 1, 2} & {i for s in sources for i in s[:-1]}
    assert len({tuple(s) for s in sources}) == 5
