"""`seqserve bench` on the tiny model: every row runs, the JSON has every field, and the oracles agree; the graph-loop
row, forced lengths and beam rows on a tiny random-weight model made by loadtest/shapes.py."""
from __future__ import annotations

import json

import pytest

from seqserve.cli.main import main
from seqserve.contract.manifest import load_manifest
from seqserve.contract.tokenizer import load_tokenizer
from seqserve.contract.tsv import heldout_pairs
from seqserve.loadtest import bench_config, shapes
from seqserve.loadtest.bench import row_json
from seqserve.loadtest.bench_rows import CTRANSLATE2, ENGINE, GRAPH_LOOP, RowRun, RowSpec, Workload, run_row
from seqserve.model.config import ModelConfig

N, BATCHES, MAX_NEW = 12, (1, 4), 40
BEAMS, BEAM_BATCHES = 4, (1, 4)
ROW_FIELDS = {"name": str, "backend": str, "precision": str, "batch_size": int, "device": str, "n_inputs": int,
              "generated_tokens": int, "wall_s": float, "tokens_per_s": float, "peak_rss_mb": float,
              "identical_to_reference": float, "num_beams": int}
EXPECTED_ROWS = ({("pytorch-no-cache", "fp32", 1, 1), ("pytorch-kv-cache", "fp32", 1, 1)}
                 | {(backend, p, b, 1) for backend in ("seqserve-engine", "graph-loop", "ctranslate2")
                    for p in ("fp32", "int8") for b in BATCHES}
                 | {(backend, p, b, BEAMS) for backend in ("seqserve-engine", "ctranslate2") for p in ("fp32", "int8")
                    for b in BEAM_BATCHES})


@pytest.fixture(scope="module")
def report(tiny_checkpoint, tmp_path_factory):
    """One bench run without --bundle, so it also exports the fp32 + int8 bundle and converts to CTranslate2 itself."""
    pytest.importorskip("ctranslate2")
    out = tmp_path_factory.mktemp("bench")
    argv = ["bench", "--checkpoint", str(tiny_checkpoint), "-n", str(N), "--batch-sizes", ",".join(map(str, BATCHES)),
            "--max-new-tokens", str(MAX_NEW), "--beam-batch-sizes", ",".join(map(str, BEAM_BATCHES)),
            "--threads", "1", "--out", str(out / "bench.json"),
            "--markdown", str(out / "bench.md"), "--quiet"]
    assert main(argv) == 0
    return json.loads((out / "bench.json").read_text()), (out / "bench.md").read_text()


def test_every_row_runs_with_every_field(report):
    data, _ = report
    rows = {r["name"]: r for r in data["rows"]}
    assert {(r["backend"], r["precision"], r["batch_size"], r["num_beams"]) for r in rows.values()} == EXPECTED_ROWS
    assert len(rows) == len(EXPECTED_ROWS) and data["skipped"] == []
    for row in rows.values():
        for name, kind in ROW_FIELDS.items():
            assert isinstance(row[name], kind), (row["name"], name)
        assert row["n_inputs"] == N and row["generated_tokens"] > N and row["peak_rss_mb"] > 0
        assert row["tokens_per_s"] == pytest.approx(row["generated_tokens"] / row["wall_s"], rel=1e-3)
        if row["batch_size"] == 1:
            # the row rounds it to 3 decimals (a microsecond)
            assert row["mean_latency_ms_batch1"] == pytest.approx(1e3 * row["wall_s"] / N, rel=1e-3, abs=1e-3)
        else:
            assert row["mean_latency_ms_batch1"] is None


def test_exact_oracles_are_identical_to_the_reference(report):
    """Cached == uncached PyTorch, onnxruntime fp32 (engine and graph-loop) == PyTorch, CTranslate2 fp32 == PyTorch,
    at every batch size; beams: the engine's at every batch size == its batch-1 row == CTranslate2's beam search."""
    data, _ = report
    assert data["reference"] == "pytorch-kv-cache fp32 b1"
    assert data["beam_reference"] == f"seqserve-engine fp32 b1 beam{BEAMS}"
    beams = [r for r in data["rows"] if r["precision"] == "fp32" and r["num_beams"] == BEAMS]
    assert len(beams) == 2 * len(BEAM_BATCHES) and all(r["identical_to_reference"] == 1.0 for r in beams)
    exact = [r for r in data["rows"] if r["precision"] == "fp32" and r["num_beams"] == 1]
    assert len(exact) == 2 + 3 * len(BATCHES)
    assert all(r["identical_to_reference"] == 1.0 for r in exact), [(r["name"], r["identical_to_reference"])
                                                                     for r in exact]
    assert len({r["generated_tokens"] for r in exact}) == 1


