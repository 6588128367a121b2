"""`make gpu-check`: the GPU figures of docs/benchmarks.md checked with one command, into one markdown report.

    python -m seqserve.loadtest.gpu_check [--device cuda|cpu] [--quick] [--out reports/gpu-check.md]

Sections, each a subprocess whose command, start date, device, onnxruntime provider in use, exit status and output
the report records:
  1. device: the provider a session really gets (loadtest/device_probe.py), nvidia-smi's GPU, torch's CUDA;
     with --device cuda and no CUDA provider the check stops here, says "no CUDA provider" and why, and exits 2;
  2. tests: `pytest tests/server -q --ignore=tests/server/test_security.py` with SEQSERVE_TEST_DEVICE=<device>;
  3. bench: `seqserve bench --shape base --device <device> --no-ctranslate2 --transformers` at batch 1, 64 and 256,
     and beam 4 over batches of 16 sources: the engine, its bare graph loop and transformers' generate on the same
     weights (fp32; fp16 too on cuda);
  4. step profile: `python -m seqserve.loadtest.step_profile BUNDLE --device <device>` on the bench's base bundle
     (and its fp16 variant on cuda).
--quick runs the same steps small (a tiny model, a few inputs and tokens, one test file), to check the tooling on any
machine in about a minute. The exit status is 0 only when every section's is.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from seqserve.export.bundle import export_bundle
from seqserve.loadtest import shapes
from seqserve.loadtest.bench_report import machine
from seqserve.loadtest.device_probe import NO_CUDA, PROVIDER_LINE
from seqserve.model.config import ModelConfig

PROG = "python -m seqserve.loadtest.gpu_check"
DEFAULT_OUT = Path("reports") / "gpu-check.md"
DEFAULT_WORK = Path("reports") / "gpu-check-work"  # the base shape's checkpoint and bundle, reused by a rerun
FULL_BATCHES, FULL_BEAM_BATCHES, FULL_BEAMS = "1,64,256", "16", "4"
QUICK_BATCHES, QUICK_BEAM_BATCHES, QUICK_BEAMS, QUICK_TOKENS = "2", "2", "1", 4  # greedy: each row is a process
FULL_TESTS = ("tests/server", "--ignore=tests/server/test_security.py")  # TLS tests need trustme, not a GPU
QUICK_TESTS = ("tests/engine/runtime/test_device.py",)
QUICK_MODEL_MAX_NEW = 64  # the tiny model's cap: room for step_profile's warm-up and timed steps
OUTPUT_TAIL_LINES = 150  # per section in the report; the whole output is in the section's log file
SECTION_TIMEOUT_S, MAX_SECTION_TIMEOUT_S = 3600, 86400
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # onnxruntime colours its log lines


@dataclass(frozen=True)
class GpuCheckConfig:
    device: str = "cuda"
    quick: bool = False
    out: Path = DEFAULT_OUT
    work: Path = DEFAULT_WORK
    checkpoint: Path | None = None  # --quick: the model to use (default: a tiny random one made under work)
    bundle: Path | None = None  # its bundle (with --checkpoint)
    num_inputs: int = 256  # the bench's inputs (--quick: 4)
    section_timeout_s: int = SECTION_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"--device must be cuda or cpu, got {self.device!r}")
        if (self.checkpoint is None) != (self.bundle is None):
            raise ValueError("--checkpoint and --bundle go together (a trained checkpoint and its exported bundle)")
        if self.checkpoint is not None and not self.quick:
            raise ValueError("--checkpoint and --bundle are for --quick (the full check measures the base shape)")
        if not 1 <= self.num_inputs <= 100_000:
            raise ValueError(f"-n must be between 1 and 100000, got {self.num_inputs}")
        if not 1 <= self.section_timeout_s <= MAX_SECTION_TIMEOUT_S:
            raise ValueError(f"--section-timeout must be between 1 and {MAX_SECTION_TIMEOUT_S} s")


@dataclass(frozen=True)
class Section:
    key: str  # its log file's name
    title: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # on top of this process's environment


@dataclass(frozen=True)
class Result:
    section: Section
    started: str  # ISO date and time, with the zone
    wall_s: float
    returncode: int  # 124: stopped at --section-timeout
    output: str  # stdout and stderr, interleaved as written, colour codes removed
    provider: str
    device: str


def _python(*args: str) -> list[str]:
    return [sys.executable, *args]


def quick_model(work: Path) -> tuple[Path, Path]:
    """A tiny random-weight checkpoint and its bundle under work (made once): --quick needs no training."""
    checkpoint, bundle = work / "quick" / "checkpoint", work / "quick" / "bundle"
    if not (bundle / "manifest.json").is_file():
        cfg = ModelConfig(vocab_size=256, d_model=32, n_heads=2, n_encoder_layers=2, n_decoder_layers=2, d_ff=64,
                          dropout=0.0)
        shapes.write_checkpoint(cfg, checkpoint, seed=0, n_sources=8, max_new_tokens=QUICK_MODEL_MAX_NEW,
                                name="quick")
        export_bundle(checkpoint, bundle, progress=False)
    return checkpoint, bundle


def sections(cfg: GpuCheckConfig, checkpoint: Path | None, bundle: Path) -> list[Section]:
    """The steps after the device probe, in order (see the module docstring)."""
    bench_out = cfg.work / "bench.json"
    bench = _python("-m", "seqserve.cli.main", "bench")
    if cfg.quick:
        bench += ["--checkpoint", str(checkpoint), "--bundle", str(bundle), "-n", str(cfg.num_inputs),
                  "--batch-sizes", QUICK_BATCHES, "--num-beams", QUICK_BEAMS, "--beam-batch-sizes",
                  QUICK_BEAM_BATCHES, "--max-new-tokens", str(QUICK_TOKENS), "--min-new-tokens", str(QUICK_TOKENS)]
    else:
        bench += ["--shape", "base", "--shape-dir", str(cfg.work / "base"), "-n", str(cfg.num_inputs),
                  "--batch-sizes", FULL_BATCHES, "--num-beams", FULL_BEAMS, "--beam-batch-sizes", FULL_BEAM_BATCHES]
    bench += ["--device", cfg.device, "--no-ctranslate2", "--transformers", "--threads", "1", "--quiet", "--out",
              str(bench_out), "--markdown", str(cfg.work / "bench.md")]
    profile = _python("-m", "seqserve.loadtest.step_profile", str(bundle), "--device", cfg.device)
    profile += ["--batch-sizes", "1,2", "--threads", "1"] if cfg.quick else []
    tests = _python("-m", "pytest", *(QUICK_TESTS if cfg.quick else FULL_TESTS), "-q", "-p", "no:cacheprovider")
    # the tests' trained tiny model: the caller's SEQSERVE_TEST_ARTIFACTS, else kept under work for the next run
    artifacts = os.environ.get("SEQSERVE_TEST_ARTIFACTS") or str((cfg.work / "test-artifacts").resolve())
    out = [Section("tests", f"Test suite on {cfg.device}", tests,
                   {"SEQSERVE_TEST_DEVICE": cfg.device, "SEQSERVE_TEST_ARTIFACTS": artifacts}),
           Section("bench", "Benchmark rows: engine, graph loop, transformers generate", bench),
           Section("step-profile", "Step profile, fp32", profile)]
    if cfg.device == "cuda" and not cfg.quick:  # the base bundle has the fp16 variant when the bench ran on cuda
        out.append(Section("step-profile-fp16", "Step profile, fp16", profile + ["--variant", "fp16"]))
    return out


def run(section: Section, work: Path, timeout_s: int, device: str, provider_of) -> Result:
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    start = time.perf_counter()
    log = work / f"{section.key}.log"
    with log.open("w+") as f:
        try:
            code = subprocess.run(section.argv, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s,
                                  env={**os.environ, **section.env}).returncode
        except subprocess.TimeoutExpired:
            code = 124
            f.write(f"\n[stopped after --section-timeout {timeout_s} s]\n")
        f.seek(0)
        output = ANSI.sub("", f.read())
    return Result(section, started, time.perf_counter() - start, code, output, provider_of(section, output), device)


def probe_provider(output: str) -> str:
    line = next((x for x in output.splitlines() if x.startswith(PROVIDER_LINE)), None)
    return line.removeprefix(PROVIDER_LINE) if line else "none (see the output)"


def gpu_line(probe_output: str) -> str:
    return next((x.removeprefix("gpu: ") for x in probe_output.splitlines() if x.startswith("gpu: ")), "unknown")


def bench_provider(bench_json: Path) -> str:
    """The providers the bench's onnxruntime rows ran on, and where its transformers rows ran."""
    try:
        data = json.loads(bench_json.read_text())
    except (OSError, ValueError):
        return "unknown (no bench report)"
    ours = ", ".join(data["machine"].get("onnxruntime_providers_used", [])) or "none"
    theirs = sorted({r["device"] for r in data["rows"] if r["backend"].startswith("transformers")})
    return f"onnxruntime {ours}; transformers {', '.join(theirs) or 'no rows'}"


