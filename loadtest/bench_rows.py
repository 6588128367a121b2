"""One benchmark row = one backend, precision, batch size and beam width, run alone in a fresh process.

run_row() is the child's whole life: load the model, warm up on one batch, decode every input once (timed), report
its outputs and the process's peak RSS. Each backend's libraries are imported inside its loader, so an engine row's
process never loads torch and its memory is its own.

Every onnxruntime row (engine, graph-loop) runs with idle spinning off: at 1 thread there is no pool to spin, and
with more threads on a shared machine spinning steals the cores the measured work needs.
"""
from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PYTORCH_NO_CACHE, PYTORCH_KV_CACHE = "pytorch-no-cache", "pytorch-kv-cache"
TRANSFORMERS = "transformers"  # `bench --hf`: the original model's own generate, the oracle of token agreement
# --shape base|small: the checkpoint's own weights in a transformers MarianMTModel (exact), the speed anchor
TRANSFORMERS_MARIAN = "transformers-marian"
ENGINE, GRAPH_LOOP, CTRANSLATE2 = "seqserve-engine", "graph-loop", "ctranslate2"
WARMUP_TOKENS = 2
# Beam rows: ours stop as soon as num_beams hypotheses are finished, the rule CTranslate2 has (patience 1); HF's
# default heuristic has no CTranslate2 equivalent (export/ctranslate2_greedy.py lists what else differs).
BEAM_EARLY_STOPPING = True

Generate = Callable[[list[list[int]], int], list[list[int]]]  # (sources, max_new_tokens) -> ids per source
Loaded = tuple[Generate, str, str | None]  # generate, where it runs, the decoder graph (onnxruntime rows)


@dataclass(frozen=True)
class Workload:
    """What every row decodes, and with what; identical for all rows of one run."""

    sources: list[list[int]]  # encoder inputs (tokenizer ids ending with </s>), in held-out order
    max_new_tokens: int
    threads: int
    device: str  # engine and CTranslate2: cpu | cuda | auto
    checkpoint: Path | None  # PyTorch and transformers-marian rows
    bundle: Path
    ctranslate2_dir: Path | None = None
    min_new_tokens: int = 0  # the end token is suppressed before this many tokens, on every backend
    kv_cache: str = "auto"  # engine and graph-loop rows: the decoder graph (engine/runtime/runner.py choose_cache)
    hf_dir: Path | None = None  # `bench --hf`: the Hugging Face directory the transformers rows load
    # The model forces its end token at max_new_tokens (generation_config forced_eos_token_id): the engine and
    # transformers apply it; CTranslate2 cannot, so it decodes the max_new_tokens - 1 tokens before it.
    forced_eos: bool = False

    def min_new(self, max_new_tokens: int) -> int:
        """min_new_tokens for one call (the warm-up asks for fewer tokens than min_new_tokens); below a forced
        end token, which is the last of max_new_tokens."""
        return min(self.min_new_tokens, self.before_forced_eos(max_new_tokens))

    def before_forced_eos(self, max_new_tokens: int) -> int:
        """The tokens before a forced end token: the limit of a backend that cannot force it (CTranslate2, the bare
        graph loop), so that every backend generates the same tokens."""
        return max_new_tokens - 1 if self.forced_eos and max_new_tokens > 1 else max_new_tokens


@dataclass(frozen=True)
class RowSpec:
    backend: str
    precision: str  # fp32 | int8 | fp16
    batch_size: int  # sources decoded together (a beam row holds num_beams decoder rows per source)
    num_beams: int = 1  # 1 = greedy

    @property
    def name(self) -> str:
        beams = f" beam{self.num_beams}" if self.num_beams > 1 else ""
        return f"{self.backend} {self.precision} b{self.batch_size}{beams}"


@dataclass(frozen=True)
class RowRun:
    outputs: list[list[int]]  # generated ids per input, end token excluded
    wall_s: float  # decoding every input once, after model load and warm-up
    peak_rss_mb: float  # peak RSS of this row's own process (model, libraries and interpreter included)
    device: str  # where it actually ran, e.g. CPUExecutionProvider
    graph: str | None = None  # onnxruntime rows: the decoder graph run (decoder_inplace or decoder)
    cpu_s: float | None = None  # this process's CPU time (every thread) over the same decoding


