"""`seqserve import` on hostile T5 directories: the weight-file, confinement and output cases of
tests/model/test_hostile_import.py run on a Flan-T5 directory (tests/hf_t5.py), beside T5's own config keys and
tensors; each must exit 2 naming the file and the field, change nothing, and stay within the healthy import's RSS.
UMT5 (a relative position bias in every layer) is refused by name."""
from __future__ import annotations

from pathlib import Path

import hf_t5
import pytest
from hostile_imports import assert_refused, import_all
from test_hostile_import import CASES, PREPARED, _torch, config, set_all, set_one, tensors

pytest.importorskip("transformers")

WI = "encoder.block.0.layer.1.DenseReluDense.wi_0.weight"  # a (48, 32) weight of the tiny Flan-T5
BIAS = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
MARIAN_TENSOR = ("weights-int64", "weights-bool", "weights-one-inf")  # edit a Marian tensor: T5 versions below
# the other families' cases that read no BART config key and no Marian tensor name
SHARED = [name for name in CASES if name not in MARIAN_TENSOR and (name.startswith((
    "weights-", "header-", "tensors-", "shape-", "dtype-", "index-", "out-")) or name.endswith("symlink-out")
    or name == "tie-string")]


def _rename(name: str):
    return lambda data: data.update({name + "_renamed": data.pop(name)})


def _add(name: str):
    return lambda data: data.update({name: data[BIAS].clone()})


def _reshape(name: str):
    return lambda data: data.update({name: data[name].reshape(-1, 2 * data[name].shape[1]).clone()})


T5_CASES = {
    "umt5": (config(model_type="umt5"), ("config.json: model_type umt5 is not supported: UMT5 has a relative position "
                                         "bias in every layer")),
    "heads-0": (config(num_heads=0), "config.json: num_heads must be >= 1, got 0"),
    "d_kv-float": (config(d_kv=16.0), "config.json: d_kv must be an integer, got float 16.0"),
    "d_kv-missing": (config(d_kv=None), "config.json: d_kv is missing"),
    "layers-200k": (config(num_layers=200_000), "config.json: num_layers must be <= 1024, got 200000"),
    "layers-at-cap": (config(num_layers=1024, num_decoder_layers=1024),
                      "config.json: vocab_size=700, d_model=32, d_kv=16, num_heads=3, d_ff=48, num_layers=1024"),
    "width-x-vocab": (config(d_model=65536, vocab_size=1_000_000), "config.json: vocab_size=1000000, d_model=65536"),
    "positions-1e9": (config(n_positions=10**9), "config.json: n_positions must be <= 65536, got 1000000000"),
    "ffn-gated-silu": (config(feed_forward_proj="gated-silu"),
                       "config.json: feed_forward_proj 'gated-silu' is not supported; supported: relu, gated-gelu"),
    "buckets-2": (config(relative_attention_num_buckets=2), ("config.json: relative_attention_num_buckets=2 and "
                                                            "relative_attention_max_distance=20: T5's buckets need at "
                                                            "least 4 buckets")),
    "eps-string": (config(layer_norm_epsilon="1e-6"),
                   "config.json: layer_norm_epsilon must be a number in (0, 1), got '1e-6'"),
    "eos-list": (config(eos_token_id=[1, 2]), "config.json: eos_token_id must be an integer"),
    "tasks-list": (config(task_specific_params=["summarize: "]), "config.json: task_specific_params must be an object"),
    "prefix-int": (config(task_specific_params={"summarization": {"prefix": 3}}),
                   "config.json: task_specific_params.summarization.prefix must be a string"),
    "bias-missing": (tensors(_rename(BIAS)), f"model.safetensors: tensor '{BIAS}' is missing"),
    "tensor-extra": (tensors(_add(BIAS + "2")), f"model.safetensors: tensor(s) ['{BIAS}2'] have no place"),
    "lm_head-shape": (tensors(_reshape("lm_head.weight")),
                      "model.safetensors: lm_head.weight has shape (350, 64), the config implies (700, 32)"),
    "weights-one-inf-t5": (tensors(set_one(WI, _torch("float32"), float("inf"))),
                           f"model.safetensors: tensor {WI!r} holds NaN or infinite values (1 of 1536"),
    "weights-all-nan-t5": (tensors(set_all(float("nan"))), "' holds NaN or infinite values"),
    "weights-int64-t5": (tensors(set_one(WI, _torch("int64"))), f"tensor {WI!r} has dtype I64"),
    "weights-bool-t5": (tensors(set_one(WI, _torch("bool"))), f"tensor {WI!r} has dtype BOOL"),
    "float64-beyond-float32-t5": (tensors(set_one(WI, _torch("float64"), 1e300)),
                                  f"tensor {WI!r} holds NaN or infinite values"),
    "tensor-stored-twice-t5": (tensors(lambda data: data.update({"model." + WI: data[WI].clone()})),
                               "is also in model.safetensors; each weight must be stored once"),
}
CASES_HERE = {**{name: CASES[name] for name in SHARED}, **T5_CASES}


@pytest.fixture(scope="module")
def imports(tmp_path_factory):
    flan = hf_t5.build(hf_t5.FLAN, tmp_path_factory.mktemp("flan") / "hf")
    prepared = {name: PREPARED[name] for name in ("shards-and-links", "cache-snapshot")}
    return import_all(flan, CASES_HERE, prepared, tmp_path_factory)


def test_the_shared_cases_are_most_of_the_other_families(imports):
    assert len(SHARED) >= 20


@pytest.mark.parametrize("case", CASES_HERE)
def test_a_hostile_t5_directory_is_refused_naming_the_file_and_field(case, imports):
    assert_refused(imports, case, CASES_HERE[case][1])


@pytest.mark.parametrize("name", ["shards-and-links", "cache-snapshot"])
def test_sharded_and_cached_t5_directories_import(imports, name):
    from safetensors.torch import load_file

    run = imports.runs[name]
    assert run.code == 0 and run.traceback is None, (run.traceback, run.stderr)
    ours, theirs = (load_file(Path(imports.cases[n].out) / "model.safetensors") for n in (name, "healthy"))
    assert ours.keys() == theirs.keys() and all(ours[k].equal(theirs[k]) for k in ours)
