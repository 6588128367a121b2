"""Many `seqserve import` runs in ONE child process: the hostile-directory tests pay torch's and transformers' import
once per file instead of once per case.

The parent (`run_batch`) writes the cases' argvs to a JSON file and starts `python -P tests/import_runner.py CASES
RESULTS` under a kill guard; the child first limits its own address space. The child calls the real CLI entry
(`seqserve.cli.main.main(argv)`) for each case in order, with file descriptors 1 and 2 pointed at files of that case
(so print, logging handlers bound to sys.stderr, warnings and C++ libraries' own messages are all caught, as a
separate process's stderr would be), and appends one JSON line per case to RESULTS: its exit status, stdout, stderr,
an uncaught exception's traceback, and the process's peak RSS so far. Peak RSS only grows, so bounding it after every
case, in order, bounds every case, and the first case over the bound is the one that broke it.
"""
from __future__ import annotations

import gc
import json
import mmap
import os
import resource
import subprocess
import sys
import tempfile
import threading
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

RSS_MARGIN = 300 << 20  # a refusal may use at most this much more memory than the healthy import
ADDRESS_SPACE = 4 << 30  # a regression fails in the child (MemoryError) instead of paging out the shared machine
GUARD_S = 240  # a batch that hangs is killed (and its unfinished cases fail) before pytest's 300 s timeout
STARTED = "started"
# Address space held back while a case runs, released first when it fails: a case that used up the rest (a model of
# 200,000 layers) leaves room to free its memory and report. An anonymous mapping never written: never resident.
RESERVE = 64 << 20


def import_argv(hf: Path, out: Path) -> list[str]:
    """The arguments every case runs: `seqserve import HF --out OUT --quiet --no-verify`."""
    return ["import", str(hf), "--out", str(out), "--quiet", "--no-verify"]


@dataclass(frozen=True)
class Run:
    code: int | None  # the exit status; None when main raised (traceback says what)
    stdout: str
    stderr: str
    traceback: str | None
    peak_rss: int  # bytes: the child's peak resident set after this case (and every case before it)


@dataclass(frozen=True)
class Batch:
    runs: dict[str, Run]  # in the order they ran
    code: int  # the child's exit status (-9 when the guard killed it)
    stderr: str  # what the child wrote outside the cases
    last_started: str | None

    def __getitem__(self, case: str) -> Run:
        if case not in self.runs:
            raise AssertionError(f"{case}: no result: the batch child exited {self.code} while running case "
                                 f"{self.last_started!r}\n{self.stderr[-3000:]}")
        return self.runs[case]

    def first_over(self, limit: int) -> str | None:
        """The first case after which the peak RSS exceeded limit: the one that used the memory."""
        return next((case for case, run in self.runs.items() if run.peak_rss > limit), None)


def run_batch(cases: dict[str, list[str]], workdir: Path) -> Batch:
    """Runs main(argv) for each case, in order, in one child process; its results by case."""
    spec, results, err_path = workdir / "cases.json", workdir / "results.jsonl", workdir / "child.stderr"
    spec.write_text(json.dumps(list(cases.items())))
    with open(err_path, "wb") as err:
        # -P: nothing of tests/ shadows the installed product
        proc = subprocess.Popen([sys.executable, "-P", __file__, str(spec), str(results)],
                                stdout=err, stderr=err)
        guard = threading.Timer(GUARD_S, proc.kill)
        guard.start()
        try:
            code = proc.wait()
        finally:  # pytest's own timeout interrupting the wait must not leave the child running
            guard.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    runs, last = {}, None
    for line in results.read_text().splitlines() if results.exists() else []:
        record = json.loads(line)
        if STARTED in record:
            last = record[STARTED]
        else:
            case = record.pop("case")
            runs[case] = Run(**record)
    return Batch(runs, code, err_path.read_text(errors="replace"), last)


# -- the child ------------------------------------------------------------------------------------------------------

def _peak_rss() -> int:
    """This process's peak RSS in bytes. /proc's VmHWM, not ru_maxrss: a child's ru_maxrss also counts the peak of the
    process it was started from (the kernel carries it over exec), here the test run's."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) << 10 for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak << 10  # macOS reports bytes, Linux kilobytes


def _exit_status(exc: SystemExit) -> int:
    """What the interpreter would exit with (it prints a non-integer code to stderr and exits 1)."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)
    return 1


def _trace(exc: BaseException) -> str:
    """exc's traceback text, once the failed call's locals are freed: a case that filled the address space must not
    leave the next case without memory."""
    seen, chained = set(), exc
    while chained is not None and id(chained) not in seen:
        seen.add(id(chained))
        traceback.clear_frames(chained.__traceback__)  # the frames' locals; the running ones are skipped
        chained = chained.__context__
    gc.collect()
    try:
        return "".join(traceback.format_exception(exc))
    except MemoryError:
        return f"{type(exc).__name__}: {exc!s:.1000} (the rest of its traceback did not fit in memory)"


def _run_case(argv: list[str]) -> dict:
    from seqserve.cli.main import main

    code, trace = None, None
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            # a fresh "shown once" registry per case: each case sees the warnings a new process would
            with warnings.catch_warnings():
                warnings.onceregistry.clear()
                reserve = mmap.mmap(-1, RESERVE)
                try:
                    code = main(argv)
                except SystemExit as exc:
                    code = _exit_status(exc)
                except Exception as exc:  # noqa: BLE001 (a crash is this case's result: its test fails on it)
                    del reserve  # first, before anything that allocates
                    trace = _trace(exc)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
        texts = []
        for captured in (out, err):
            captured.seek(0)
            texts.append(captured.read().decode(errors="replace"))
    return {"code": code, "stdout": texts[0], "stderr": texts[1], "traceback": trace}


def _child(spec: str, results: str) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))  # before anything is loaded
    with open(results, "a") as report:
        for case, argv in json.loads(Path(spec).read_text()):
            report.write(json.dumps({STARTED: case}) + "\n")
            report.flush()  # a case that hangs or kills the process is named by the last line
            record = _run_case(argv)
            gc.collect()  # the next case starts from this case's live memory only, as it would in its own process
            report.write(json.dumps({"case": case, **record, "peak_rss": _peak_rss()}) + "\n")
            report.flush()


if __name__ == "__main__":
    _child(*sys.argv[1:])
