"""A tiny capacity sweep: one step per concurrency, a table (CSV, JSON, printed) and a PNG plot."""
from __future__ import annotations

import csv
import json

from matplotlib.image import imread


def test_tiny_sweep_writes_table_and_plot(server, loadtest, tmp_path):
    code, out = loadtest(server, "--sweep", "1,2", "--step-duration", "2s", "--report-dir", str(tmp_path),
                         "--max-failure-rate", "0")
    assert code == 0
    with (tmp_path / "sweep.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["users"] for r in rows] == ["1", "2"]
    assert all(int(r["requests"]) > 0 and r["failures"] == "0" and r["slo"] == "met" for r in rows)
    assert all(float(r["generated_tokens_per_s"]) > 0 and r["p99_ms"] for r in rows)
    table = json.loads((tmp_path / "sweep.json").read_text())
    assert [r["users"] for r in table["rows"]] == [1, 2] and table["slo"] == {"max_failure_rate": 0.0}
    for users in (1, 2):
        assert json.loads((tmp_path / f"users-{users:03d}" / "summary.json").read_text())["users"] == users
    assert "generated_tokens_per_s" in out and "highest concurrency within the SLOs: 2 users" in out
    image = imread(tmp_path / "sweep.png")
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
