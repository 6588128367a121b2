"""`seqserve bench --hf DIR` on a tiny random Marian (tests/hf_fixtures.py): imported for the engine, converted by
CTranslate2's own TransformersConverter, and run by transformers' generate, the reference of every row's tokens."""
from __future__ import annotations

import hf_fixtures
import pytest

from seqserve.contract.manifest import load_manifest
from seqserve.loadtest import bench_config, hf_models
from seqserve.loadtest.bench_rows import CTRANSLATE2, ENGINE, GRAPH_LOOP, TRANSFORMERS, RowSpec, Workload, run_row

SOURCES, FORCED = 6, 10


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    pytest.importorskip("transformers")
    pytest.importorskip("ctranslate2")
    from seqserve.model import hf_tokenizer

    hf_dir = hf_fixtures.build_marian(tmp_path_factory.mktemp("marian"))
    if not (hf_dir / "tokenizer.json").is_file():  # until `seqserve import` converts a Marian tokenizer itself
        hf_tokenizer.save(hf_dir, hf_dir / "tokenizer.json")
    made = hf_models.prepare(hf_dir, tmp_path_factory.mktemp("bench-hf"), with_ctranslate2=True, progress=False)
    return hf_dir, made


def _work(hf_dir, made) -> Workload:
    manifest = load_manifest(made.bundle)
    special = {int(i) for i in manifest.special_tokens.values()}
    sources = hf_models.random_sources(SOURCES, int(manifest.model["vocab_size"]), special,
                                       int(manifest.special_tokens["eos_id"]), seed=0)
    assert manifest.generation.get("forced_eos_token_id") is not None  # opus-mt forces </s> at max_length
    return Workload(sources, FORCED, 1, "cpu", made.checkpoint, made.bundle, made.ctranslate2_dir,
                    min_new_tokens=FORCED - 1, hf_dir=hf_dir, forced_eos=True)


def test_random_sources_avoid_special_ids_and_end_with_eos():
    sources = hf_models.random_sources(50, 40, {0, 1, 39}, 0, seed=3)
    assert all(len(s) == hf_models.SOURCE_TOKENS and s[-1] == 0 for s in sources)
    assert not {0, 1, 39} & {t for s in sources for t in s[:-1]}
    assert sources == hf_models.random_sources(50, 40, {0, 1, 39}, 0, seed=3)


def test_every_fp32_backend_generates_transformers_tokens(prepared):
    """Forced length (the end token suppressed until the model's forced </s>): the engine, its bare graph loop and
    CTranslate2 (converted from the same directory by its own converter) give transformers' greedy tokens."""
    hf_dir, made = prepared
    work = _work(hf_dir, made)
    reference = run_row(RowSpec(TRANSFORMERS, "fp32", 3), work).outputs
    assert [len(ids) for ids in reference] == [FORCED - 1] * SOURCES  # then the forced end token
    for spec in (RowSpec(ENGINE, "fp32", 3), RowSpec(GRAPH_LOOP, "fp32", 3), RowSpec(CTRANSLATE2, "fp32", 3)):
        assert run_row(spec, work).outputs == reference, spec.name


def test_a_beam_row_generates_transformers_best_hypothesis(prepared):
    hf_dir, made = prepared
    work = _work(hf_dir, made)
    reference = run_row(RowSpec(TRANSFORMERS, "fp32", 2, 4), work).outputs
    assert run_row(RowSpec(ENGINE, "fp32", 2, 4), work).outputs == reference


def test_hf_excludes_its_own_models_options(tmp_path):
    with pytest.raises(ValueError, match="--hf imports its own"):
        bench_config.BenchConfig(hf_dir=tmp_path, checkpoint=tmp_path)
    with pytest.raises(ValueError, match="--hf imports its own"):
        bench_config.BenchConfig(hf_dir=tmp_path, shape="base")
    cfg = bench_config.BenchConfig(hf_dir=tmp_path)
    assert cfg.random and "--hf" in cfg.command(32, 31) and "--shape" not in cfg.command(32, 31)
