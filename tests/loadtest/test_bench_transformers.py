"""The transformers-marian rows: the checkpoint's own weights in a transformers MarianMTModel, decoded by its generate
with a forced length, beside the engine on the same inputs (`seqserve bench --transformers`; on by default for
--shape base|small)."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from seqserve.cli.main import main
from seqserve.contract.tokenizer import load_tokenizer
from seqserve.contract.tsv import heldout_pairs
from seqserve.loadtest.bench_config import BenchConfig
from seqserve.loadtest.bench_rows import ENGINE, TRANSFORMERS_MARIAN, RowSpec, Workload, run_row
from seqserve.model.config import ModelConfig

FORCED, SOURCES = 9, 6
pytest.importorskip("transformers")


def _work(checkpoint, bundle) -> Workload:
    tok = load_tokenizer(bundle / "tokenizer.json")
    sources = [tok.encode(s).ids for s, _ in heldout_pairs(bundle, SOURCES)]
    return Workload(sources, FORCED, 1, "cpu", checkpoint, bundle, min_new_tokens=FORCED)


def test_the_transformers_row_generates_the_forced_length_and_the_engines_tokens(tiny_checkpoint, tiny_bundle):
    """Exact weights: greedy and beam, transformers' generate gives the engine's tokens, FORCED of them per input."""
    work = _work(tiny_checkpoint, tiny_bundle)
    for spec, engine_spec in ((RowSpec(TRANSFORMERS_MARIAN, "fp32", 4), RowSpec(ENGINE, "fp32", 4)),
                              (RowSpec(TRANSFORMERS_MARIAN, "fp32", 2, 2), RowSpec(ENGINE, "fp32", 2, 2))):
        run = run_row(spec, work)  # in this process: run_row is a spawned row's whole life
        assert run.device == "torch-cpu" and run.wall_s > 0
        assert [len(ids) for ids in run.outputs] == [FORCED] * SOURCES, spec.name
        assert sum(map(len, run.outputs)) / run.wall_s > 0
        assert run.outputs == run_row(engine_spec, work).outputs, spec.name


def test_bench_runs_the_transformers_row_beside_the_engine(tiny_checkpoint, tiny_bundle, tmp_path):
    out = tmp_path / "bench.json"
    argv = ["bench", "--checkpoint", str(tiny_checkpoint), "--bundle", str(tiny_bundle), "--transformers",
            "--no-ctranslate2", "-n", "4", "--batch-sizes", "2", "--num-beams", "1", "--max-new-tokens", str(FORCED),
            "--min-new-tokens", str(FORCED), "--out", str(out), "--quiet"]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    rows = {r["name"]: r for r in data["rows"]}
    hf = rows["transformers-marian fp32 b2"]
    assert hf["tokens_per_s"] > 0 and hf["generated_tokens"] == 4 * FORCED and hf["output_lengths"] == [FORCED] * 2
    assert hf["device"] == "torch-cpu" and hf["identical_to_reference"] == 1.0  # the graph-loop row's tokens
    (ratio,) = [r for r in data["ratios"] if r["precision"] == "fp32"]
    assert ratio["transformers"] == hf["tokens_per_s"]
    assert ratio["engine_per_transformers"] == pytest.approx(rows["seqserve-engine fp32 b2"]["tokens_per_s"]
                                                             / hf["tokens_per_s"], abs=1e-3)
    assert "--transformers" in data["command"]


def test_transformers_rows_are_planned_per_device_precision_and_on_by_default_for_the_shapes():
    from pathlib import Path

    from seqserve.loadtest.bench import plan

    cfg = BenchConfig(shape="base", batch_sizes=(1, 64), beam_batch_sizes=(16,))
    assert cfg.with_transformers and not replace(cfg, transformers=False).with_transformers
    assert not BenchConfig(checkpoint=Path("ckpt")).with_transformers
    for device, precisions in (("cpu", {"fp32"}), ("cuda", {"fp32", "fp16"})):
        rows = {(s.precision, s.batch_size, s.num_beams) for s in
                plan(replace(cfg, device=device), ["fp32", "fp16"], False, False, with_transformers=True)
                if s.backend == TRANSFORMERS_MARIAN}
        assert rows == {(p, b, n) for p in precisions for b, n in ((1, 1), (64, 1), (16, 4))}
    with pytest.raises(ValueError, match="--hf runs the original model's own transformers rows"):
        BenchConfig(hf_dir=Path("hf"), transformers=True)


def test_a_model_marian_cannot_compute_is_refused_with_the_reason(tiny_checkpoint, tmp_path):
    from seqserve.loadtest import marian_twin

    assert marian_twin.refusal(ModelConfig.load(tiny_checkpoint / "config.json")) is None
    pre_ln = ModelConfig(vocab_size=64, d_model=32, n_heads=2, norm_first=True, positions="learned")
    why = marian_twin.refusal(pre_ln)
    assert "pre-LN" in why and "learned positions" in why
    (tmp_path / "config.json").write_text(json.dumps(pre_ln.to_dict()))
    with pytest.raises(ValueError, match="cannot compute this model: learned positions"):
        marian_twin.load(tmp_path)
