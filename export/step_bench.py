"""Per-step time of the decoder graphs on random weights of standard shapes: plain (concat cache) vs in-place, fp32
and int8 variants, through bare onnxruntime loops (no engine), 1 intra-op thread.

    python -m seqserve.export.step_bench --shape default --batch 1 64

Each loop is one generation: 32 forced tokens (--steps) against 16-token sources (the issue's graph-loop setting), so
the plain graph's past grows 0..31 and is fed back as OrtValues; the in-place graph writes into max_len buffers. Rounds
interleave the graphs (load drifts on a shared machine). Reported per step: the process's CPU time (one thread, no
spinning: what the graph costs even while other jobs share the cores), its minimum over rounds (the least disturbed
round; contention inflates CPU time too, through caches) and median, and the median wall time. The load average is
printed before and after.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from seqserve.contract import names
from seqserve.export import variants as vr
from seqserve.export.inplace_decoder import export_inplace_decoder
from seqserve.export.onnx_export import export_decoder
from seqserve.export.ort_io import cpu_session, inplace_step
from seqserve.export.token_choice import add_token_choice
from seqserve.model import presets
from seqserve.model.config import ModelConfig
from seqserve.model.transformer import Transformer

_DEFAULT = presets.preset("default")
SHAPES = {"default": asdict(_DEFAULT.arch) | {"vocab_size": _DEFAULT.vocab_size}} | {
    name: asdict(arch) | {"vocab_size": presets.SHAPE_VOCAB} for name, arch in presets.SHAPES.items()}
CHOICE = "inplace+choice"  # the in-place graph with the token-choice outputs, fetching only the ids
SRC_LEN, STEPS = 16, 32  # the graph-loop setting; --steps lengthens the generation


def random_model(shape: str) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(**SHAPES[shape] | {"dropout": 0.0, "max_positions": 256})).eval()


def _kv(cfg, batch: int, length: int, rng) -> list[np.ndarray]:
    return [rng.standard_normal((batch, cfg.n_heads, length, cfg.head_dim)).astype(np.float32)
            for _ in range(2 * cfg.n_decoder_layers)]


def plain_loop(session: ort.InferenceSession, cfg, batch: int, rng, steps: int = STEPS) -> Callable[[], None]:
    """One generation through decoder.onnx: present (past_len + 1) fed back as the next step's past OrtValues."""
    n = cfg.n_decoder_layers
    ids = rng.integers(4, cfg.vocab_size, (batch, steps))
    cross = [ort.OrtValue.ortvalue_from_numpy(c) for c in _kv(cfg, batch, SRC_LEN, rng)]
    src_mask = np.ones((batch, SRC_LEN), np.int64)
    empty = [ort.OrtValue.ortvalue_from_numpy(p) for p in _kv(cfg, batch, 0, rng)]

    def run() -> None:
        past = empty
        for t in range(steps):
            binding = session.io_binding()
            binding.bind_output(names.LOGITS, "cpu")
            binding.bind_cpu_input(names.DECODER_INPUT_IDS, np.ascontiguousarray(ids[:, t : t + 1]))
            binding.bind_cpu_input(names.POSITION_IDS, np.full((batch, 1), t, np.int64))
            binding.bind_cpu_input(names.DECODER_ATTENTION_MASK, np.ones((batch, t + 1), np.int64))
            binding.bind_cpu_input(names.ENCODER_ATTENTION_MASK, src_mask)
            for name, value in zip(names.past_inputs(n) + names.cross_inputs(n), past + cross):
                binding.bind_ortvalue_input(name, value)
            for name in names.present_outputs(n):
                binding.bind_output(name, "cpu")
            session.run_with_iobinding(binding)
            binding.get_outputs()[0].numpy().argmax(-1)
            past = binding.get_outputs()[1:]
    return run


def inplace_loop(session: ort.InferenceSession, cfg, batch: int, rng, steps: int = STEPS,
                 choice: bool = False) -> Callable[[], None]:
    """One generation through decoder_inplace.onnx with the reference driver (ort_io.inplace_step); the buffers
    hold twice the generation, as a server's would hold more than any one row uses. choice: the graph ends with the
    token-choice outputs and the step fetches only the ids (no argmax on the host)."""
    ids = rng.integers(4, cfg.vocab_size, (batch, steps))
    cross = _kv(cfg, batch, SRC_LEN, rng)
    src_mask = np.ones((batch, SRC_LEN), np.int64)
    buffers = _kv(cfg, batch, min(2 * steps, cfg.max_positions), rng)

    def run() -> None:
        for t in range(steps):
            args = (session, ids[:, t : t + 1], np.full(batch, t, np.int32), src_mask, buffers, cross)
            if choice:
                inplace_step(*args, fetch=names.NEXT_TOKEN_IDS)
            else:
                inplace_step(*args).argmax(-1)
    return run


