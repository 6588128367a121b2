"""Capacity sweep: one short load-test step per concurrency, then a table (printed, CSV, JSON) and a plot.

Each step is its own locust run with the ramp-up left out of its statistics; its files go to users-NNN/.
The sweep folder gets sweep.csv, sweep.json and sweep.png.
"""
from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tqdm import tqdm

from seqserve.loadtest.driver import LoadTest, judge, parse_duration, run
from seqserve.loadtest.plot import plot_sweep
from seqserve.loadtest.slo import Slo
from seqserve.loadtest.summary import Summary

COLUMNS = ("users", "requests", "failures", "requests_per_s", "generated_tokens_per_s", "p50_ms", "p95_ms", "p99_ms",
           "ttft_p50_ms", "ttft_p99_ms", "slo")


def parse_levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        levels = ()
    if not levels or min(levels) < 1:
        raise ValueError(f"--sweep takes comma-separated user counts >= 1, e.g. 1,2,4,8 (got {text!r})")
    return levels


def row(summary: Summary, slo_met: bool | None) -> dict:
    lat, ttft = summary.latency_ms, summary.time_to_first_token_ms
    return {"users": summary.users, "requests": summary.requests, "failures": summary.failures,
            "requests_per_s": round(summary.requests_per_s, 2),
            "generated_tokens_per_s": round(summary.generated_tokens_per_s, 1),
            "p50_ms": lat["p50"], "p95_ms": lat["p95"], "p99_ms": lat["p99"],
            "ttft_p50_ms": ttft["p50"], "ttft_p99_ms": ttft["p99"],
            "slo": "" if slo_met is None else "met" if slo_met else "missed"}


def format_table(rows: list[dict]) -> str:
    cells = [list(COLUMNS)] + [["n/a" if r[c] is None else str(r[c]) for c in COLUMNS] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in cells)


@dataclass(frozen=True)
class Sweep:
    test: LoadTest  # the template: each step replaces its users and duration
    levels: tuple[int, ...]
    step_s: int = 20
    slo: Slo = Slo()

    @classmethod
    def from_args(cls, args, test: LoadTest, slo: Slo) -> Sweep:
        return cls(test, parse_levels(args.sweep), parse_duration(args.step_duration), slo)

    def run(self, report_dir: Path) -> int:
        """Runs every step, writes the table and the plot; returns the command's exit code."""
        report_dir.mkdir(parents=True, exist_ok=True)
        rows, problems = [], {}
        for users in tqdm(self.levels, desc="sweep", unit="step"):
            step = replace(self.test, users=users, duration_s=self.step_s, reset_stats=True)
            out = report_dir / f"users-{users:03d}"
            summary = run(step, out, progress=False)
            code, problems[users] = judge(summary, self.slo, out / "summary.json")
            rows.append(row(summary, code == 0 if self.slo.any else None))
        self._write(rows, report_dir)
        print(format_table(rows))
        print(f"-> {report_dir}/ (sweep.csv, sweep.json, sweep.png, users-NNN/)")
        return self._verdict(rows, problems)

    def _write(self, rows: list[dict], report_dir: Path) -> None:
        with (report_dir / "sweep.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
        meta = {"target": self.test.target, "step_duration_s": self.step_s, "methods": list(self.test.methods),
                "decoding": {k: v for k, v in self.test.decoding.items() if v is not None},
                "slo": {k: v for k, v in asdict(self.slo).items() if v is not None}, "rows": rows}
        (report_dir / "sweep.json").write_text(json.dumps(meta, indent=2) + "\n")
        plot_sweep(rows, report_dir / "sweep.png", f"seqserve capacity: {self.test.target}, {self.step_s} s per step")

    def _verdict(self, rows: list[dict], problems: dict[int, list[str]]) -> int:
        """1 when a step had no successful call, or SLOs are set and no step met them; else 0."""
        broken = [r["users"] for r in rows if r["requests"] == r["failures"]]
        within = [r for r in rows if r["slo"] == "met"]
        for users, lines in problems.items():
            if users in broken or (self.slo.any and not within):
                print("\n".join(f"{users} users: {line}" for line in lines))
        if within:
            best = max(within, key=lambda r: r["users"])
            print(f"highest concurrency within the SLOs: {best['users']} users "
                  f"({best['generated_tokens_per_s']} generated tokens/s, {best['requests_per_s']} requests/s)")
        return 1 if broken or (self.slo.any and not within) else 0
