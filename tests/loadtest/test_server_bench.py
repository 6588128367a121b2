"""The pinned server benchmark on the tiny bundle: a real `seqserve serve` under taskset, a grpc.aio client in its own
pinned process, the offline engine on the server's core; every call forced to the same length."""
from __future__ import annotations

import json
import os

import pytest

from seqserve.loadtest import server_bench

STREAMS, MAX_NEW, SEQUENTIAL = 4, 8, 5
needs_two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pins the server and client apart")


def _bench(tiny_bundle, out, *more: str) -> dict:
    """server_bench on the tiny bundle, short and small, the server and the client on the first two cores."""
    cores = sorted(os.sched_getaffinity(0))[:2]
    argv = ["--bundle", str(tiny_bundle), "--streams", str(STREAMS), "--max-batch-size", str(STREAMS),
            "--max-new-tokens", str(MAX_NEW), "--warmup", "0.5", "--duration", "1.5", "--sequential-requests",
            str(SEQUENTIAL), "-n", "8", "--server-core", str(cores[0]), "--client-core", str(cores[1]),
            "--out", str(out / "report.json"), *more]
    assert server_bench.main(argv) == 0
    return json.loads((out / "report.json").read_text())


@pytest.fixture(scope="module")
def report(tiny_bundle, tmp_path_factory):
    out = tmp_path_factory.mktemp("server-bench")
    return _bench(tiny_bundle, out, "--markdown", str(out / "report.md")), (out / "report.md").read_text()


@needs_two_cores
def test_every_call_generates_the_forced_length_served_and_offline(report):
    data, _ = report
    concurrent, sequential = data["concurrent"], data["sequential"]
    assert concurrent["calls"] >= STREAMS and concurrent["calls_by_generated_tokens"] == {
        str(MAX_NEW): concurrent["calls"]}
    assert sequential["calls"] == SEQUENTIAL and sequential["calls_by_generated_tokens"] == {str(MAX_NEW): SEQUENTIAL}
    assert [b["lengths"] for b in data["engine_offline"].values()] == [[MAX_NEW], [MAX_NEW]]
    assert set(data["engine_offline"]) == {f"b{STREAMS}", "b1"}


@needs_two_cores
def test_the_server_count_and_the_client_count_cover_the_same_window(report):
    """Both counts come from the same window; they differ only by tokens in flight at its two ends."""
    c = report[0]["concurrent"]
    assert c["server_tokens"] > 0 and c["client_tokens"] > 0
    assert abs(c["server_tokens"] - c["client_tokens"]) <= 2 * STREAMS * MAX_NEW
    assert c["server_tokens_per_s"] == pytest.approx(c["server_tokens"] / c["window_s"], rel=1e-2)
    assert c["server_per_engine"] == pytest.approx(c["server_tokens_per_s"] / c["engine_offline_tokens_per_s"],
                                                   rel=1e-2)
    s = report[0]["sequential"]
    assert s["engine_per_server"] == pytest.approx(s["engine_offline_ms_per_input"] / s["mean_ms"], rel=1e-2)
    assert s["p50_ms"] <= s["p99_ms"]


@needs_two_cores
def test_the_report_names_the_pinning_the_load_and_the_command(report):
    data, markdown = report
    cores = sorted(os.sched_getaffinity(0))[:2]
    assert data["server_command"].startswith(f"taskset -c {cores[0]} ") and data["client_cores"] == [cores[1]]
    for flag in ("--intra-op-threads 1", "--no-allow-spinning", f"--max-batch-size {STREAMS}"):
        assert flag in data["server_command"]
    assert "load average" in data["uptime_before"] and "load average" in data["uptime_after"]
    assert data["command"].startswith("python -m seqserve.loadtest.server_bench --bundle ")
    assert data["command"] in markdown and "| concurrency 1, ms per request |" in markdown
    assert data["machine"]["onnxruntime_providers_used"] == ["CPUExecutionProvider"]


