"""SIGTERM ends a real `seqserve serve` with exit 0 and a "stopped" log line from the first instant its handler is
installed to its exit, and the handler is installed before anything slow is imported (server/signals.py).

No timing windows: each test acts on what it observes in the process, its caught-signal mask (`SigCgt` in
/proc/PID/status), the shared libraries it has mapped (/proc/PID/maps) or its log.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from grpc_harness import follow_log

SEQSERVE = Path(sys.executable).parent / "seqserve"  # the console script pip installed, as a user runs it
TERM_BIT = 1 << (signal.SIGTERM - 1)  # SigCgt's bit for SIGTERM
# Between two signals of a stream: a pace, not a window (an unpaced stream of millions a second can wedge grpc's
# own shutdown, a signal storm no deployment sends); the stop's last steps each take longer.
PACE = 0.001
WAIT = 120  # seconds: the longest any phase may take on a loaded machine (a failure, never a pacing)
# Loaded by `serve` only after the handler: grpc, protobuf, numpy, onnxruntime and the server itself.
SLOW = ("grpc", "google", "numpy", "onnxruntime")
# The modules main may load before it installs the handler (the package, the CLI, the signals module).
FIRST = {"seqserve", "seqserve.cli", "seqserve.cli.main", "seqserve.server", "seqserve.server.signals"}


def _proc_text(pid: int, name: str) -> str | None:
    try:
        return Path(f"/proc/{pid}/{name}").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None


def _catches_sigterm(pid: int) -> bool:
    status = _proc_text(pid, "status") or ""
    mask = next((line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), "0")
    return bool(int(mask, 16) & TERM_BIT)


def _maps(fragment: str):
    return lambda proc, log: fragment in (_proc_text(proc.pid, "maps") or "")


POINTS = {  # observable moments of the start-up, in order
    "handler-installed": lambda proc, log: _catches_sigterm(proc.pid),
    "grpc-loaded": _maps("cygrpc"),
    "onnxruntime-loaded": _maps("onnxruntime_pybind11_state"),
    "serving": lambda proc, log: any(" serving " in line for line in log),
}


def _start(bundle: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEQSERVE_")}
    return subprocess.Popen([str(SEQSERVE), "serve", "--bundle", str(bundle), "--port", "0", "--metrics-port", "-1",
                             "--device", "cpu", "--grace-seconds", "5"], env=env, stderr=subprocess.PIPE, text=True)


def _wait_until(point: str, proc: subprocess.Popen, log: list[str]) -> None:
    """Polls from the moment the process exists (no sleep: the first instants are the point)."""
    end = time.monotonic() + WAIT
    while not POINTS[point](proc, log):
        assert proc.poll() is None, f"exited {proc.returncode} before {point}: {''.join(log)}"
        assert time.monotonic() < end, f"never reached {point}: {''.join(log)}"


def _assert_stopped_cleanly(proc: subprocess.Popen, log: list[str]) -> None:
    code = proc.wait(WAIT)
    proc.stderr.close()
    text = "".join(log)
    assert code == 0, f"exit {code}: {text}"
    assert "stopped" in text and "Traceback" not in text, text


def test_the_handler_is_installed_before_anything_slow_is_imported(tmp_path):
    """What `seqserve serve` has imported at the instant it installs its SIGTERM handler: the console script's own
    entry (main), observed through signal.signal, which it wraps and calls on."""
    observe = ("import signal, sys\n"
               "install = signal.signal\n"
               "def observed(sig, handler):\n"
               "    if sig == signal.SIGTERM and not hasattr(observed, 'seen'):\n"
               "        observed.seen = sorted(m for m in sys.modules if m.split('.')[0] in ('seqserve',) + SLOW)\n"
               "        print('loaded:', ' '.join(observed.seen), file=sys.stderr, flush=True)\n"
               "    return install(sig, handler)\n"
               "signal.signal = observed\n"
               "from seqserve.cli.main import main\n"
               "sys.exit(main())\n")
    done = subprocess.run([sys.executable, "-c", f"SLOW = {SLOW!r}\n" + observe, "serve", "--bundle",
                           str(tmp_path / "none")], capture_output=True, text=True, timeout=WAIT)
    assert done.returncode == 2 and "no manifest.json there" in done.stderr, done.stderr  # refused after the handler
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("loaded:")]
    assert set(line.split()[1:]) <= FIRST, line


def test_the_handler_is_installed_by_the_first_module_of_ours_the_command_runs(tmp_path):
    """The console script imports seqserve.cli.main; the handler is installed while its package (seqserve.cli) is
    imported, before cli/main.py or argparse: the earliest point Python runs any code of ours. Before it, the
    interpreter is starting (docs/security.md gives the measured bound)."""
    observe = ("import signal, sys\n"
               "install = signal.signal\n"
               "def observed(sig, handler):\n"
               "    if sig == signal.SIGTERM and not hasattr(observed, 'seen'):\n"
               "        observed.seen = sorted({'argparse', 'seqserve.cli.main'} & set(sys.modules))\n"
               "        print('loaded:', ' '.join(observed.seen), file=sys.stderr, flush=True)\n"
               "    return install(sig, handler)\n"
               "signal.signal = observed\n"
               "from seqserve.cli.main import main\n"
               "sys.exit(main())\n")
    done = subprocess.run([sys.executable, "-c", observe, "serve", "--bundle", str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=WAIT)
    assert done.returncode == 2 and "no manifest.json there" in done.stderr, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("loaded:")]
    assert line.split() == ["loaded:"], line


@pytest.mark.parametrize("point", list(POINTS))
def test_sigterm_at_each_point_of_the_start_up_exits_0(tiny_bundle, point):
    proc = _start(tiny_bundle)
    log, _, _ = follow_log(proc)
    try:
        _wait_until(point, proc, log)
        proc.send_signal(signal.SIGTERM)
        _assert_stopped_cleanly(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("point", ["handler-installed", "serving"])
def test_sigterm_at_every_instant_from_the_handler_to_the_exit_exits_0(tiny_bundle, point):
    """A SIGTERM every millisecond from the point until the process has exited: the start-up or the drain, the event
    loop closing and the interpreter shutting down all meet some, and none may end it with 143."""
    proc = _start(tiny_bundle)
    log, _, _ = follow_log(proc)
    try:
        _wait_until(point, proc, log)
        end = time.monotonic() + WAIT
        while proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # Popen does not signal a process it has reaped
            assert time.monotonic() < end, f"never exited: {''.join(log)}"
            time.sleep(PACE)
        _assert_stopped_cleanly(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sighup_during_the_drain_and_the_exit_changes_nothing(tiny_bundle):
    """After SIGTERM, a SIGHUP every millisecond until the process has exited: none may end it (exit 129)."""
    proc = _start(tiny_bundle)
    log, _, _ = follow_log(proc)
    try:
        _wait_until("serving", proc, log)
        proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + WAIT
        while proc.poll() is None:
            proc.send_signal(signal.SIGHUP)
            assert time.monotonic() < end, f"never exited: {''.join(log)}"
            time.sleep(PACE)
        _assert_stopped_cleanly(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()


def _until_caught(argv: list[str]) -> float:
    """Seconds from exec to the instant SigCgt shows SIGTERM caught (polled without a pause)."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_until("handler-installed", proc, [])
        return time.monotonic() - start
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(not os.environ.get("SEQSERVE_HANDLER_TIMING"), reason="a measurement: SEQSERVE_HANDLER_TIMING=N")
def test_time_from_exec_to_the_handler(tmp_path):
    """The true bound of "any instant" (docs/security.md): `seqserve serve` against the earliest a Python program can
    catch SIGTERM (`python -c` whose first statement installs a handler), N runs each, interleaved."""
    runs = int(os.environ["SEQSERVE_HANDLER_TIMING"])
    floor = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, print); time.sleep(60)"]
    ours = [str(SEQSERVE), "serve", "--bundle", str(tmp_path / "none")]
    times = {"python -c": [], "seqserve serve": []}
    for _ in range(runs):
        times["python -c"].append(_until_caught(floor))
        times["seqserve serve"].append(_until_caught(ours))
    for name, xs in times.items():
        xs.sort()
        print(f"{name}: median {xs[len(xs) // 2] * 1000:.0f} ms, min {xs[0] * 1000:.0f}, max {xs[-1] * 1000:.0f} "
              f"(load {os.getloadavg()[0]:.1f})")
