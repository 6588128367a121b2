"""Writes deploy/grafana/dashboards/seqserve.json, the one seqserve dashboard Grafana provisions.

Generated with Grafana's own grafana-foundation-sdk (the dev extra pins the build for Grafana 11.6, the image
docker-compose.yml runs) rather than written by hand: its builders are generated from Grafana's schema, so a
panel, query or variable field that Grafana does not know fails here instead of being ignored silently in a
5,000-line JSON file, and every panel below is one readable line. grafanalib was the other candidate; its last
release is from January 2024 and its types trail Grafana's. The JSON stays committed so that Grafana and a review
need no Python; tests/deploy/test_grafana_dashboard.py fails when it differs from what this writes.

    .venv/bin/python deploy/grafana/dashboard.py        # rewrite the JSON after editing the panels below

Each panel shows every replica (legend: its instance) and the total over the replicas picked in $instance and the
models picked in $model (a server may serve several: every metric has a `model` label).
Metric names are taken from server/metrics.py's objects, never spelled here; tests/deploy check each query against
a live Prometheus.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh

from seqserve.server.metrics import Metrics

OUT = Path(__file__).resolve().parent / "dashboards" / "seqserve.json"
UID = "seqserve"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="prometheus")  # provisioning/datasources/prometheus.yml
SELECTED = 'instance=~"$instance", model=~"$model"'  # the replicas and models picked in the variables (all by default)
WINDOW = "$__rate_interval"
QUANTILES = (0.5, 0.95, 0.99)
M = Metrics()  # server/metrics.py: the only place a metric is named


def series(metric) -> str:
    """The name a metric of server/metrics.py is exported under (a counter's with _total, an info's with _info)."""
    family = metric.describe()[0]
    return family.name + {"counter": "_total", "info": "_info"}.get(family.type, "")


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


def rate(metric: str, extra: str = "") -> str:
    return f"rate({metric}{{{SELECTED}{extra}}}[{WINDOW}])"


def per_second(counter: str) -> list[Query]:
    return [Query(f"sum by (instance) ({rate(counter)})", "{{instance}}"), Query(f"sum({rate(counter)})", "total")]


def current(gauge: str) -> list[Query]:
    selected = f"{gauge}{{{SELECTED}}}"
    return [Query(f"sum by (instance) ({selected})", "{{instance}}"), Query(f"sum({selected})", "total")]


def quantiles(histogram: str) -> list[Query]:
    """p50/p95/p99 over all replicas, and each replica's p99."""
    buckets = rate(f"{histogram}_bucket")
    total = [Query(f"histogram_quantile({q}, sum by (le) ({buckets}))", f"p{round(q * 100)} total") for q in QUANTILES]
    return total + [Query(f"histogram_quantile(0.99, sum by (le, instance) ({buckets}))", "p99 {{instance}}")]


def mean(histogram: str, name: str = "") -> list[Query]:
    """Observed sum / count: the mean value per observation, per replica and in total."""
    prefix = f"{name} " if name else ""
    return [Query(f"sum by (instance) ({rate(histogram + '_sum')}) / sum by (instance) ({rate(histogram + '_count')})",
                  prefix + "{{instance}}"),
            Query(f"sum({rate(histogram + '_sum')}) / sum({rate(histogram + '_count')})", prefix + "total")]


def by_label(counter: str, label: str, extra: str = "") -> list[Query]:
    return [Query(f"sum by (instance, {label}) ({rate(counter, extra)})", f"{{{{{label}}}}} {{{{instance}}}}"),
            Query(f"sum by ({label}) ({rate(counter, extra)})", f"{{{{{label}}}}} total")]


@dataclass(frozen=True)
class Chart:
    title: str
    unit: str
    queries: list[Query]
    description: str


ROWS: dict[str, list[Chart]] = {
    "Throughput": [
        Chart("Requests/s", "reqps", per_second(series(M.requests)), "gRPC calls finished per second, any code"),
        Chart("Generated tokens/s", "suffix: tok/s", per_second(series(M.generated_tokens)),
              "tokens generated per second (EOS not counted)"),
    ],
    "Latency": [
        Chart("Time to first token", "s", quantiles(series(M.time_to_first_token)),
              "arrival to first generated token"),
        Chart("Inter-token latency", "s", quantiles(series(M.inter_token_latency)),
              "time between two tokens of a row"),
        Chart("End-to-end latency", "s", quantiles(series(M.request_duration)),
              "arrival to the last token of a generation"),
    ],
    "Batching and memory": [
        Chart("Queue depth", "short", current(series(M.waiting)), "requests waiting for admission"),
        Chart("Running rows", "short", current(series(M.running)), "rows in the running batch"),
        Chart("Rows per decoder step", "short", mean(series(M.batch_rows)), "mean rows in one decoder step"),
        Chart("KV-cache bytes", "bytes", current(series(M.kv_cache_bytes)), "bytes held by the KV cache"),
    ],
    "Engine": [
        Chart("Encoder vs decoder-step time", "s",
              mean(series(M.encoder_duration), "encoder") +
              mean(series(M.decoder_step_duration), "decoder step"),
              "mean time of one encoder.onnx run (admitted rows) and one decoder.onnx step (whole batch)"),
    ],
    "Errors": [
        Chart("Errors by code", "reqps", by_label(series(M.requests), "code", ', code!="OK"'),
              "calls per second that ended with a gRPC status other than OK"),
        Chart("Rejections by reason", "reqps", by_label(series(M.rejected), "reason"),
              "requests refused before running (queue_full is RESOURCE_EXHAUSTED, draining is UNAVAILABLE)"),
    ],
}


def _panel(chart: Chart, width: int) -> timeseries.Panel:
    panel = (timeseries.Panel().title(chart.title).description(chart.description).unit(chart.unit)
             .datasource(DATASOURCE).span(width).height(8).fill_opacity(10)
             .legend(common_builders.VizLegendOptions().show_legend(True).display_mode(common.LegendDisplayMode.LIST)
                     .placement(common.LegendPlacement.BOTTOM)))
    for ref, query in zip("ABCDEFGH", chart.queries, strict=False):
        panel = panel.with_target(prometheus.Dataquery().expr(query.expr).legend_format(query.legend).ref_id(ref)
                                  .datasource(DATASOURCE))
    return panel


def build() -> dict:
    board = (dash.Dashboard("seqserve").uid(UID).tags(["seqserve"]).refresh("10s").time("now-30m", "now")
             .timezone("browser").editable()
             .with_variable(dash.QueryVariable("instance").label("replica").datasource(DATASOURCE)
                            .query('label_values(up{job="seqserve"}, instance)').multi(True).include_all(True)
                            .all_value(".*").refresh(VariableRefresh.ON_TIME_RANGE_CHANGED))
             .with_variable(dash.QueryVariable("model").label("model").datasource(DATASOURCE)
                            .query(f"label_values({series(M.model)}, model)").multi(True).include_all(True)
                            .all_value(".*").refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)))
    for row, charts in ROWS.items():
        board = board.with_row(dash.Row(row))
        for chart in charts:
            board = board.with_panel(_panel(chart, 24 // len(charts)))  # one line of panels per row
    return json.loads(JSONEncoder(sort_keys=True).encode(board.build()))


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main() -> int:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render())
    print(f"-> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
