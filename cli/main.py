"""The `seqserve` command. Each subcommand imports its package lazily, so `serve` never loads torch."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _train(args: argparse.Namespace) -> int:
    from seqserve.model.presets import preset
    from seqserve.model.train import MAX_MINUTES, train

    chosen = {"max_steps": args.max_steps, "seed": args.seed, "threads": args.threads, "select_by": args.select_by,
              "max_minutes": args.max_minutes}
    overrides = {k: v for k, v in chosen.items() if v is not None}
    if args.data:
        overrides.update(task="tsv", data=args.data)
    metrics = train(preset(args.preset, **overrides), args.out, resume=args.resume, quiet=args.quiet)
    if metrics:
        test = metrics["test"]
        stopped = " (--max-minutes)" if metrics["stopped_by"] == MAX_MINUTES else ""
        print(f"test exact match {test['exact_match']:.2%}, chrF {test['chrf']:.1f}, BLEU {test['bleu']:.1f} "
              f"(n={test['n']}) with step {metrics['best_step']}'s weights (best validation {metrics['select_by']}), "
              f"after {metrics['steps']} steps{stopped} in {metrics['train_seconds']:.0f}s -> {args.out}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from seqserve.server import settings, signals  # main has called signals.hold already
    from seqserve.server.serve import run

    try:
        return run(settings.load(args))
    finally:
        signals.done()


def _generate(args: argparse.Namespace) -> int:
    from seqserve.cli.generate import run

    return run(args)


def _add_serving_commands(sub) -> None:
    from seqserve.client.channel import add_connection_arguments
    from seqserve.client.client import add_decoding_arguments
    from seqserve.client.flags import DEFAULT_ADDRESS
    from seqserve.server.settings import add_arguments

    p = sub.add_parser("serve", help="serve a bundle over gRPC (flags or SEQSERVE_* environment variables)",
                       description="Serves a bundle over gRPC with health, reflection and Prometheus metrics. "
                                   "Every flag can also be set as the environment variable named in its help; "
                                   "flags win. SIGTERM/SIGINT drain gracefully and exit 0.")
    add_arguments(p)
    p.set_defaults(func=_serve)

    p = sub.add_parser("generate", help="generate text with a running server",
                       description="One call to a running server. Prints the text; with beams "
                                   "(--num-beams 4 --num-return-sequences 4) or --return-logprobs (--top-logprobs 3) "
                                   "every returned sequence with its score and each token's log-probability and "
                                   "alternatives (token ids); --json prints the whole response. The summary line "
                                   "(finish reason, tokens, seed, timings) goes to stderr.")
    p.add_argument("input", help='source text in the model\'s domain, e.g. "<fr> 1 234" for the default model')
    p.add_argument("--server", default=DEFAULT_ADDRESS, help="host:port of the gRPC server (default %(default)s)")
    p.add_argument("--stream", action="store_true", help="print pieces as they are produced")
    p.add_argument("--json", action="store_true",
                   help="print the whole response as JSON (protobuf's mapping, the proto's field names); with "
                        "--stream one object per message, one per line")
    p.add_argument("--timeout", type=float, help="deadline of the call in seconds")
    p.add_argument("--source-language", default="", metavar="CODE",
                   help="a multilingual model's source language, in its own codes (fr, fra_Latn, fr_XX)")
    p.add_argument("--target-language", default="", metavar="CODE",
                   help="a multilingual model's target language (forced as the first token)")
    p.add_argument("--model", help="the model to run, by name (needed when the server serves several; "
                                   "GetModelInfo and health list them)")
    add_connection_arguments(p)  # TLS, client certificate, bearer token (docs/security.md)
    add_decoding_arguments(p)  # the proto's option names; unset ones take the server's defaults
    p.set_defaults(func=_generate)


def build_parser() -> argparse.ArgumentParser:
    from seqserve.model.presets import SELECT_BY

    parser = argparse.ArgumentParser(prog="seqserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model (runs under torchrun for DistributedDataParallel)")
    p.add_argument("--preset", default="default", help="tiny | default")
    p.add_argument("--out", required=True, help="checkpoint directory")
    p.add_argument("--data", help="bring-your-own TSV corpus (source<TAB>target per line)")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint's last step")
    p.add_argument("--max-steps", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: one per core)")
    p.add_argument("--select-by", choices=SELECT_BY,
                   help="what picks the kept checkpoint among the evaluations: validation loss (the preset's "
                        "default), chrF or exact match (ties broken by the lower loss)")
    p.add_argument("--max-minutes", type=float,
                   help="wall-clock budget of this run's training loop (a --resume starts a new one): on reaching "
                        "it, evaluate the current step and finish with the best checkpoint so far")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_train)
    _add_serving_commands(sub)
    _add_export_commands(sub)
    _add_loadtest_command(sub)
    _add_bench_command(sub)
    return parser


def _export(args: argparse.Namespace) -> int:
    from seqserve.checks.quality import record_quality
    from seqserve.export.bundle import export_bundle

    export_bundle(args.checkpoint, args.out, int8=args.int8, fp16=args.fp16, progress=not args.quiet)
    manifest = record_quality(args.out, args.quality_n, progress=not args.quiet)
    for name, variant in manifest.variants.items():
        q = variant["quality"]
        agreement = f", top-1 agreement {q['top1_agreement']:.2%}" if "top1_agreement" in q else ""
        if "exact_match" in q:
            measured = f"exact match {q['exact_match']:.2%} (n={q['n']}){agreement}"
        elif agreement:  # an imported model's bundle: measured on probe strings, without references
            measured = f"top-1 agreement {q['top1_agreement']:.2%} with fp32 on {q['n']} probe strings"
        elif "nan_free" in q:
            measured = f"finite logits on {q['n']} probe strings" if q["nan_free"] else "NaN or infinite logits"
        else:  # e.g. an imported model's bundle, which has no held-out pairs to measure on
            measured = "quality not measured: " + q.get("skipped", ", ".join(f"{k} {v}" for k, v in q.items()))
        print(f"{name}: {measured}{'  WARNING: ' + q['warning'] if 'warning' in q else ''}")
    print(f"-> {args.out}")
    if args.ctranslate2:
        from seqserve.export.ctranslate2 import convert

        print(f"CTranslate2 model -> {convert(args.checkpoint, args.ctranslate2)}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    """Prints the table; exit 1 when any tolerance is broken or a file differs from its digest, exit 2 when the
    bundle is malformed. A pass writes the marker that `make serve` waits for; any other outcome removes it."""
    from seqserve.checks.table import format_table
    from seqserve.checks.verify import clear_marker, verify, write_marker
    from seqserve.contract.integrity import open_bundle
    from seqserve.contract.manifest import IntegrityError
    from seqserve.engine.runtime.device import RuntimeConfig

    clear_marker(args.bundle)
    try:
        open_bundle(args.bundle, graphs=True)  # malformed (schema, tokenizer, graphs vs manifest): exit 2 via main
    except IntegrityError:
        pass  # a modified or missing file: the table's integrity row reports it (exit 1)
    runtime = RuntimeConfig(device=args.device, intra_op_threads=args.threads)
    rows, skipped = verify(args.bundle, args.quality_n, not args.quiet, runtime), []
    if args.checkpoint is None:
        skipped.append("onnxruntime vs PyTorch (encoder and decoder-step outputs, teacher forcing, greedy tokens): "
                       "no --checkpoint given; these need torch and the checkpoint the bundle was exported from")
    else:
        from seqserve.checks.parity import torch_parity  # torch only when asked for

        rows += torch_parity(Path(args.bundle), Path(args.checkpoint), args.n, runtime)
    if args.hf is not None:
        if args.checkpoint is None:
            raise ValueError("--hf needs --checkpoint (the checkpoint `seqserve import` wrote from that directory)")
        from seqserve.checks.hf_parity import hf_parity  # transformers only when asked for

        rows += hf_parity(Path(args.checkpoint), Path(args.hf), bundle=Path(args.bundle))
    print(format_table(rows, skipped))
    if not all(r.ok for r in rows):
        return 1
    write_marker(args.bundle, rows, with_pytorch=args.checkpoint is not None)
    return 0


def _import(args: argparse.Namespace) -> int:
    """Writes the checkpoint, then compares it with transformers (exit 1 when the logits differ beyond 1e-4)."""
    from seqserve.model.hf_import import import_model

    try:
        cfg = import_model(args.hf_dir, args.out, progress=not args.quiet)
    except OSError as exc:  # a file of the directory that cannot be read, an --out that cannot be written: exit 2
        raise ValueError(f"{exc.filename or args.hf_dir}: {exc.strerror or exc}") from None
    print(f"imported {args.hf_dir} -> {args.out} (d_model {cfg.d_model}, {cfg.n_encoder_layers}+{cfg.n_decoder_layers} "
          f"layers, vocabulary {cfg.vocab_size}, positions {cfg.positions}, activation {cfg.activation})")
    if args.no_verify:
        return 0
    return _hf_rows(Path(args.out), Path(args.hf_dir), [])


def _import_quietly(args: argparse.Namespace) -> int:
    """`import`, with transformers' own progress bars ("Loading weights") and warnings silenced under --quiet."""
    if not args.quiet:
        return _import(args)
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # without the hf extra nothing of transformers runs
        return _import(args)
    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        return _import(args)
    finally:  # the process may go on (tests call main): leave transformers as it was
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _hf_demo(args: argparse.Namespace) -> int:
    """Writes a small random Hugging Face directory that `seqserve import` accepts (no hub needed)."""
    from seqserve.model.hf_demo import FAMILIES, SEED, build

    if args.family not in FAMILIES:
        raise ValueError(f"unknown family {args.family!r}; the families are: "
                         + ", ".join(f"{name} ({family.layout})" for name, family in FAMILIES.items()))
    sizes = FAMILIES[args.family].sizes
    if args.size not in sizes:
        raise ValueError(f"unknown size {args.size!r} for {args.family}; its sizes are: {', '.join(sizes)}")
    out = build(args.family, args.out, sizes[args.size], SEED if args.seed is None else args.seed)
    print(f"wrote a random-weight {args.family} model to {out}; next: seqserve import {out} --out CHECKPOINT")
    return 0