def markdown(cfg: GpuCheckConfig, command: str, results: list[Result], verdict: str) -> str:
    probe = results[0]
    head = ["# GPU check", "", "```", command, "```", "",
            f"Date: {probe.started}. Device asked: `{cfg.device}`{' (quick: reduced sizes)' if cfg.quick else ''}. "
            f"GPU: {gpu_line(probe.output)}. Provider in use: {probe.provider}.", "", verdict, "",
            "| section | exit status | seconds | provider in use |", "|---|---:|---:|---|"]
    head += [f"| {r.section.title} | {r.returncode} | {r.wall_s:.1f} | {r.provider} |" for r in results]
    body = []
    for i, r in enumerate(results, 1):
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in r.section.env.items())
        lines = r.output.rstrip().splitlines()
        cut = len(lines) > OUTPUT_TAIL_LINES
        shown = lines[-OUTPUT_TAIL_LINES:] if cut else lines
        body += ["", f"## {i}. {r.section.title}", "", "Command:", "", "```",
                 (env + " " if env else "") + shlex.join(r.section.argv), "```", "",
                 f"Date: {r.started}. Device: {r.device}. Provider in use: {r.provider}. "
                 f"Exit status: {r.returncode} after {r.wall_s:.1f} s.", "",
                 "Output" + (f" (last {OUTPUT_TAIL_LINES} of {len(lines)} lines; all in "
                             f"`{cfg.work / (r.section.key + '.log')}`)" if cut else "") + ":", "",
                 "```", *shown, "```"]
    return "\n".join(head + body) + "\n"


