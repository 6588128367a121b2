"""The request-path counter on the tiny bundle: a real `seqserve serve` with the profiler injected into its process."""
from __future__ import annotations

import json

from seqserve.loadtest import request_path

CALLS = 2


def test_a_greedy_call_runs_server_and_engine_files_and_the_service_hands_rows_to_the_engine(tiny_bundle, tmp_path):
    argv = ["--bundle", str(tiny_bundle), "--max-new-tokens", "4", "--calls", str(CALLS),
            "--out", str(tmp_path / "report.md"), "--json", str(tmp_path / "report.json")]
    assert request_path.main(argv) == 0
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["by_package"]["server"] > 0 and data["by_package"]["engine"] > 0
    assert data["total_lines"] > 0 and data["hops"]
    # the gRPC service hands the call's rows to the engine's client: a hop only a profiled server process records
    assert any(caller.startswith("server/service.py:") and callee.startswith("engine/") and callee.endswith(".add")
               for caller, callee in data["hops"])
    assert all(caller.split(":")[0] != callee.split(":")[0] for caller, callee in data["hops"])
    markdown = (tmp_path / "report.md").read_text()
    assert data["command"] in markdown and f"| {len(data['files'])} |" in markdown


def test_files_are_grouped_by_package_and_first_subfolder():
    roots = {"engine": "/repo/engine/", "v1": "/repo/protos/seqserve/v1/", "root": "/repo/protos/seqserve/"}
    assert request_path.relative("/repo/protos/seqserve/v1/x_pb2.py", roots) == "v1/x_pb2.py"  # the longest root
    assert request_path.folder(request_path.relative("/repo/engine/step/loop.py", roots)) == "engine/step"
    assert request_path.folder("engine/api.py") == "engine"
