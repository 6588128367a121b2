"""loadtest/edge_calls.py times the edge's own steps of a Generate call with the tiny bundle's real parts."""
from __future__ import annotations

from seqserve.loadtest import edge_calls
from seqserve.v1 import seqserve_pb2 as pb


def test_every_step_runs_on_the_bundles_parts_and_is_timed(tiny_bundle, capsys):
    steps = edge_calls.calls(tiny_bundle, tokens=8)
    assert steps["options validated (server/options.py)"]().max_new_tokens == 8  # the load test's forced length
    assert steps["input tokenized (tokenizer.encode)"]()[-1] == 2  # </s>: the encoder's input, as the edge sends it
    encoded = steps["response encoded (protobuf)"]()
    assert len(pb.GenerateResponse.FromString(encoded).token_ids) == 8
    assert edge_calls.main(["--bundle", str(tiny_bundle), "--tokens", "8", "--number", "3", "--repeat", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "µs" not in line]
    assert [row.split(" | ")[0][2:] for row in rows] == list(steps)
    assert all(float(row.rstrip(" |").rsplit("| ", 1)[1]) > 0 for row in rows)