def run_row(spec: RowSpec, work: Workload) -> RowRun:
    """Runs in a fresh (spawned) process; see the module docstring."""
    generate, device, graph = LOADERS[spec.backend](spec, work)
    generate(work.sources[: spec.batch_size], WARMUP_TOKENS)  # first-run allocations and lazy init stay untimed
    start, cpu = time.perf_counter(), time.process_time()
    outputs = generate(work.sources, work.max_new_tokens)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return RowRun(outputs, wall, peak_rss_mb(), device, graph, cpu)


def peak_rss_mb() -> float:
    """This process's peak RSS. Linux: VmHWM, which exec resets; ru_maxrss is not used there because a spawned
    child inherits its parent's peak across fork + exec (every row would report the parent's figure)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # macOS: bytes; elsewhere kB


def _pytorch(spec: RowSpec, work: Workload) -> Loaded:
    import torch

    from seqserve.model.checkpoint import load_checkpoint
    from seqserve.model.decoding import greedy_decode

    torch.set_num_threads(work.threads)
    device = "cuda" if work.device != "cpu" and torch.cuda.is_available() else "cpu"
    model, _ = load_checkpoint(work.checkpoint)
    model = model.to(device)
    use_cache = spec.backend == PYTORCH_KV_CACHE

    def generate(sources: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        step = spec.batch_size  # static batches in input order, each decoded until all its rows end
        return [ids for i in range(0, len(sources), step)
                for ids in greedy_decode(model, sources[i : i + step], max_new_tokens, use_cache)]

    return generate, f"torch-{device}", None


def _transformers(spec: RowSpec, work: Workload) -> Loaded:
    """transformers' own generate, static batches, right-padded: on the original directory under its
    generation_config (bad_words_ids, forced BOS/EOS, renormalize_logits), as the engine serves it (`bench --hf`), or
    on the checkpoint's own weights in a MarianMTModel (transformers-marian, loadtest/marian_twin.py). fp16 = the
    model cast to half precision (a GPU row)."""
    import torch

    torch.set_num_threads(work.threads)
    device = torch_device(work.device)
    if spec.backend == TRANSFORMERS:
        from transformers import AutoModelForSeq2SeqLM

        model = AutoModelForSeq2SeqLM.from_pretrained(str(work.hf_dir)).eval()
    else:
        from seqserve.loadtest import marian_twin

        model = marian_twin.load(work.checkpoint)
    model = model.to(device, torch.float16 if spec.precision == "fp16" else torch.float32)
    pad = model.generation_config.pad_token_id
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    # beam settings only on beam rows: greedy generate warns that they are ignored
    beams = ({"num_beams": spec.num_beams, "length_penalty": 1.0, "early_stopping": BEAM_EARLY_STOPPING}
             if spec.num_beams > 1 else {"num_beams": 1})

    def generate(sources: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        outputs = []
        for i in range(0, len(sources), spec.batch_size):
            batch = sources[i : i + spec.batch_size]
            width = max(map(len, batch))
            ids = torch.full((len(batch), width), pad, dtype=torch.long)  # (B, S)
            mask = torch.zeros((len(batch), width), dtype=torch.long)  # (B, S)
            for row, source in enumerate(batch):
                ids[row, : len(source)], mask[row, : len(source)] = torch.tensor(source), 1
            with torch.no_grad():
                out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
                                     num_return_sequences=1, max_new_tokens=max_new_tokens,
                                     min_new_tokens=work.min_new(max_new_tokens), **beams)  # (B, 1 + new)
            for row in out[:, 1:].tolist():  # the first column is the decoder start token; tolist() syncs the GPU
                end = next((k for k, t in enumerate(row) if t in eos), len(row))
                outputs.append(row[:end])
        return outputs

    return generate, f"torch-{device}", None


def torch_device(device: str) -> str:
    """torch's device for a row: cuda when asked (an error if torch sees no GPU: a CPU figure must never pass for a
    GPU one), auto = cuda when torch sees one."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"--device cuda: torch {torch.__version__} sees no CUDA GPU (a CPU-only build, or no "
                           "driver)")
    return "cuda" if device != "cpu" and torch.cuda.is_available() else "cpu"


