"""`seqserve bench` on the tiny model: every row runs, the JSON has every field, and the oracles agree."""
from __future__ import annotations

import json

import pytest

from seqserve.cli.main import main
from seqserve.loadtest.bench import row_json
from seqserve.loadtest.bench_rows import RowRun, RowSpec

N, BATCHES, MAX_NEW = 12, (1, 4), 40
ROW_FIELDS = {"name": str, "backend": str, "precision": str, "batch_size": int, "device": str, "n_inputs": int,
              "generated_tokens": int, "wall_s": float, "tokens_per_s": float, "peak_rss_mb": float,
              "identical_to_reference": float}
EXPECTED_ROWS = ({("pytorch-no-cache", "fp32", 1), ("pytorch-kv-cache", "fp32", 1)}
                 | {(backend, p, b) for backend in ("seqserve-engine", "ctranslate2") for p in ("fp32", "int8")
                    for b in BATCHES})


@pytest.fixture(scope="module")
def report(tiny_checkpoint, tmp_path_factory):
    """One bench run without --bundle, so it also exports the fp32 + int8 bundle and converts to CTranslate2 itself."""
    pytest.importorskip("ctranslate2")
    out = tmp_path_factory.mktemp("bench")
    argv = ["bench", "--checkpoint", str(tiny_checkpoint), "-n", str(N), "--batch-sizes", ",".join(map(str, BATCHES)),
            "--max-new-tokens", str(MAX_NEW), "--threads", "1", "--out", str(out / "bench.json"),
            "--markdown", str(out / "bench.md"), "--quiet"]
    assert main(argv) == 0
    return json.loads((out / "bench.json").read_text()), (out / "bench.md").read_text()


def test_every_row_runs_with_every_field(report):
    data, _ = report
    rows = {r["name"]: r for r in data["rows"]}
    assert {(r["backend"], r["precision"], r["batch_size"]) for r in rows.values()} == EXPECTED_ROWS
    assert len(rows) == len(EXPECTED_ROWS) and data["skipped"] == []
    for row in rows.values():
        for name, kind in ROW_FIELDS.items():
            assert isinstance(row[name], kind), (row["name"], name)
        assert row["n_inputs"] == N and row["generated_tokens"] > N and row["peak_rss_mb"] > 0
        assert row["tokens_per_s"] == pytest.approx(row["generated_tokens"] / row["wall_s"], rel=1e-3)
        if row["batch_size"] == 1:
            assert row["mean_latency_ms_batch1"] == pytest.approx(1e3 * row["wall_s"] / N, rel=1e-3)
        else:
            assert row["mean_latency_ms_batch1"] is None


def test_exact_oracles_are_identical_to_the_reference(report):
    """Cached == uncached PyTorch, onnxruntime fp32 == PyTorch, CTranslate2 fp32 == PyTorch, at every batch size."""
    data, _ = report
    assert data["reference"] == "pytorch-kv-cache fp32 b1"
    exact = [r for r in data["rows"] if r["precision"] == "fp32"]
    assert len(exact) == 2 + 2 * len(BATCHES)
    assert all(r["identical_to_reference"] == 1.0 for r in exact), [(r["name"], r["identical_to_reference"])
                                                                     for r in exact]
    assert len({r["generated_tokens"] for r in exact}) == 1


def test_rows_run_in_their_own_processes(report):
    """An engine row never imports torch, so its peak RSS is below a PyTorch row's; a shared process would not be."""
    rows = {r["name"]: r for r in report[0]["rows"]}
    assert rows["seqserve-engine fp32 b1"]["peak_rss_mb"] < rows["pytorch-kv-cache fp32 b1"]["peak_rss_mb"]
    assert rows["ctranslate2 fp32 b1"]["peak_rss_mb"] < rows["pytorch-kv-cache fp32 b1"]["peak_rss_mb"]
    assert rows["seqserve-engine fp32 b1"]["device"] == "CPUExecutionProvider"


def test_machine_command_and_field_meanings_are_recorded(report):
    data, _ = report
    machine = data["machine"]
    assert machine["cpu"] and machine["logical_cores"] >= 1 and machine["ram_gib"] > 0
    assert machine["onnxruntime_providers_used"] == ["CPUExecutionProvider"]
    assert {"torch", "ctranslate2", "numpy"} <= set(machine["versions"])
    assert data["command"].startswith("seqserve bench --checkpoint ")
    assert f"-n {N} --batch-sizes 1,4" in data["command"] and f"--max-new-tokens {MAX_NEW}" in data["command"]
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
                                            if r["backend"] == "seqserve-engine" and r["precision"] == "fp32")
    assert f"{fp32['speedup']:.2f}x" in markdown


def test_identical_share_counts_inputs_equal_to_the_reference():
    run = RowRun(outputs=[[5, 6], [7], [8, 9]], wall_s=2.0, peak_rss_mb=10.0, device="cpu")
    row = row_json(RowSpec("ctranslate2", "int8", 8), run, reference=[[5, 6], [7, 7], [8, 9]])
    assert row["identical_to_reference"] == pytest.approx(2 / 3)
    assert row["generated_tokens"] == 5 and row["tokens_per_s"] == 2.5 and row["mean_latency_ms_batch1"] is None


def test_each_device_benchmarks_its_own_precisions():
    """int8 is a CPU variant and fp16 a GPU one: a row is planned only where it means something and the bundle has it."""
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
    from seqserve.loadtest.step_profile import main as step_profile
    from seqserve.loadtest.step_profile import profile
    from seqserve.server.device import RuntimeConfig
    from seqserve.server.runner import Runner

    runner = Runner(tiny_bundle, RuntimeConfig(device="cpu", intra_op_threads=1))
    ms = profile(runner, 3)
    assert set(ms) == {"step", "encode_batch", "one_leaves", "one_joins"} and all(v > 0 for v in ms.values())
    assert runner.rows == [] and runner.cache.batch == 0
    assert step_profile([str(tiny_bundle), "--batch-sizes", "1,2", "--threads", "1"]) == 0
    assert [line.split(":")[0] for line in capsys.readouterr().out.splitlines()[1:]] == ["batch    1", "batch    2"]
