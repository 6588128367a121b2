"""A request's path through the server, counted: the seqserve files its calls run and the caller->callee hops between
files, from a profiler on every thread of every server process (`loadtest/path_profiler.py`, injected as
sitecustomize). It imports nothing of seqserve.server or seqserve.engine, so the same tool counts any checkout: point
--python at that checkout's venv and the server runs from there while this process only calls it.

    python -m seqserve.loadtest.request_path --bundle B [--engine-process] [--num-beams 4] --out report.md

Procedure: start `seqserve serve`, wait for SERVING, one warm-up call, then dumps around the measured calls (five by
default, one after another) and around two idle windows as long. A pair is on the path when it ran more often during
the calls than in either idle window; what else rose during the calls (the engine process's heartbeat, an idle loop)
is background: left out of the counts and listed apart.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from seqserve.client.client import Client
from seqserve.loadtest import path_profiler
from seqserve.loadtest.pinned_server import free_port, launched

PACKAGES = ("contract", "model", "client", "engine", "server", "export", "checks", "loadtest", "cli", "v1")
DUMP_TIMEOUT_S = 60.0
STARTUP_TIMEOUT_S = 180.0
INPUT = "the quick brown fox"
# Prints {package: folder} of the seqserve the given python imports, without importing server or engine modules.
ROOTS_SCRIPT = ("import importlib.util, json; print(json.dumps({n: list(importlib.util.find_spec('seqserve.' + n)"
                ".submodule_search_locations)[0] for n in %r if importlib.util.find_spec('seqserve.' + n)}))")


def package_roots(python: str) -> dict[str, str]:
    out = subprocess.run([python, "-c", ROOTS_SCRIPT % (PACKAGES,)], check=True, capture_output=True, text=True)
    return {name: os.path.realpath(folder) + os.sep for name, folder in json.loads(out.stdout).items()}


def relative(path: str, roots: dict[str, str]) -> str:
    """package/sub/file.py: the package's name, then the path under its folder (the longest root wins)."""
    name, root = max(((n, r) for n, r in roots.items() if path.startswith(r)), key=lambda nr: len(nr[1]))
    return name + "/" + path[len(root):]


def folder(rel: str) -> str:
    """The package and its first subfolder, if any: engine/step for engine/step/loop.py, server for server/app.py."""
    parts = rel.split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


class Dumps:
    """Asks every profiled process for its counters and sums them (same code, same names, in any process)."""

    def __init__(self, directory: Path) -> None:
        self.dir, self.number = directory, 0

    def pids(self) -> list[int]:
        alive = []
        for marker in self.dir.glob("pid-*"):
            pid = int(marker.name.split("-")[1])
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        return alive

    def take(self) -> Counter:
        if not self.pids():  # each process registers itself on start, long before the server answers SERVING
            raise RuntimeError(f"no profiled server process registered in {self.dir}: the sitecustomize did not load")
        self.number += 1
        (self.dir / "trigger.tmp").write_text(str(self.number))
        os.replace(self.dir / "trigger.tmp", self.dir / path_profiler.TRIGGER)
        deadline = time.monotonic() + DUMP_TIMEOUT_S
        while True:
            pids = self.pids()
            files = [self.dir / f"dump-{self.number}-{pid}.json" for pid in pids]
            if pids and all(f.exists() for f in files):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"no dump {self.number} from every process of {pids}")
            time.sleep(path_profiler.POLL_S)
        total: Counter = Counter()
        for f in files:
            for caller_file, caller_fn, callee_file, callee_fn, n in json.loads(f.read_text()):
                total[(caller_file, caller_fn, callee_file, callee_fn)] += n
        return total


def server_argv(args, port: int) -> list[str]:
    seqserve = str(Path(args.python).parent / "seqserve")
    argv = [seqserve, "serve", "--bundle", args.bundle, "--port", str(port), "--metrics-port", str(free_port()),
            "--intra-op-threads", "1", "--log-level", "WARNING"]
    return argv + (["--engine-process"] if args.engine_process else [])


def _restore(saved: dict) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def rises(before: Counter, after: Counter) -> Counter:
    return Counter({key: n - before.get(key, 0) for key, n in after.items() if n > before.get(key, 0)})


def _windows(client: Client, dumps: Dumps, options: dict, calls: int) -> dict:
    """The measured calls, then two idle windows as long: a pair is on the path when it ran more often during the calls
    than in either idle window (a clock-driven sweep a step runs counts; a heartbeat that also runs idle does not)."""
    client.generate(INPUT, **options)  # warm-up: first-call work (lazy imports, caches) is not the path
    d0 = dumps.take()
    start = time.monotonic()
    results = [client.generate(INPUT, **options) for _ in range(calls)]
    d1 = dumps.take()
    window = time.monotonic() - start
    time.sleep(window)
    d2 = dumps.take()
    time.sleep(window)
    d3 = dumps.take()
    during, idle = rises(d0, d1), rises(d1, d2) | rises(d2, d3)  # | keeps the larger count of a pair
    path = {key for key, n in during.items() if n > idle.get(key, 0)}
    return {"path": path, "background": set(during) - path, "idle": set(idle),
            "tokens": [len(r.token_ids) for r in results], "window_s": window, "processes": len(dumps.pids())}


