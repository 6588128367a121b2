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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"seqserve {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