def test_rows_run_in_their_own_processes(report):
    """An engine row never imports torch, so its peak RSS is below a PyTorch row's; a shared process would not be."""
    rows = {r["name"]: r for r in report[0]["rows"]}
    assert rows["seqserve-engine fp32 b1"]["peak_rss_mb"] < rows["pytorch-kv-cache fp32 b1"]["peak_rss_mb"]
    assert rows["ctranslate2 fp32 b1"]["peak_rss_mb"] < rows["pytorch-kv-cache fp32 b1"]["peak_rss_mb"]
    assert rows["seqserve-engine fp32 b1"]["device"] == "CPUExecutionProvider"
    assert rows["graph-loop fp32 b1"]["graph"] == rows["seqserve-engine fp32 b1"]["graph"] == "decoder_inplace"


def test_machine_command_and_field_meanings_are_recorded(report):
    data, _ = report
    machine = data["machine"]
    assert machine["cpu"] and machine["logical_cores"] >= 1 and machine["ram_gib"] > 0
    assert machine["onnxruntime_providers_used"] == ["CPUExecutionProvider"]
    assert {"torch", "ctranslate2", "numpy"} <= set(machine["versions"])
    assert data["command"].startswith("seqserve bench --checkpoint ")
    assert f"-n {N} --batch-sizes 1,4" in data["command"] and f"--max-new-tokens {MAX_NEW}" in data["command"]
    assert "--threads 1" in data["command"] and "--shape default" in data["command"]
    assert "process" in data["fields"]["peak_rss_mb"]
    assert data["settings"]["n_inputs"] == N and data["settings"]["max_new_tokens"] == MAX_NEW


def test_markdown_has_command_table_and_batching_reading(report):
    data, markdown = report
    assert data["command"] in markdown and "Machine: " in markdown
    for row in data["rows"]:
        assert f"| {row['name']} |" in markdown
    assert "### Batched engine vs one at a time" in markdown
    fp32 = next(b for b in data["engine_batching"] if b["precision"] == "fp32")
    one = next(r for r in data["rows"] if r["name"] == "seqserve-engine fp32 b1")
    assert fp32["batch1_tokens_per_s"] == one["tokens_per_s"]
    assert fp32["best_tokens_per_s"] == max(r["tokens_per_s"] for r in data["rows"]
                                            if r["backend"] == "seqserve-engine" and r["precision"] == "fp32"
                                            and r["num_beams"] == 1)
    assert f"{fp32['speedup']:.2f}x" in markdown
    assert "| engine / graph-loop | engine / CTranslate2 |" in markdown


def test_ratios_put_the_engine_beside_its_graph_and_ctranslate2(report):
    data, markdown = report
    rows = {(r["backend"], r["precision"], r["batch_size"], r["num_beams"]): r["tokens_per_s"] for r in data["rows"]}
    by_key = {(r["precision"], r["batch_size"], r["num_beams"]): r for r in data["ratios"]}
    assert set(by_key) == {(p, b, n) for backend, p, b, n in EXPECTED_ROWS if backend == "seqserve-engine"}
    for (p, b, n), r in by_key.items():
        engine = rows["seqserve-engine", p, b, n]
        assert r["engine_per_ctranslate2"] == pytest.approx(engine / rows["ctranslate2", p, b, n], abs=1e-3)
        if n == 1:
            assert r["engine_per_graph_loop"] == pytest.approx(engine / rows["graph-loop", p, b, n], abs=1e-3)
            assert f"{r['engine_per_graph_loop']:.2f}x" in markdown
        else:
            assert r["graph_loop"] is None and r["engine_per_graph_loop"] is None  # beams have no graph-loop row


def test_identical_share_counts_inputs_equal_to_the_reference():
    run = RowRun(outputs=[[5, 6], [7], [8, 9]], wall_s=2.0, peak_rss_mb=10.0, device="cpu")
    row = row_json(RowSpec("ctranslate2", "int8", 8), run, reference=[[5, 6], [7, 7], [8, 9]])
    assert row["identical_to_reference"] == pytest.approx(2 / 3)
    assert row["generated_tokens"] == 5 and row["tokens_per_s"] == 2.5 and row["mean_latency_ms_batch1"] is None


