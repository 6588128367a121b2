"""The `seqserve` command. Each subcommand imports its package lazily, so `serve` never loads torch."""
from __future__ import annotations

import argparse
import sys


def _train(args: argparse.Namespace) -> int:
    from model.presets import preset
    from model.train import train

    overrides = {k: v for k, v in {"max_steps": args.max_steps, "seed": args.seed, "threads": args.threads}.items()
                 if v is not None}
    if args.data:
        overrides.update(task="tsv", data=args.data)
    metrics = train(preset(args.preset, **overrides), args.out, resume=args.resume, quiet=args.quiet)
    if metrics:
        test = metrics["test"]
        print(f"test exact match {test['exact_match']:.2%} (chrF {test['chrf']:.1f}, n={test['n']}) "
              f"after {metrics['steps']} steps in {metrics['train_seconds']:.0f}s -> {args.out}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from server import settings
    from server.app import run

    return run(settings.load(args))


def _generate(args: argparse.Namespace) -> int:
    import grpc

    from server.client import OPTION_NAMES, Client

    decoding = {name: getattr(args, name) for name in OPTION_NAMES}
    with Client(args.server, timeout=args.timeout) as client:
        try:
            if args.stream:
                for piece in client.stream(args.input, **decoding):
                    print(piece.text, end="", flush=True)
                    result = piece.result
                print()
            else:
                result = client.generate(args.input, **decoding)
                print(result.text)
        except grpc.RpcError as exc:
            print(f"seqserve generate: error: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    print(f"[{result.finish_reason}: {result.input_tokens} input + {result.generated_tokens} generated tokens, "
          f"seed {result.seed}, first token {result.first_token_seconds * 1e3:.1f} ms, "
          f"total {result.total_seconds * 1e3:.1f} ms]", file=sys.stderr)
    return 0


def _add_serving_commands(sub) -> None:
    from server.settings import add_arguments

    p = sub.add_parser("serve", help="serve a bundle over gRPC (flags or SEQSERVE_* environment variables)",
                       description="Serves a bundle over gRPC with health, reflection and Prometheus metrics. "
                                   "Every flag can also be set as the environment variable named in its help; "
                                   "flags win. SIGTERM/SIGINT drain gracefully and exit 0.")
    add_arguments(p)
    p.set_defaults(func=_serve)

    p = sub.add_parser("generate", help="generate text with a running server")
    p.add_argument("input", help='source text, e.g. "b 5 9 k"')
    p.add_argument("--server", default="127.0.0.1:50051", help="host:port of the gRPC server")
    p.add_argument("--stream", action="store_true", help="print pieces as they are produced")
    p.add_argument("--timeout", type=float, help="deadline of the call in seconds")
    # Decoding options: the proto's names; unset ones take the server's defaults.
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--min-new-tokens", type=int)
    p.add_argument("--temperature", type=float, help="0 = greedy")
    p.add_argument("--top-k", type=int, help="0 = disabled")
    p.add_argument("--top-p", type=float, help="in (0, 1]; 1 = disabled")
    p.add_argument("--repetition-penalty", type=float, help="1 = disabled")
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    p.add_argument("--seed", type=int, help="sampling seed (default: chosen by the server and printed)")
    p.set_defaults(func=_generate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seqserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model (runs under torchrun for DistributedDataParallel)")
    p.add_argument("--preset", default="default", help="tiny | default")
    p.add_argument("--out", required=True, help="checkpoint directory")
    p.add_argument("--data", help="bring-your-own TSV corpus (source<TAB>target per line)")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint's last step")
    p.add_argument("--max-steps", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--threads", type=int, help="torch intra-op threads")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_train)
    _add_serving_commands(sub)
    _add_export_commands(sub)
    return parser


def _export(args: argparse.Namespace) -> int:
    from export.bundle import export_bundle

    manifest = export_bundle(args.checkpoint, args.out, int8=args.int8, fp16=args.fp16, quality_n=args.quality_n,
                             progress=not args.quiet)
    for name, variant in manifest.variants.items():
        q = variant["quality"]
        agreement = f", top-1 agreement {q['top1_agreement']:.2%}" if "top1_agreement" in q else ""
        measured = f"exact match {q['exact_match']:.2%} (n={q['n']}){agreement}" if "exact_match" in q else str(q)
        print(f"{name}: {measured}{'  WARNING: ' + q['warning'] if 'warning' in q else ''}")
    print(f"-> {args.out}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from export.verify import main as verify

    return verify(args.bundle, args.checkpoint, args.n, args.quality_n, progress=not args.quiet)


def _add_export_commands(sub) -> None:
    p = sub.add_parser("export", help="export a checkpoint to a bundle (ONNX graphs, variants, manifest)")
    p.add_argument("checkpoint", help="checkpoint directory written by `seqserve train`")
    p.add_argument("--out", required=True, help="bundle directory")
    p.add_argument("--int8", action="store_true", help="add a dynamic int8 variant (CPU)")
    p.add_argument("--fp16", action="store_true", help="add a float16 variant with float32 I/O (GPU)")
    p.add_argument("--quality-n", type=int, default=500, help="held-out lines each variant's quality is measured on")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_export)

    p = sub.add_parser("verify", help="check a bundle: integrity, NaN, variants vs fp32, onnxruntime vs PyTorch")
    p.add_argument("bundle", help="bundle directory")
    p.add_argument("--checkpoint", help="the checkpoint it was exported from: adds the PyTorch parity checks")
    p.add_argument("--n", type=int, default=256, help="held-out lines compared with PyTorch")
    p.add_argument("--quality-n", type=int, default=500, help="held-out lines for the variants vs fp32")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_verify)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"seqserve {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