def _runtime(work: Workload):
    from seqserve.engine.runtime.device import RuntimeConfig

    return RuntimeConfig(device=work.device, intra_op_threads=work.threads, allow_spinning=False)


def _engine(spec: RowSpec, work: Workload) -> Loaded:
    from seqserve.contract.manifest import load_manifest
    from seqserve.contract.tokenizer import load_tokenizer
    from seqserve.engine.build import offline
    from seqserve.engine.request import Request, SamplingParams
    from seqserve.engine.runtime.runner import Runner
    from seqserve.engine.step.scheduler import SchedulerConfig

    rows = spec.batch_size * spec.num_beams  # a beam request holds one row of the running batch per beam
    runner = Runner(work.bundle, _runtime(work), spec.precision, capacity=rows, kv_cache=work.kv_cache)
    tokenizer = load_tokenizer(work.bundle / load_manifest(work.bundle).tokenizer["file"])

    def generate(sources: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        # The server's continuous batching; the KV budget is raised so only max_batch_size limits admission.
        need = rows * max(len(s) + max_new_tokens for s in sources)
        engine = offline(runner, tokenizer, max_batch_size=rows, max_waiting=len(sources),
                         max_kv_tokens=max(SchedulerConfig.max_kv_tokens, need))
        params = SamplingParams(max_new_tokens=max_new_tokens, min_new_tokens=work.min_new(max_new_tokens),
                                num_beams=spec.num_beams,
                                early_stopping=BEAM_EARLY_STOPPING if spec.num_beams > 1 else False)
        requests = engine.generate([Request(list(s), params) for s in sources])
        failed = [r.error for r in requests if r.error]
        if failed:
            raise RuntimeError(f"{len(failed)} engine requests failed: {failed[0]}")
        return [r.output_ids for r in requests]

    return generate, runner.provider, runner.cache.graph


def _graph_loop(spec: RowSpec, work: Workload) -> Loaded:
    from seqserve.loadtest.graph_loop import GraphLoop

    loop = GraphLoop(work.bundle, spec.precision, _runtime(work), work.kv_cache)

    def generate(sources: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        limit = work.before_forced_eos(max_new_tokens)  # the bare loop applies no token rules
        return loop.generate(sources, limit, spec.batch_size, min(work.min_new(max_new_tokens), limit))

    return generate, loop.provider, loop.graph


def _ctranslate2(spec: RowSpec, work: Workload) -> Loaded:
    import ctranslate2

    from seqserve.contract.manifest import load_manifest
    from seqserve.contract.tokenizer import load_tokenizer
    from seqserve.export.ctranslate2_greedy import beam_search, load_translator

    device = work.device if work.device != "auto" else ("cuda" if ctranslate2.get_cuda_device_count() else "cpu")
    translator = load_translator(work.ctranslate2_dir, spec.precision, device, work.threads)
    tokenizer = load_tokenizer(work.bundle / load_manifest(work.bundle).tokenizer["file"])  # the checkpoint's copy

    def generate(sources: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        limit = work.before_forced_eos(max_new_tokens)
        return beam_search(translator, tokenizer, sources, limit, spec.batch_size, spec.num_beams,
                           min(work.min_new(max_new_tokens), limit))

    return generate, f"ctranslate2-{device}", None


LOADERS: dict[str, Callable[[RowSpec, Workload], Loaded]] = {
    PYTORCH_NO_CACHE: _pytorch, PYTORCH_KV_CACHE: _pytorch, ENGINE: _engine, GRAPH_LOOP: _graph_loop,
    CTRANSLATE2: _ctranslate2, TRANSFORMERS: _transformers,
    TRANSFORMERS_MARIAN: _transformers}