def test_each_device_benchmarks_its_own_precisions():
    """int8 is a CPU variant and fp16 a GPU one: a row is planned only where it means something and the bundle has
    it."""
    from pathlib import Path

    from seqserve.loadtest.bench import plan
    from seqserve.loadtest.bench_config import BenchConfig

    def planned(device: str, variants: list[str]) -> set[tuple[str, str]]:
        cfg = BenchConfig(checkpoint=Path("ckpt"), device=device, batch_sizes=(1,))
        return {(s.backend, s.precision) for s in plan(cfg, variants, with_ctranslate2=True)}

    everything = ["fp32", "int8", "fp16"]
    assert {p for b, p in planned("cpu", everything) if b == "seqserve-engine"} == {"fp32", "int8"}
    assert {p for b, p in planned("cuda", everything) if b == "seqserve-engine"} == {"fp32", "fp16"}
    assert ("ctranslate2", "fp16") in planned("cuda", everything)
    assert {p for b, p in planned("cuda", ["fp32"]) if b == "seqserve-engine"} == {"fp32"}


def test_step_profile_times_every_operation_and_leaves_the_runner_empty(tiny_bundle, capsys):
    from seqserve.engine.runtime.device import RuntimeConfig
    from seqserve.engine.runtime.runner import Runner
    from seqserve.loadtest.step_profile import main as step_profile
    from seqserve.loadtest.step_profile import profile

    runner = Runner(tiny_bundle, RuntimeConfig(device="cpu", intra_op_threads=1))
    ms = profile(runner, 3)
    assert set(ms) == {"step", "encode_batch", "one_leaves", "one_joins"} and all(v > 0 for v in ms.values())
    assert runner.slots.n_live == 0 and runner.slots.hi == 0 and runner.nbytes == 0  # left empty (was runner.rows)
    assert step_profile([str(tiny_bundle), "--batch-sizes", "1,2", "--threads", "1"]) == 0
    assert [line.split(":")[0] for line in capsys.readouterr().out.splitlines()[1:]] == ["batch    1", "batch    2"]


# A random-weight model as `--shape base|small` makes one, at tiny dimensions (the real shapes take minutes to export).
TINY_SHAPE = ModelConfig(vocab_size=512, d_model=32, n_heads=2, n_encoder_layers=2, n_decoder_layers=2, d_ff=64,
                         dropout=0.0)
FORCED, SEED, SOURCES = 12, 3, 6


@pytest.fixture(scope="module")
def random_model(tmp_path_factory):
    """checkpoint/, bundle/ (fp32 + int8) and ctranslate2/ of TINY_SHAPE, through shapes.prepare as the bench does."""
    pytest.importorskip("ctranslate2")
    from seqserve.export.ctranslate2 import convert

    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(shapes.SHAPES, "tiny-test", TINY_SHAPE)
        work = tmp_path_factory.mktemp("shape")
        return shapes.prepare("tiny-test", work, SEED, SOURCES, FORCED, convert, progress=False), work


def test_the_shapes_are_the_issues_sizes():
    assert bench_config.SHAPE_NAMES == ("default", *shapes.SHAPES)
    base, small = shapes.SHAPES["base"], shapes.SHAPES["small"]
    assert (base.d_model, base.n_heads, base.n_encoder_layers, base.n_decoder_layers, base.d_ff, base.vocab_size) \
        == (512, 8, 6, 6, 2048, 8000)
    assert (small.d_model, small.n_heads, small.n_encoder_layers, small.n_decoder_layers, small.d_ff,
            small.vocab_size) == (256, 4, 3, 3, 1024, 8000)


def test_a_shape_checkpoint_matches_its_config_and_its_tokenizer_loads(random_model, tmp_path):
    made, _ = random_model
    cfg = ModelConfig.load(made.checkpoint / "config.json")
    assert cfg == TINY_SHAPE
    tok = load_tokenizer(made.checkpoint / "tokenizer.json")  # checks ids 0..3 are the special tokens
    vocab = tok.get_vocab(with_added_tokens=True)
    assert sorted(vocab.values()) == list(range(TINY_SHAPE.vocab_size))
    assert [tok.id_to_token(i) for i in range(4)] == ["<pad>", "<s>", "</s>", "<unk>"]
    manifest = load_manifest(made.bundle)
    assert manifest.model == cfg.to_dict() and manifest.max_new_tokens == FORCED
    assert {"fp32", "int8"} <= set(manifest.variants) and "decoder_inplace" in manifest.variants["fp32"]
    sources = [tok.encode(s).ids for s, _ in heldout_pairs(made.bundle, 100)]
    assert len(sources) == SOURCES
    assert all(len(s) == shapes.SOURCE_TOKENS and s[-1] == 2 and min(s[:-1]) >= 4 for s in sources)
    again = shapes.write_checkpoint(TINY_SHAPE, tmp_path, SEED, SOURCES, FORCED)  # the seed fixes the weights
    assert (again / "model.safetensors").read_bytes() == (made.checkpoint / "model.safetensors").read_bytes()
    assert (again / "heldout.tsv").read_text() == (made.checkpoint / "heldout.tsv").read_text()


