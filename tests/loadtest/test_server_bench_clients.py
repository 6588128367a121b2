"""The pinned server benchmark with several client processes: the streams are shared among them, and each one's CPU
time over the timed window is reported beside the server's, so a client limit is never read as a server one."""
from __future__ import annotations

import json
import os

import pytest

from seqserve.loadtest import server_bench

STREAMS, MAX_NEW, PROCESSES = 4, 6, 2
needs_two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pins the server and clients apart")


@needs_two_cores
def test_two_client_processes_share_the_streams_and_report_their_cpu_beside_the_servers(tiny_bundle, tmp_path):
    cores = sorted(os.sched_getaffinity(0))[:2]
    argv = ["--bundle", str(tiny_bundle), "--streams", str(STREAMS), "--max-batch-size", str(STREAMS),
            "--max-new-tokens", str(MAX_NEW), "--warmup", "0.5", "--duration", "2", "--sequential-requests", "3",
            "-n", "8", "--server-core", str(cores[0]), "--client-core", str(cores[1]), "--client-processes",
            str(PROCESSES), "--device", "cpu", "--out", str(tmp_path / "r.json"), "--markdown", str(tmp_path / "r.md")]
    assert server_bench.main(argv) == 0
    data, markdown = json.loads((tmp_path / "r.json").read_text()), (tmp_path / "r.md").read_text()
    c = data["concurrent"]
    assert c["client_processes"] == PROCESSES and c["streams"] == STREAMS
    per = c["client_cpu_per_process"]
    assert [p["process"] for p in per] == [0, 1] and [p["streams"] for p in per] == [2, 2]
    assert all(p["core"] == cores[1] and p["cpu_s"] > 0 for p in per)  # every process worked in the window
    assert c["client_cpu_s"] == pytest.approx(sum(p["cpu_s"] for p in per), abs=2e-3)
    assert c["client_cpu_cores_busy"] == pytest.approx(sum(p["cpu_cores_busy"] for p in per), abs=2e-3)
    assert c["server_cpu_s"] > 0 and c["server_cpu_cores_busy"] == pytest.approx(c["server_cpu_s"] / c["window_s"],
                                                                                 abs=2e-3)
    # tokens from both processes: every call is the forced length, and both counts cover one window
    assert c["calls_by_generated_tokens"] == {str(MAX_NEW): c["calls"]} and c["calls"] >= STREAMS
    assert abs(c["server_tokens"] - c["client_tokens"]) <= 2 * STREAMS * MAX_NEW
    assert data["sequential"]["calls"] == 3 and data["client_cores"] == [cores[1]]
    assert "--client-processes 2" in data["command"] and "--device cpu" in data["command"]
    assert "--device cpu" in data["server_command"]
    assert f"{PROCESSES} client process(es)" in markdown and "server " in markdown.split("CPU over the")[1]


@pytest.mark.parametrize("processes", ["0", "5", "65"])
def test_a_client_process_count_outside_its_range_is_refused_naming_the_option(tiny_bundle, capsys, processes):
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    argv = ["--bundle", str(tiny_bundle), "--streams", "4", "--server-core", str(cores[0]), "--client-core",
            str(cores[1]), "--client-processes", processes]
    assert server_bench.main(argv) == 2
    assert "--client-processes must be between 1 and 64 and at most --streams (4)" in capsys.readouterr().err
