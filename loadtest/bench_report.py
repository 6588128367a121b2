"""The benchmark's report: the machine it ran on, the JSON's field meanings, the text and markdown tables."""
from __future__ import annotations

import importlib.metadata
import os
import platform
from pathlib import Path

from seqserve.loadtest.bench_rows import TRANSFORMERS, TRANSFORMERS_MARIAN

FIELDS = {
    "tokens_per_s": "generated_tokens / wall_s",
    "generated_tokens": "tokens generated over all inputs, end tokens not counted (as the server's usage counts)",
    "wall_s": "seconds to decode every input once; model load and one warm-up batch are not included",
    "mean_latency_ms_batch1": "mean time per input when inputs run one at a time (wall_s / n_inputs); "
                              "null on rows whose batch size is not 1",
    "peak_rss_mb": "peak resident set size (Linux VmHWM) of the fresh process that ran only this row: the "
                   "interpreter, the backend's libraries, the model and the decoding itself",
    "identical_to_reference": "share of inputs whose generated token ids equal the reference row's exactly",
    "device": "where the row ran: the onnxruntime execution provider actually used, torch-cpu, ctranslate2-<device>",
    "graph": "engine and graph-loop rows: the decoder graph run (decoder_inplace: in-place K/V cache; decoder: "
             "concatenated K/V); null for the others",
    "num_beams": "1 = greedy; > 1 = beam search of that width, tokens and identity of the best hypothesis",
    "batch_size": "sources decoded together (a beam row's batch holds num_beams decoder rows per source)",
    "output_lengths": "[shortest, longest] output in tokens (forced-length runs: both equal max_new_tokens)",
}
RATIO_FIELDS = {
    "engine_per_graph_loop": "engine tokens/s / graph-loop tokens/s at the same precision and batch size (1.0 = no "
                             "engine overhead over its own graph)",
    "engine_per_ctranslate2": "engine tokens/s / CTranslate2 tokens/s at the same precision, batch size and width",
    "engine_per_transformers": "engine tokens/s / transformers generate tokens/s (transformers-marian, or the "
                               "original model's under --hf) at the same precision, batch size and width",
}
PACKAGES = ("seqserve", "torch", "onnxruntime-gpu", "onnxruntime", "ctranslate2", "numpy", "tokenizers")
COLUMNS = (("row", "name"), ("tokens/s", "tokens_per_s"), ("ms/input @b1", "mean_latency_ms_batch1"),
           ("peak RSS MB", "peak_rss_mb"), ("identical", "identical_to_reference"), ("tokens", "generated_tokens"),
           ("wall s", "wall_s"), ("device", "device"), ("graph", "graph"))
TEXT_KEYS = {"name", "device", "graph", "precision"}  # left-aligned columns; numbers are right-aligned
RATIO_COLUMNS = (("precision", "precision"), ("batch", "batch_size"), ("beams", "num_beams"),
                 ("engine tokens/s", "engine"), ("graph-loop tokens/s", "graph_loop"),
                 ("CTranslate2 tokens/s", "ctranslate2"), ("engine / graph-loop", "engine_per_graph_loop"),
                 ("engine / CTranslate2", "engine_per_ctranslate2"), ("transformers tokens/s", "transformers"),
                 ("engine / transformers", "engine_per_transformers"))
TRANSFORMERS_BACKENDS = (TRANSFORMERS_MARIAN, TRANSFORMERS)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def machine() -> dict:
    """Where the numbers came from; the load average matters on a shared machine."""
    import onnxruntime as ort

    versions = {}
    for package in PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    return {"cpu": _cpu_model(), "logical_cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)),
            "ram_gib": _ram_gib(), "os": platform.platform(), "python": platform.python_version(),
            "onnxruntime_providers_available": ort.get_available_providers(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()], "versions": versions}


def describe(m: dict) -> str:
    """One line for the markdown section."""
    providers = sorted(set(m.get("onnxruntime_providers_used", [])))
    return (f"{m['cpu']}, {m['usable_cores']} usable of {m['logical_cores']} logical cores, {m['ram_gib']} GiB RAM, "
            f"{m['os']}, Python {m['python']}; onnxruntime provider used: {', '.join(providers) or 'none'}; "
            f"load average {m['load_average_at_start']} at start; "
            + ", ".join(f"{k} {v}" for k, v in m["versions"].items()))


