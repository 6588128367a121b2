"""Where a decoder step's time goes.

    python -m seqserve.loadtest.step_profile BUNDLE [--device cuda] [--batch-sizes 1,8,64]

For each batch size: one decoder step for every row, the encoder for the whole batch, one row leaving and one row
joining (the KV cache's slot operations), in milliseconds, on the server's own Runner. No torch.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from seqserve.engine.request import Request, SamplingParams
from seqserve.engine.runtime.device import RuntimeConfig
from seqserve.engine.runtime.runner import Runner
from seqserve.engine.runtime.slots import Joining

SOURCE = list(range(4, 20))  # 16 source tokens
STEPS = 20


def profile(runner: Runner, batch: int) -> dict[str, float]:
    """Milliseconds per operation at this batch size (the runner is left empty)."""
    rows = [Request(input_ids=SOURCE, params=SamplingParams()) for _ in range(batch)]
    start = time.perf_counter()
    join(runner, rows)
    encode = time.perf_counter() - start
    live = runner.slots.live[: runner.slots.hi]
    for _ in range(4):  # warm-up: first-run allocations stay untimed
        runner.step()
        runner.slots.append(np.ones(runner.slots.hi, np.int64), live)
    start = time.perf_counter()
    for _ in range(STEPS):
        runner.step()
        runner.slots.append(np.ones(runner.slots.hi, np.int64), live)
    step = (time.perf_counter() - start) / STEPS
    start = time.perf_counter()
    runner.retire([rows[0].id])
    leave = time.perf_counter() - start
    joining = [Request(input_ids=SOURCE, params=SamplingParams())]
    start = time.perf_counter()
    join(runner, joining)
    joined = time.perf_counter() - start
    runner.retire([r.id for r in rows[1:] + joining])
    return {"step": 1e3 * step, "encode_batch": 1e3 * encode, "one_leaves": 1e3 * leave, "one_joins": 1e3 * joined}


def join(runner: Runner, rows: list[Request]) -> None:
    """The encoder for these rows, then their rows take slots (as the engine admits them)."""
    cross, _ = runner.encode([r.id for r in rows], [r.input_ids for r in rows])
    runner.admit(Joining.of(rows), [cross[r.id] for r in rows])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    p.add_argument("--variant", default="fp32")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0 = one per core)")
    p.add_argument("--batch-sizes", default="1,8,64,256")
    args = p.parse_args(argv)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    runner = Runner(args.bundle, RuntimeConfig(device=args.device, intra_op_threads=args.threads), args.variant,
                    capacity=max(sizes))
    print(f"{runner.provider}, {args.variant}: milliseconds")
    for batch in sizes:
        ms = profile(runner, batch)
        print(f"batch {batch:4}: " + "  ".join(f"{name} {value:7.2f}" for name, value in ms.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