def _hf_rows(checkpoint: Path, hf_dir: Path, rows: list) -> int:
    from seqserve.checks.table import format_table

    try:
        from seqserve.checks.hf_parity import hf_parity

        rows = rows + hf_parity(checkpoint, hf_dir)
        skipped = []
    except ImportError:
        skipped = ["PyTorch vs transformers: transformers is not installed (pip install 'seqserve[hf]')"]
    print(format_table(rows, skipped))
    return 0 if all(r.ok for r in rows) else 1


def _add_export_commands(sub) -> None:
    from seqserve.contract.devices import DEVICES
    from seqserve.model.hf_demo import FAMILIES, TINY_SIZE  # torch-free: hf-demo's table of families
    from seqserve.model.hf_families import described  # torch-free: the import's own table of model_types

    p = sub.add_parser("import", help=f"import a Hugging Face model directory as a checkpoint: {described()}",
                       description="Reads config.json, generation_config.json, model.safetensors and the tokenizer "
                                   "files of a local Hugging Face directory (save_pretrained form) and writes a "
                                   "seqserve checkpoint for `seqserve export`; then compares its logits with "
                                   "transformers' (needs the hf extra). Exit 2 names what cannot be imported.")
    p.add_argument("hf_dir", help="Hugging Face model directory")
    p.add_argument("--out", required=True, help="checkpoint directory to write")
    p.add_argument("--no-verify", action="store_true", help="skip the comparison with transformers")
    p.add_argument("--quiet", action="store_true", help="no progress bars (transformers' included)")
    p.set_defaults(func=_import_quietly)

    p = sub.add_parser("hf-demo", help="write a small random-weight Hugging Face model directory to try `import` "
                                       "offline", description=_hf_demo.__doc__ + " Its output is random text.")
    p.add_argument("family", help=f"{', '.join(FAMILIES)} (model/hf_demo.py): an unknown name lists each one's layout")
    p.add_argument("--out", required=True, help="directory to write (config, weights, tokenizer files)")
    p.add_argument("--size", default=TINY_SIZE, help=f"{TINY_SIZE} (d_model 32, seconds to build) or base (the shape "
                                                      "of the family's small hub model: opus-mt, t5-small, "
                                                      "flan-t5-small; not mt5)")
    p.add_argument("--seed", type=int, help="the weights' and tokenizer's seed (default: the tests' models' seed)")
    p.set_defaults(func=_hf_demo)

    p = sub.add_parser("export", help="export a checkpoint to a bundle (ONNX graphs, variants, manifest)")
    p.add_argument("checkpoint", help="checkpoint directory written by `seqserve train`")
    p.add_argument("--out", required=True, help="bundle directory")
    p.add_argument("--int8", action="store_true", help="add a dynamic int8 variant (CPU)")
    p.add_argument("--fp16", action="store_true", help="add a float16 variant with float32 I/O (GPU)")
    p.add_argument("--quality-n", type=int, default=500, help="held-out lines each variant's quality is measured on")
    p.add_argument("--ctranslate2", metavar="DIR", help="also convert the checkpoint to a CTranslate2 model in DIR "
                                                        "(needs the bench extra; `seqserve bench --ctranslate2 DIR`)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_export)

    p = sub.add_parser("verify", help="check a bundle: integrity, NaN, variants vs fp32, onnxruntime vs PyTorch")
    p.add_argument("bundle", help="bundle directory")
    p.add_argument("--checkpoint", help="the checkpoint it was exported from: adds the PyTorch parity checks")
    p.add_argument("--hf", metavar="HF_DIR", help="the Hugging Face directory the checkpoint was imported from: adds "
                                                  "PyTorch vs transformers (logits within 1e-4) and the bundle's "
                                                  "tokenizer ids vs transformers' (needs the hf extra)")
    p.add_argument("--n", type=int, default=256, help="held-out lines compared with PyTorch")
    p.add_argument("--quality-n", type=int, default=500, help="held-out lines for the variants vs fp32")
    p.add_argument("--device", choices=DEVICES, default="cpu",
                   help="where the engine runs for the parity and variant checks (cuda: the GPU serving path)")
    p.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads (0 = one per core)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_verify)