def _cell(row: dict, key: str) -> str:
    value = row.get(key)
    if value is None:
        return "-"
    if key == "identical_to_reference":
        return f"{value:.1%}"
    if key.startswith("engine_per_"):
        return f"{value:.2f}x"
    if isinstance(value, float):
        return f"{value:,.1f}" if key != "wall_s" else f"{value:.2f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def text_table(rows: list[dict], columns: tuple = COLUMNS) -> str:
    head = [title for title, _ in columns]
    cells = [[_cell(r, key) for _, key in columns] for r in rows]
    widths = [max(len(c[i]) for c in cells + [head]) for i in range(len(head))]
    line = "  ".join("-" * w for w in widths)

    left = [key in TEXT_KEYS for _, key in columns]

    def fmt(row: list[str]) -> str:  # text left-aligned, numbers right-aligned
        return "  ".join(x.ljust(w) if lt else x.rjust(w) for x, w, lt in zip(row, widths, left))

    return "\n".join([fmt(head), line, *map(fmt, cells)])


def markdown_table(rows: list[dict], columns: tuple = COLUMNS) -> str:
    out = ["| " + " | ".join(title for title, _ in columns) + " |",
           "|" + "|".join("---" if key in TEXT_KEYS else "---:" for _, key in columns) + "|"]
    out += ["| " + " | ".join(_cell(r, key) for _, key in columns) + " |" for r in rows]
    return "\n".join(out)


def ratios(rows: list[dict]) -> list[dict]:
    """Per precision, batch size and width: the engine against its own graph (graph-loop), CTranslate2 and
    transformers' generate."""
    tps = {(r["backend"], r["precision"], r["batch_size"], r["num_beams"]): r["tokens_per_s"] for r in rows}
    out = []
    for backend, precision, batch, beams in tps:
        if backend != "seqserve-engine":
            continue
        engine, loop = tps[backend, precision, batch, beams], tps.get(("graph-loop", precision, batch, beams))
        ct2 = tps.get(("ctranslate2", precision, batch, beams))
        hf = next((tps[k] for k in ((b, precision, batch, beams) for b in TRANSFORMERS_BACKENDS) if k in tps), None)
        out.append({"precision": precision, "batch_size": batch, "num_beams": beams, "engine": engine,
                    "graph_loop": loop, "ctranslate2": ct2, "transformers": hf,
                    "engine_per_graph_loop": round(engine / loop, 3) if loop else None,
                    "engine_per_ctranslate2": round(engine / ct2, 3) if ct2 else None,
                    "engine_per_transformers": round(engine / hf, 3) if hf else None})
    return out


def ratio_text(table: list[dict]) -> str:
    return text_table(table, RATIO_COLUMNS)


def batching_summary(rows: list[dict]) -> list[dict]:
    """Per engine precision: batch 1 (one request at a time) against its best batch size, from the greedy engine
    rows."""
    summary = []
    greedy = [r for r in rows if r["backend"] == "seqserve-engine" and r.get("num_beams", 1) == 1]
    for precision in dict.fromkeys(r["precision"] for r in greedy):
        engine = [r for r in greedy if r["precision"] == precision]
        one = next((r for r in engine if r["batch_size"] == 1), None)
        best = max(engine, key=lambda r: r["tokens_per_s"])
        summary.append({"precision": precision, "batch1_tokens_per_s": one and one["tokens_per_s"],
                        "batch1_mean_latency_ms": one and one["mean_latency_ms_batch1"],
                        "best_batch_size": best["batch_size"], "best_tokens_per_s": best["tokens_per_s"],
                        "speedup": round(best["tokens_per_s"] / one["tokens_per_s"], 2) if one else None})
    return summary


def markdown_section(report: dict, title: str) -> str:
    """The docs/benchmarks.md section: command, machine, table, and the batched-engine reading."""
    s = report["settings"]
    beam_ref = f", beam rows: `{report['beam_reference']}`" if report.get("beam_reference") else ""
    out = [f"## {title}", "", "```", report["command"], "```", "",
           f"Machine: {describe(report['machine'])}.", "",
           f"{s['n_inputs']} inputs ({s['inputs']}), {s['decoding']}, max_new_tokens {s['max_new_tokens']}, "
           f"min_new_tokens {s['min_new_tokens']}, intra-op threads {s['threads']}; reference: "
           f"`{report['reference']}`{beam_ref}; peak RSS is each row's own fresh process.", "",
           markdown_table(report["rows"]), "", "### Engine against its own graph, CTranslate2 and transformers", "",
           markdown_table(report["ratios"], RATIO_COLUMNS), ""]
    summary = report["engine_batching"]
    if summary:
        out += ["### Batched engine vs one at a time", ""]
        for b in summary:
            if b["speedup"] is None:
                continue
            out.append(f"- {b['precision']}: {b['batch1_tokens_per_s']:,.1f} tokens/s at batch 1 "
                       f"({b['batch1_mean_latency_ms']:,.1f} ms per input) vs {b['best_tokens_per_s']:,.1f} tokens/s "
                       f"at batch {b['best_batch_size']}: {b['speedup']:.2f}x.")
        out.append("")
    if report["skipped"]:
        out += [f"Skipped: {'; '.join(report['skipped'])}.", ""]
    return "\n".join(out)