def build(model: Transformer, directory: Path, int8: bool, token_choice: bool = False) -> dict[str, Path]:
    """{label: graph file}: fp32 plain and in-place, their int8 variants if asked, and the in-place graph with the
    token-choice outputs (export/token_choice.py) if asked."""
    paths = {"plain fp32": directory / names.DECODER_FILE, "inplace fp32": directory / names.DECODER_INPLACE_FILE}
    export_decoder(model, paths["plain fp32"])
    export_inplace_decoder(model, paths["inplace fp32"])
    if token_choice:
        import onnx

        paths[CHOICE] = directory / "inplace_choice.onnx"
        onnx.save(add_token_choice(onnx.load(str(paths["inplace fp32"]))), str(paths[CHOICE]))
    if int8:
        for label in ("plain", "inplace"):
            dst = directory / f"{label}.int8.onnx"
            vr.make_int8(paths[f"{label} fp32"], dst)
            paths[f"{label} int8"] = dst
    return paths


def measure(paths: dict[str, Path], cfg, batches: list[int], rounds: int, threads: int,
            steps: int = STEPS) -> list[dict]:
    """Median CPU and wall ms per decoder step of each graph at each batch size, rounds interleaved across graphs."""
    rows = []
    for batch in batches:
        loops = {}
        for label, path in paths.items():
            session = cpu_session(path, threads=threads)
            rng = np.random.default_rng(0)
            if label == CHOICE:
                loops[label] = inplace_loop(session, cfg, batch, rng, steps, choice=True)
            else:
                make = inplace_loop if label.startswith("inplace") else plain_loop
                loops[label] = make(session, cfg, batch, rng, steps)
            loops[label]()  # warm-up
        cpu: dict[str, list[float]] = {label: [] for label in loops}
        wall: dict[str, list[float]] = {label: [] for label in loops}
        for _ in range(rounds):
            for label, run in loops.items():
                start_cpu, start = time.process_time(), time.perf_counter()
                run()
                cpu[label].append((time.process_time() - start_cpu) / steps * 1e3)
                wall[label].append((time.perf_counter() - start) / steps * 1e3)
        rows += [{"batch": batch, "graph": label, "cpu_min_ms": min(cpu[label]),
                  "cpu_median_ms": statistics.median(cpu[label]), "wall_ms": statistics.median(wall[label])}
                 for label in loops]
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="default")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=STEPS, help="tokens per generation (below max_positions, 256)")
    parser.add_argument("--no-int8", action="store_true")
    parser.add_argument("--token-choice", action="store_true",
                        help="also the in-place graph with the token-choice outputs, fetching only the ids")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model = random_model(args.shape)
    with tempfile.TemporaryDirectory() as tmp:
        paths = build(model, Path(tmp), int8=not args.no_int8, token_choice=args.token_choice)
        nodes = {label: _node_count(path) for label, path in paths.items()}
        load_before = _load()
        rows = measure(paths, model.cfg, args.batch, args.rounds, args.threads, args.steps)
    print(f"shape {args.shape}, {args.threads} thread(s), {args.steps} steps x {SRC_LEN}-token sources, median of "
          f"{args.rounds} interleaved rounds; load average {load_before} before, {_load()} after")
    print(f"{'ms per step':<14} {'nodes':>5} " + " ".join(
        f"{f'b{b} cpu min':>11} {'cpu median':>11} {'wall median':>12}" for b in args.batch))
    for label in paths:
        cells = [(r["cpu_min_ms"], r["cpu_median_ms"], r["wall_ms"]) for b in args.batch for r in rows
                 if r["graph"] == label and r["batch"] == b]
        print(f"{label:<14} {nodes[label]:>5} " + " ".join(f"{c:>11.3f} {m:>11.3f} {w:>12.3f}" for c, m, w in cells))


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _node_count(path: Path) -> int:
    import onnx

    return len(onnx.load(str(path), load_external_data=False).graph.node)


if __name__ == "__main__":
    main()
