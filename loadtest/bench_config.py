"""`seqserve bench` settings: one typed dataclass and its flags (stdlib only: the CLI builds every parser at start)."""
from __future__ import annotations

import argparse
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from seqserve.contract.devices import DEVICES

DEFAULT_BATCH_SIZES = (1, 8, 32, 64)
DEFAULT_N = 256


@dataclass(frozen=True)
class BenchConfig:
    checkpoint: Path  # PyTorch rows and the CTranslate2 conversion
    bundle: Path | None = None  # engine rows; None = export fp32 + int8 from the checkpoint into a temporary dir
    num_inputs: int = DEFAULT_N  # the first N lines of the bundle's heldout.tsv
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES  # engine and CTranslate2 rows
    torch_batch_sizes: tuple[int, ...] = (1,)  # PyTorch rows: the reference decodes one input at a time
    max_new_tokens: int | None = None  # None = the bundle's validated max_new_tokens
    threads: int = os.cpu_count() or 1  # intra-op threads, the same for every backend
    device: str = "cpu"  # every backend; PyTorch rows run on CUDA when torch sees a GPU, else on the CPU
    ctranslate2: bool = True
    ctranslate2_dir: Path | None = None  # a converted model to reuse; None = convert the checkpoint on the fly
    out: Path | None = None  # JSON; None = reports/bench-<timestamp>.json
    markdown: Path | None = None  # also write the markdown section (command, machine, table) here
    progress: bool = True

    def __post_init__(self) -> None:
        if self.num_inputs <= 0 or self.threads <= 0:
            raise ValueError("--num-inputs and --threads must be positive")
        if not self.batch_sizes or not self.torch_batch_sizes or min(self.batch_sizes + self.torch_batch_sizes) <= 0:
            raise ValueError("batch sizes must be positive integers")
        if self.max_new_tokens is not None and self.max_new_tokens <= 0:
            raise ValueError("--max-new-tokens must be positive")
        if self.device not in DEVICES:
            raise ValueError(f"--device must be one of {DEVICES}")

    @property
    def out_path(self) -> Path:
        return self.out or Path("reports") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"

    def command(self, max_new_tokens: int) -> str:
        """The exact command with every setting resolved, so a reader can rerun the same benchmark."""
        parts = ["seqserve", "bench", "--checkpoint", str(self.checkpoint)]
        parts += ["--bundle", str(self.bundle)] if self.bundle else []
        parts += ["-n", str(self.num_inputs), "--batch-sizes", _join(self.batch_sizes),
                  "--torch-batch-sizes", _join(self.torch_batch_sizes), "--max-new-tokens", str(max_new_tokens),
                  "--threads", str(self.threads), "--device", self.device]
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
    p.add_argument("--checkpoint", required=True, help="checkpoint directory (PyTorch rows, CTranslate2 conversion)")
    p.add_argument("--bundle", help="bundle exported from that checkpoint (engine rows; int8 rows need --int8); "
                                    "default: export fp32 + int8 into a temporary directory")
    p.add_argument("-n", "--num-inputs", type=int, default=DEFAULT_N, help="held-out inputs (first N of heldout.tsv)")
    p.add_argument("--batch-sizes", type=_sizes, default=DEFAULT_BATCH_SIZES, help="engine and CTranslate2 rows")
    p.add_argument("--torch-batch-sizes", type=_sizes, default=(1,), help="PyTorch rows (the reference: 1)")
    p.add_argument("--max-new-tokens", type=int, help="default: the bundle's validated max_new_tokens")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="intra-op threads for every backend")
    p.add_argument("--device", choices=DEVICES, default="cpu", help="every backend (PyTorch: cuda only if torch sees a GPU)")
    p.add_argument("--no-ctranslate2", dest="ctranslate2", action="store_false", help="skip the CTranslate2 rows")
    p.add_argument("--ctranslate2", dest="ctranslate2_dir", metavar="DIR",
                   help="reuse a model converted by `seqserve export --ctranslate2 DIR` (default: convert on the fly)")
    p.add_argument("--out", help="JSON report (default: reports/bench-<timestamp>.json)")
    p.add_argument("--markdown", help="also write the markdown section (command, machine, table) to this file")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def from_args(args: argparse.Namespace) -> BenchConfig:
    path = lambda value: Path(value) if value else None  # noqa: E731
    return BenchConfig(checkpoint=Path(args.checkpoint), bundle=path(args.bundle), num_inputs=args.num_inputs,
                       batch_sizes=tuple(args.batch_sizes), torch_batch_sizes=tuple(args.torch_batch_sizes),
                       max_new_tokens=args.max_new_tokens, threads=args.threads, device=args.device,
                       ctranslate2=args.ctranslate2, ctranslate2_dir=path(args.ctranslate2_dir), out=path(args.out),
                       markdown=path(args.markdown), progress=not args.quiet)
