"""What the edge's own calls cost, one at a time: the work seqserve's gRPC edge adds to every call on the event loop,
beside what grpc.aio and the engine do (loadtest/edge_ceiling.py measures those together).

    python -m seqserve.loadtest.edge_calls --bundle BUNDLE

Each row times one of the edge's own steps of a Generate call (timeit, the best of --repeat rounds of --number
calls) with the served model's real parts: its tokenizer and limits, the request a load test sends (the bundle's
first held-out input, max_new_tokens = min_new_tokens = --tokens) and a Result of --tokens tokens.
"""
from __future__ import annotations

import argparse
import secrets
import sys
import timeit
from pathlib import Path

from seqserve.contract.integrity import open_bundle
from seqserve.contract.tsv import heldout_pairs
from seqserve.engine.request import FinishReason, Result, Sequence
from seqserve.server import options
from seqserve.server.metrics import Metrics
from seqserve.server.model_defaults import model_limits
from seqserve.server.responses import response
from seqserve.server.settings import Settings
from seqserve.v1 import seqserve_pb2 as pb

PROG = "python -m seqserve.loadtest.edge_calls"


def calls(bundle: Path, tokens: int) -> dict:
    """Each step's callable, by name, on the bundle's model."""
    manifest, tokenizer = open_bundle(bundle)
    limits = model_limits(Settings(bundle=str(bundle)), manifest)
    text = next(iter(heldout_pairs(bundle, 1)))[0]
    request = pb.GenerateRequest(input=text, options=pb.DecodingOptions(max_new_tokens=tokens, min_new_tokens=tokens))
    raw = request.SerializeToString()
    ids = list(range(4, 4 + tokens))
    result = Result(FinishReason.LENGTH, (Sequence(ids, " ".join(f"w{i}" for i in ids), FinishReason.LENGTH),),
                    len(ids), tokens, 1, 0.01, 0.02, 0.1)
    built = response(result)
    model = Metrics().for_model("m")
    counted, timed = model.requests.labels("Generate", "OK"), model.request_duration.labels("Generate")
    return {
        "request decoded (protobuf)": lambda: pb.GenerateRequest.FromString(raw),
        "options validated (server/options.py)": lambda: options.sampling_params(request.options, limits, seed=1),
        "input tokenized (tokenizer.encode)": lambda: tokenizer.encode(text).ids,
        "seed drawn (secrets.randbits)": lambda: secrets.randbits(64),
        "response built (server/responses.py)": lambda: response(result),
        "response encoded (protobuf)": built.SerializeToString,
        "call counted and timed (metrics)": lambda: (counted.inc(), timed.observe(0.1)),
    }


def measure(bundle: Path, tokens: int, number: int, repeat: int) -> dict[str, float]:
    """Microseconds per call of each step."""
    return {name: 1e6 * min(timeit.repeat(fn, number=number, repeat=repeat)) / number
            for name, fn in calls(bundle, tokens).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--bundle", required=True)
    parser.add_argument("--tokens", type=int, default=32, help="the request's forced length and the result's")
    parser.add_argument("--number", type=int, default=5000, help="calls per round")
    parser.add_argument("--repeat", type=int, default=5, help="rounds (the best counts)")
    a = parser.parse_args(argv)
    if min(a.tokens, a.number, a.repeat) <= 0:
        parser.error("--tokens, --number and --repeat must be positive")
    costs = measure(Path(a.bundle), a.tokens, a.number, a.repeat)
    print("| the edge's own step, per Generate call | µs |\n|---|---:|")
    for name, us in costs.items():
        print(f"| {name} | {us:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