@needs_two_cores
def test_the_edge_rows_put_served_beside_the_bare_servicer_and_the_engine_in_the_same_run(report):
    """Unary and streaming, served and bare, every call the forced length; ceiling = 1 / (bare s + engine s) per call."""
    data, markdown = report
    cores = sorted(os.sched_getaffinity(0))[:2]
    assert data["bare_command"].startswith(f"taskset -c {cores[0]} ")  # pinned as the server is
    assert "-m seqserve.loadtest.bare_servicer" in data["bare_command"] and f"--tokens {MAX_NEW}" in data["bare_command"]
    engine = data["engine_offline"][f"b{STREAMS}"]["tokens_per_s"]
    for kind in ("unary", "stream"):
        row = data["edge"][kind]
        assert row["bare"]["calls"] >= STREAMS and row["bare"]["calls_by_generated_tokens"] == {
            str(MAX_NEW): row["bare"]["calls"]}
        per_call = MAX_NEW / row["bare_tokens_per_s"] + MAX_NEW / engine  # seconds per call: edge + engine
        assert row["ceiling_tokens_per_s"] == pytest.approx(MAX_NEW / per_call, rel=1e-3)
        assert row["served_per_ceiling"] == pytest.approx(row["served_tokens_per_s"] / row["ceiling_tokens_per_s"],
                                                          rel=1e-2)
        assert f"| {kind} | {row['served_tokens_per_s']:,.0f} | {row['bare_tokens_per_s']:,.0f} |" in markdown
        cpu = row["cpu_us_per_token"]  # CPU seconds per token: each server's over its window, the engine's own
        assert cpu["bare"] == pytest.approx(1e6 * row["bare"]["server_cpu_s"] / row["bare"]["client_tokens"], rel=1e-2)
        assert cpu["engine_offline"] == data["engine_offline"][f"b{STREAMS}"]["cpu_us_per_token"] > 0
        assert row["served_per_ceiling_cpu"] == pytest.approx((cpu["bare"] + cpu["engine_offline"]) / cpu["served"],
                                                              rel=1e-2)
    unary = data["edge"]["unary"]["served"]
    assert unary["calls"] >= STREAMS and unary["calls_by_generated_tokens"] == {str(MAX_NEW): unary["calls"]}
    assert unary["server_tokens"] > 0  # the served unary window is counted by the server too
    assert data["edge"]["unary"]["served_messages_per_call"] == data["edge"]["unary"]["bare_messages_per_call"] == 1
    assert data["edge"]["stream"]["bare_messages_per_call"] == MAX_NEW  # the bare servicer: one message per token
    assert 1 <= data["edge"]["stream"]["served_messages_per_call"] <= MAX_NEW


def test_the_server_and_the_client_need_two_different_cores(tiny_bundle, capsys):
    assert server_bench.main(["--bundle", str(tiny_bundle), "--server-core", "0", "--client-core", "0"]) == 2
    assert "two different cores" in capsys.readouterr().err


def _config(bundle, **kw):
    cores = sorted(os.sched_getaffinity(0))[:2]
    return server_bench.ServerBenchConfig(bundle, server_core=cores[0], client_core=cores[1], **kw)


@needs_two_cores
def test_an_inputs_file_gives_the_sources_of_a_bundle_without_a_heldout_split(tmp_path):
    """An imported model's bundle has no heldout.tsv: --inputs names the sources, one per line, blank lines skipped."""
    inputs = tmp_path / "sources.txt"
    inputs.write_text("Hello world.\n\n  Zwölf Boxkämpfer jagen Viktor.  \nThe third.\n", encoding="utf-8")
    cfg = _config(tmp_path, num_inputs=2, inputs=inputs)
    assert server_bench.input_texts(cfg) == ["Hello world.", "Zwölf Boxkämpfer jagen Viktor."]
    assert cfg.command().endswith(f" --inputs {inputs}")


@needs_two_cores
def test_a_bundle_without_a_heldout_split_and_no_inputs_file_is_refused_naming_the_option(tmp_path):
    with pytest.raises(ValueError, match="--inputs FILE"):
        server_bench.input_texts(_config(tmp_path))


def test_every_call_asks_for_greedy_decoding_as_the_offline_row_whatever_the_model_defaults():
    """An imported opus-mt defaults to num_beams 4, and num_beams 0 means the model's default: the client sends 1."""
    from seqserve.loadtest import bench_streams

    options = bench_streams.decoding_options(MAX_NEW)
    assert (options.num_beams, options.max_new_tokens, options.min_new_tokens) == (1, MAX_NEW, MAX_NEW)


@pytest.fixture(scope="module")
def split_report(tiny_bundle, tmp_path_factory):
    return _bench(tiny_bundle, tmp_path_factory.mktemp("server-bench-split"), "--engine-process")


@needs_two_cores
def test_engine_process_pins_the_engine_to_the_server_core_and_the_front_end_apart(split_report):
    cores = sorted(os.sched_getaffinity(0))[:2]
    assert split_report["server_command"].startswith(f"taskset -c {cores[1]} ")  # the front end, on the client core
    assert f"--engine-process --engine-cpus {cores[0]}" in split_report["server_command"]
    c = split_report["concurrent"]
    assert c["calls"] >= STREAMS and c["calls_by_generated_tokens"] == {str(MAX_NEW): c["calls"]}
    assert c["server_tokens"] > 0


def test_a_server_s_cpu_counts_its_running_child_processes():
    """cpu_seconds sums the process tree: a child that burned CPU and still runs is in its parent's figure."""
    import signal
    import subprocess
    import sys

    from seqserve.loadtest.bench_streams import cpu_seconds
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nprint(1, flush=True)\n" \
           "time.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; p = subprocess.Popen([sys.executable, "
                               f"'-c', {burn!r}], stdout=sys.stdout); p.wait()"], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        assert parent.stdout.readline().strip() == "1"  # the child burned its 0.3 s and now sleeps
        assert cpu_seconds(parent.pid) >= 0.25
    finally:
        os.killpg(parent.pid, signal.SIGKILL)  # the parent and its sleeping child
        parent.wait()
