"""`seqserve bench` settings: one typed dataclass and its flags (stdlib only: the CLI builds every parser at start)."""
from __future__ import annotations

import argparse
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from seqserve.contract.devices import DEVICES
from seqserve.contract.names import KV_CACHES
from seqserve.model.hf_families import FAMILIES
from seqserve.model.presets import SHAPES

DEFAULT_BATCH_SIZES = (1, 8, 32, 64)
DEFAULT_BEAM_BATCH_SIZES = (1, 16)  # sources per batch; at width 4, batch 16 is 64 decoder rows
DEFAULT_N = 256
DEFAULT_NUM_BEAMS = 4
SHAPE_NAMES = ("default", *SHAPES)  # the trained checkpoint, or a random-weight size of model/presets.py
FORCED_TOKENS = 32  # base/small: every backend generates exactly this many tokens per input (random weights)
THREADS_HELP = ("intra-op threads for every backend (default 1: more threads than free cores made a row 30x slower "
                "on a busy 2-core machine; raise it only on a quiet machine with that many free cores)")


@dataclass(frozen=True)
class BenchConfig:
    checkpoint: Path | None = None  # --shape default: PyTorch rows and the CTranslate2 conversion
    hf_dir: Path | None = None  # --hf: a Hugging Face model directory, imported (random sources, forced length)
    shape: str = "default"  # default = the checkpoint above; base | small = random weights (loadtest/shapes.py)
    bundle: Path | None = None  # engine rows; None = export fp32 + int8 from the checkpoint into a temporary dir
    num_inputs: int = DEFAULT_N  # the first N lines of the bundle's heldout.tsv (base/small: N random sources)
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES  # engine, graph-loop and CTranslate2 rows
    torch_batch_sizes: tuple[int, ...] = (1,)  # PyTorch rows: the reference decodes one input at a time
    max_new_tokens: int | None = None  # None = the bundle's validated max_new_tokens (base/small: FORCED_TOKENS)
    min_new_tokens: int | None = None  # None = 0 on default, max_new_tokens on base/small (forced length)
    num_beams: int = DEFAULT_NUM_BEAMS  # beam rows' width (engine and CTranslate2); 1 = no beam rows
    beam_batch_sizes: tuple[int, ...] = DEFAULT_BEAM_BATCH_SIZES
    kv_cache: str = "auto"  # engine and graph-loop rows: which decoder graph (Runner kv_cache)
    threads: int = 1  # intra-op threads, the same for every backend (THREADS_HELP says why 1)
    device: str = "cpu"  # every backend; PyTorch rows run on CUDA when torch sees a GPU, else on the CPU
    seed: int = 0  # base/small: weights and sources
    shape_dir: Path | None = None  # base/small: where the checkpoint, bundle and CTranslate2 model are kept and reused
    ctranslate2: bool = True
    # transformers-marian rows (the checkpoint's weights in transformers' MarianMTModel): None = on for base/small
    transformers: bool | None = None
    ctranslate2_dir: Path | None = None  # a converted model to reuse; None = convert the checkpoint on the fly
    out: Path | None = None  # JSON; None = reports/bench-<timestamp>.json
    markdown: Path | None = None  # also write the markdown section (command, machine, table) here
    progress: bool = True

    def __post_init__(self) -> None:
        if self.num_inputs <= 0 or self.threads <= 0 or self.num_beams <= 0:
            raise ValueError("--num-inputs, --threads and --num-beams must be positive")
        sizes = self.batch_sizes + self.torch_batch_sizes + self.beam_batch_sizes
        if not self.batch_sizes or not self.torch_batch_sizes or not self.beam_batch_sizes or min(sizes) <= 0:
            raise ValueError("batch sizes must be positive integers")
        if self.max_new_tokens is not None and self.max_new_tokens <= 0:
            raise ValueError("--max-new-tokens must be positive")
        if self.min_new_tokens is not None and self.min_new_tokens < 0:
            raise ValueError("--min-new-tokens must be >= 0")
        if self.device not in DEVICES:
            raise ValueError(f"--device must be one of {DEVICES}")
        if self.shape not in SHAPE_NAMES or self.kv_cache not in KV_CACHES:
            raise ValueError(f"--shape must be one of {SHAPE_NAMES} and --kv-cache one of {KV_CACHES}")
        if self.hf_dir is not None and (self.shape != "default" or self.checkpoint or self.bundle
                                        or self.ctranslate2_dir):
            raise ValueError("--hf imports its own checkpoint and bundle and converts its own CTranslate2 model "
                             "(--shape-dir keeps them): drop --shape, --checkpoint, --bundle and --ctranslate2")
        if self.hf_dir is not None and self.transformers is not None:
            raise ValueError("--hf runs the original model's own transformers rows: drop --transformers and "
                             "--no-transformers")
        if self.shape == "default" and self.checkpoint is None and self.hf_dir is None:
            raise ValueError("--shape default needs --checkpoint (or --hf DIR)")
        if self.shape != "default" and (self.checkpoint or self.bundle or self.ctranslate2_dir):
            raise ValueError(f"--shape {self.shape} makes its own checkpoint, bundle and CTranslate2 model "
                             "(--shape-dir keeps them): drop --checkpoint, --bundle and --ctranslate2")

    @property
    def random(self) -> bool:
        """base/small and --hf: random sources, every backend forced to the same output length."""
        return self.shape != "default" or self.hf_dir is not None

    @property
    def with_transformers(self) -> bool:
        """transformers-marian rows: asked for, or by default on the random-weight shapes (never with --hf)."""
        if self.hf_dir is not None:
            return False
        return self.transformers if self.transformers is not None else self.shape != "default"

    def resolved_max_new(self, bundle_max_new: int) -> int:
        return self.max_new_tokens or (FORCED_TOKENS if self.random else bundle_max_new)

    def resolved_min_new(self, max_new_tokens: int) -> int:
        min_new = self.min_new_tokens if self.min_new_tokens is not None else (max_new_tokens if self.random else 0)
        if min_new > max_new_tokens:
            raise ValueError(f"--min-new-tokens {min_new} exceeds max_new_tokens {max_new_tokens}")
        return min_new

    @property
    def out_path(self) -> Path:
        return self.out or Path("reports") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"

    def command(self, max_new_tokens: int, min_new_tokens: int) -> str:
        """The exact command with every setting resolved, so a reader can rerun the same benchmark."""
        parts = ["seqserve", "bench", *(["--checkpoint", str(self.checkpoint)] if self.checkpoint else [])]
        parts += ["--hf", str(self.hf_dir)] if self.hf_dir else ["--shape", self.shape]
        parts += ["--bundle", str(self.bundle)] if self.bundle else []
        parts += ["--seed", str(self.seed)] if self.random else []
        parts += ["--shape-dir", str(self.shape_dir)] if self.shape_dir else []
        parts += ["-n", str(self.num_inputs), "--batch-sizes", _join(self.batch_sizes),
                  "--torch-batch-sizes", _join(self.torch_batch_sizes), "--max-new-tokens", str(max_new_tokens),
                  "--min-new-tokens", str(min_new_tokens), "--num-beams", str(self.num_beams),
                  "--beam-batch-sizes", _join(self.beam_batch_sizes), "--kv-cache", self.kv_cache,
                  "--threads", str(self.threads), "--device", self.device]
        if self.hf_dir is None:
            parts.append("--transformers" if self.with_transformers else "--no-transformers")
        if not self.ctranslate2:
            parts.append("--no-ctranslate2")
        elif self.ctranslate2_dir:
            parts += ["--ctranslate2", str(self.ctranslate2_dir)]
        return shlex.join(parts)