def _loadtest(args: argparse.Namespace) -> int:
    from seqserve.loadtest.command import main as loadtest

    return loadtest(args)


def _add_loadtest_command(sub) -> None:
    from seqserve.loadtest.command import add_arguments  # stdlib + grpc only: locust runs in a child process

    p = sub.add_parser("loadtest", help="load-test a running server with locust (headless): summary, SLOs, sweeps",
                       description="Runs loadtest/locustfile.py headless against --target and writes CSV, the HTML "
                                   "report and summary.json to --report-dir. Exits 1 when an SLO flag is missed "
                                   "(naming it) or no call succeeded. --sweep 1,2,4,... runs one --step-duration "
                                   "step per concurrency and adds sweep.csv, sweep.json and sweep.png.")
    add_arguments(p)
    p.set_defaults(func=_loadtest)


def _bench(args: argparse.Namespace) -> int:
    from seqserve.loadtest.bench import main as bench

    return bench(args)


def _add_bench_command(sub) -> None:
    from seqserve.loadtest.bench_config import (
        add_arguments,  # stdlib only: each row imports its backend in its own process
    )

    p = sub.add_parser("bench", help="PyTorch vs the engine vs its graph in a bare loop vs CTranslate2, same inputs",
                       description="Decodes the same inputs with each backend, precision and batch size (greedy, and "
                                   "beam rows), each row in a fresh process; prints the table and the engine's ratios "
                                   "and writes JSON (--out) and optionally the markdown section (--markdown).")
    add_arguments(p)
    p.set_defaults(func=_bench)


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv)[:1] == ["serve"]:
        from seqserve.server import signals

        signals.hold()  # first, before the slow imports: a SIGTERM from now on stops the server with exit 0
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"seqserve {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