def test_a_prepared_shape_directory_is_reused(random_model):
    made, work = random_model
    manifest = made.bundle / "manifest.json"
    before = manifest.stat().st_mtime_ns
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(shapes.SHAPES, "tiny-test", TINY_SHAPE)
        again = shapes.prepare("tiny-test", work, SEED, SOURCES, FORCED, convert=lambda *_: pytest.fail("converted"))
    assert again.bundle == made.bundle and manifest.stat().st_mtime_ns == before


def _work(made, kv_cache: str = "auto", min_new: int = FORCED) -> Workload:
    tok = load_tokenizer(made.bundle / "tokenizer.json")
    sources = [tok.encode(s).ids for s, _ in heldout_pairs(made.bundle, SOURCES)]
    return Workload(sources, FORCED, 1, "cpu", None, made.bundle, made.ctranslate2_dir, min_new_tokens=min_new,
                    kv_cache=kv_cache)


def test_forced_length_gives_exactly_n_tokens_on_every_backend(random_model):
    """min_new_tokens = max_new_tokens: every row of every backend is FORCED tokens long, and fp32 agrees."""
    made, _ = random_model
    outputs = {}
    for kv_cache in ("inplace", "concat"):
        for spec in (RowSpec(ENGINE, "fp32", 4), RowSpec(GRAPH_LOOP, "fp32", 4), RowSpec(ENGINE, "int8", 4),
                     RowSpec(GRAPH_LOOP, "int8", 4), RowSpec(ENGINE, "fp32", 2, 4)):
            run = run_row(spec, _work(made, kv_cache))  # in this process: run_row is a spawned row's whole life
            assert run.graph == ("decoder_inplace" if kv_cache == "inplace" else "decoder")
            outputs[spec.name, kv_cache] = run.outputs
    for spec in (RowSpec(CTRANSLATE2, "fp32", 4), RowSpec(CTRANSLATE2, "int8", 4), RowSpec(CTRANSLATE2, "fp32", 2, 4)):
        outputs[spec.name, "-"] = run_row(spec, _work(made)).outputs
    for name, out in outputs.items():
        assert [len(ids) for ids in out] == [FORCED] * SOURCES, name
    fp32 = [outputs[n, kv] for n in ("seqserve-engine fp32 b4", "graph-loop fp32 b4") for kv in ("inplace", "concat")]
    assert all(out == outputs["ctranslate2 fp32 b4", "-"] for out in fp32)
    assert outputs["seqserve-engine fp32 b2 beam4", "inplace"] == outputs["seqserve-engine fp32 b2 beam4", "concat"]


def test_graph_loop_agrees_with_the_engine_where_rows_end_at_different_steps(tiny_bundle):
    """The trained tiny model ends its rows with EOS at different steps inside one static batch."""
    tok = load_tokenizer(tiny_bundle / "tokenizer.json")
    sources = [tok.encode(s).ids for s, _ in heldout_pairs(tiny_bundle, 10)]
    work = Workload(sources, MAX_NEW, 1, "cpu", None, tiny_bundle, kv_cache="concat")  # every bundle has it
    loop, engine = (run_row(RowSpec(backend, "fp32", 5), work).outputs for backend in (GRAPH_LOOP, ENGINE))
    assert loop == engine and len({len(ids) for ids in loop}) > 2


def test_beam_rounds_report_the_median_of_their_own_rows(random_model):
    """`python -m seqserve.loadtest.beam_rounds`: each round's ratio is its engine row over its CTranslate2 row (fresh
    processes, CPU time), the figure is their median; fp32 greedy outputs agree, so they are reported identical."""
    from seqserve.loadtest import beam_rounds

    _, work = random_model
    args = [str(work), "--precision", "fp32", "--rounds", "2", "--batch-size", "4", "--num-beams", "1",
            "-n", str(SOURCES), "--max-new-tokens", str(FORCED)]
    result = beam_rounds.main(args)
    ratios = [r["ratio"] for r in result["rounds"]]
    assert len(ratios) == 2 and result["median_ratio"] == pytest.approx(sum(ratios) / 2)
    for r in result["rounds"]:
        assert r["ratio"] == pytest.approx(r["engine"] / r["ctranslate2"], rel=2e-3, abs=1e-3)  # both rounded
    assert result["identical_outputs"] is True
    with pytest.raises(SystemExit):
        beam_rounds.main([str(work), "--rounds", "0"])