def _join(sizes: tuple[int, ...]) -> str:
    return ",".join(map(str, sizes))


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", help="checkpoint directory (PyTorch rows, CTranslate2 conversion); "
                                        "required with --shape default")
    p.add_argument("--shape", choices=SHAPE_NAMES, default="default",
                   help="default: the checkpoint on its held-out inputs; base (d_model 512, 8 heads, 6+6 layers, "
                        "d_ff 2048, vocab 8000) or small (256, 4, 3+3, 1024, 8000): random weights, random sources, "
                        f"every backend forced to the same length ({FORCED_TOKENS} tokens unless --max-new-tokens)")
    p.add_argument("--hf", metavar="DIR",
                   help="a Hugging Face model directory (save_pretrained form, a model_type `seqserve import` reads: "
                        f"{', '.join(FAMILIES)}): imported and exported "
                        "for the engine rows, converted by CTranslate2's own TransformersConverter for its rows, and "
                        "run by transformers' generate (the reference of token agreement); random sources, every "
                        f"backend forced to the same length ({FORCED_TOKENS} tokens unless --max-new-tokens)")
    p.add_argument("--bundle", help="bundle exported from that checkpoint (engine rows; int8 rows need --int8); "
                                    "default: export fp32 + int8 into a temporary directory")
    p.add_argument("--seed", type=int, default=0, help="base/small: the random weights and sources")
    p.add_argument("--shape-dir", help="base/small: keep the generated checkpoint, bundle and CTranslate2 model here "
                                       "and reuse them when the settings match (default: a temporary directory)")
    p.add_argument("-n", "--num-inputs", type=int, default=DEFAULT_N, help="held-out inputs (first N of heldout.tsv)")
    p.add_argument("--batch-sizes", type=_sizes, default=DEFAULT_BATCH_SIZES,
                   help="engine, graph-loop and CTranslate2 greedy rows")
    p.add_argument("--torch-batch-sizes", type=_sizes, default=(1,), help="PyTorch rows (the reference: 1)")
    p.add_argument("--max-new-tokens", type=int, help=f"default: the bundle's validated max_new_tokens "
                                                      f"(base/small: {FORCED_TOKENS})")
    p.add_argument("--min-new-tokens", type=int, help="the end token is suppressed until this many tokens, on every "
                                                      "backend (default: 0; base/small: --max-new-tokens); > 0 "
                                                      "skips the PyTorch rows")
    p.add_argument("--num-beams", type=int, default=DEFAULT_NUM_BEAMS,
                   help="beam rows' width: the engine's num_beams beside CTranslate2's beam_size (1 = no beam rows)")
    p.add_argument("--beam-batch-sizes", type=_sizes, default=DEFAULT_BEAM_BATCH_SIZES,
                   help="beam rows: sources per batch (each holds --num-beams decoder rows)")
    p.add_argument("--kv-cache", choices=KV_CACHES, default="auto",
                   help="engine and graph-loop rows: inplace (decoder_inplace) or concat (decoder) graph; auto = "
                        "inplace when the bundle has it and the provider is the CPU")
    p.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    p.add_argument("--device", choices=DEVICES, default="cpu",
                   help="every backend (PyTorch: cuda only if torch sees a GPU)")
    p.add_argument("--no-ctranslate2", dest="ctranslate2", action="store_false", help="skip the CTranslate2 rows")
    p.add_argument("--transformers", action=argparse.BooleanOptionalAction, default=None,
                   help="transformers-marian rows: the checkpoint's own weights in a transformers MarianMTModel, "
                        "decoded by its generate on the same device and inputs (fp32; fp16 too on cuda), greedy and "
                        "beam (default: on for base/small, off for a trained checkpoint)")
    p.add_argument("--ctranslate2", dest="ctranslate2_dir", metavar="DIR",
                   help="reuse a model converted by `seqserve export --ctranslate2 DIR` (default: convert on the fly)")
    p.add_argument("--out", help="JSON report (default: reports/bench-<timestamp>.json)")
    p.add_argument("--markdown", help="also write the markdown section (command, machine, table) to this file")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def from_args(args: argparse.Namespace) -> BenchConfig:
    path = lambda value: Path(value) if value else None  # noqa: E731
    return BenchConfig(checkpoint=path(args.checkpoint), hf_dir=path(args.hf), shape=args.shape,
                       bundle=path(args.bundle),
                       num_inputs=args.num_inputs, batch_sizes=tuple(args.batch_sizes),
                       torch_batch_sizes=tuple(args.torch_batch_sizes), max_new_tokens=args.max_new_tokens,
                       min_new_tokens=args.min_new_tokens, num_beams=args.num_beams,
                       beam_batch_sizes=tuple(args.beam_batch_sizes), kv_cache=args.kv_cache, threads=args.threads,
                       device=args.device, seed=args.seed, shape_dir=path(args.shape_dir),
                       ctranslate2=args.ctranslate2, transformers=args.transformers,
                       ctranslate2_dir=path(args.ctranslate2_dir), out=path(args.out),
                       markdown=path(args.markdown), progress=not args.quiet)