def measure(args) -> dict:
    """Runs the server with the profiler in every process; returns the measured call's pairs and the background's."""
    roots = package_roots(args.python)
    options = {"max_new_tokens": args.max_new_tokens}
    if args.num_beams > 1:
        options["num_beams"] = args.num_beams
    with tempfile.TemporaryDirectory(prefix="request-path-") as tmp:
        inject, dumps_dir = Path(tmp) / "inject", Path(tmp) / "dumps"
        inject.mkdir(), dumps_dir.mkdir()
        (inject / "sitecustomize.py").write_text(Path(path_profiler.__file__).read_text())
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(inject), os.environ.get("PYTHONPATH")])),
               "SEQSERVE_PATH_DIR": str(dumps_dir), "SEQSERVE_PATH_ROOTS": json.dumps(sorted(roots.values()))}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # the server inherits our environment; restored as soon as it is up
        port = free_port()
        try:
            with launched(server_argv(args, port), f"127.0.0.1:{port}", STARTUP_TIMEOUT_S):
                _restore(saved)
                with Client(f"127.0.0.1:{port}", timeout=120.0) as client:
                    found = _windows(client, Dumps(dumps_dir), options, args.calls)
        finally:
            _restore(saved)
    return {"roots": roots, "options": options, **found}


def summary(found: dict) -> dict:
    """Files (by package and folder), their lines, and the cross-file hops of the path."""
    roots = found["roots"]
    name = {}
    for caller_file, _, callee_file, _ in found["path"]:
        for f in filter(None, (caller_file, callee_file)):
            name[f] = relative(f, roots)
    lines = {name[f]: len(Path(f).read_text().splitlines()) for f in name}
    hops = sorted({(f"{name[cf]}:{cfn}", f"{name[tf]}:{tfn}") for cf, cfn, tf, tfn in found["path"]
                   if cf is not None and cf != tf})
    background = sorted({f"{relative(cf, roots) + ':' + cfn if cf else '(outside)'} -> {relative(tf, roots)}:{tfn}"
                         for cf, cfn, tf, tfn in found["background"]})
    return {"files": sorted(lines), "lines": lines, "total_lines": sum(lines.values()),
            "by_package": dict(sorted(Counter(f.split("/")[0] for f in lines).items())),
            "by_folder": dict(sorted(Counter(folder(f) for f in lines).items())), "hops": hops,
            "background": background}


def markdown(args, found: dict, s: dict, command: str) -> str:
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    packages = ", ".join(f"{k} {v}" for k, v in s["by_package"].items())
    folders = ", ".join(f"{k} {v}" for k, v in s["by_folder"].items())
    about = (f"Server: `{args.python}`; options {found['options']}; {args.calls} measured calls generated "
             f"{found['tokens']} tokens; {found['processes']} profiled processes; measured window "
             f"{found['window_s']:.3f} s, then two idle windows as long. A pair is on the path when it ran more often "
             "during the calls than in either idle window; the rest that rose is background.")
    out = [f"# A request's path, counted ({when})", "", f"`{command}`", "", about, "",
           "| files | by package | by folder | lines | cross-file hops | background pairs left out |",
           "|---|---|---|---|---|---|",
           (f"| {len(s['files'])} | {packages} | {folders} | {s['total_lines']} | {len(s['hops'])} | "
            f"{len(s['background'])} |"), "", "## Files", ""]
    out += [f"- `{f}` ({s['lines'][f]} lines)" for f in s["files"]]
    out += ["", "## Cross-file hops (caller -> callee)", ""] + [f"- `{a}` -> `{b}`" for a, b in s["hops"]]
    out += ["", "## Background: rose during the calls, not on the path (left out)", ""]
    out += [f"- `{b}`" for b in s["background"]] or ["- none"]
    return "\n".join(out) + "\n"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m seqserve.loadtest.request_path", description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", required=True, help="the bundle the server serves")
    p.add_argument("--engine-process", action="store_true", help="serve with --engine-process")
    p.add_argument("--num-beams", type=int, default=1, help="beam width of both calls (1: greedy)")
    p.add_argument("--max-new-tokens", type=int, default=16, help="max_new_tokens of both calls")
    p.add_argument("--python", default=sys.executable,
                   help="the python of the venv whose seqserve serves (its `seqserve` script beside it)")
    p.add_argument("--calls", type=int, default=5, help="measured calls, one after another (after one warm-up)")
    p.add_argument("--out", required=True, help="the markdown report")
    p.add_argument("--json", help="also write the counts as JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    found = measure(args)
    s = summary(found)
    command = "python -m seqserve.loadtest.request_path " + shlex.join(sys.argv[1:] if argv is None else argv)
    Path(args.out).write_text(markdown(args, found, s, command))
    if args.json:
        Path(args.json).write_text(json.dumps({"command": command, "options": found["options"], **s}, indent=1))
    print(f"{len(s['files'])} files {s['by_package']}, {s['total_lines']} lines, {len(s['hops'])} cross-file hops, "
          f"{len(s['background'])} background pairs left out -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