def check(cfg: GpuCheckConfig, command: str) -> int:
    cfg.work.mkdir(parents=True, exist_ok=True)
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    probe = Section("device", "Device and provider",
                    _python("-m", "seqserve.loadtest.device_probe", "--device", cfg.device))
    first = run(probe, cfg.work, cfg.section_timeout_s, "", lambda s, out: probe_provider(out))
    host = machine()
    cpu = f"CPU {host['cpu']}, {host['usable_cores']} usable cores"
    device = f"GPU {gpu_line(first.output)}; {cpu}" if cfg.device == "cuda" else cpu
    results = [Result(probe, first.started, first.wall_s, first.returncode, first.output, first.provider, device)]
    if first.returncode != 0:
        why = [x for x in first.output.splitlines() if x.strip()][-6:]
        verdict = (f"**{NO_CUDA}**: the check stopped before its other sections. " if cfg.device == "cuda" else
                   "**The device probe failed**: the check stopped before its other sections. ")
        cfg.out.write_text(markdown(cfg, command, results, verdict + "Run `make gpu-check DEVICE=cpu` for the same "
                                    "steps on the CPU."))
        print(f"{PROG}: {NO_CUDA if cfg.device == 'cuda' else 'device probe failed'} (--device {cfg.device}):\n  "
              + "\n  ".join(why) + f"\nreport -> {cfg.out}", file=sys.stderr)
        return 2
    if cfg.quick:
        checkpoint, bundle = (cfg.checkpoint, cfg.bundle) if cfg.checkpoint else quick_model(cfg.work)
    else:
        checkpoint, bundle = None, cfg.work / "base" / "bundle"
    bench_json = cfg.work / "bench.json"
    bench_json.unlink(missing_ok=True)  # a stale report must not name the providers of an earlier run

    def provider_of(section: Section, output: str) -> str:
        if section.key == "tests":
            return f"{first.provider} (the probe's; SEQSERVE_TEST_DEVICE={cfg.device} refuses any other)"
        if section.key == "bench":
            return bench_provider(bench_json)
        return output.splitlines()[0].split(",")[0] if output.strip() else "unknown"  # step_profile's first line

    for section in sections(cfg, checkpoint, bundle):
        print(f"{PROG}: {section.title} ...", file=sys.stderr, flush=True)
        results.append(run(section, cfg.work, cfg.section_timeout_s, device, provider_of))
    failed = [r.section.title for r in results if r.returncode != 0]
    verdict = f"**Failed**: {', '.join(failed)}." if failed else "**Every section passed** (exit status 0)."
    cfg.out.write_text(markdown(cfg, command, results, verdict))
    print(f"{PROG}: {verdict.replace('**', '')}\nreport -> {cfg.out}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="where every section runs (cpu: the same steps without a GPU)")
    p.add_argument("--quick", action="store_true", help="the same steps at tiny sizes: checks the tooling")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="the markdown report (default: %(default)s)")
    p.add_argument("--work", default=str(DEFAULT_WORK),
                   help="logs, the bench's JSON and the base model, reused by a rerun (default: %(default)s)")
    p.add_argument("--checkpoint", help="--quick: a checkpoint to use instead of a tiny random one")
    p.add_argument("--bundle", help="--quick: that checkpoint's bundle")
    p.add_argument("-n", "--num-inputs", type=int, help="the bench's inputs (default: 256; --quick: 4)")
    p.add_argument("--section-timeout", type=int, default=SECTION_TIMEOUT_S,
                   help=f"seconds each section may run (1-{MAX_SECTION_TIMEOUT_S}; default %(default)s)")
    a = p.parse_args(argv)
    path = lambda value: Path(value) if value else None  # noqa: E731
    try:
        cfg = GpuCheckConfig(a.device, a.quick, Path(a.out), Path(a.work), path(a.checkpoint), path(a.bundle),
                             (4 if a.quick else 256) if a.num_inputs is None else a.num_inputs, a.section_timeout)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    return check(cfg, shlex.join([*shlex.split(PROG), *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    raise SystemExit(main())
