"""Counts caller->callee pairs of seqserve functions in a process it is injected into: `request_path` copies this file
as `sitecustomize.py` into a folder on the server's PYTHONPATH, so every Python process the server starts loads it.

Standard library only (it runs before anything is imported). SEQSERVE_PATH_DIR: the folder of triggers and dumps;
SEQSERVE_PATH_ROOTS: a JSON list of the seqserve package folders (a file is ours when its path starts with one).
"""
import atexit
import json
import os
import sys
import threading
import time

DIR = os.environ.get("SEQSERVE_PATH_DIR", "")
ROOTS = tuple(json.loads(os.environ.get("SEQSERVE_PATH_ROOTS", "[]")))
TRIGGER = "trigger"  # holds a number; each new number asks every process for one dump
POLL_S = 0.02

_counts: dict = {}
_ours: dict = {}


def _is_ours(filename: str) -> bool:
    known = _ours.get(filename)
    if known is None:
        known = _ours[filename] = filename.startswith(ROOTS)
    return known


def _profile(frame, event, arg):
    """On each Python call into a seqserve function: count (caller, callee); caller None when the caller is not ours."""
    if event != "call":
        return
    code = frame.f_code
    if not _is_ours(code.co_filename):
        return
    back = frame.f_back
    caller = None
    if back is not None and _is_ours(back.f_code.co_filename):
        caller = (back.f_code.co_filename, back.f_code.co_qualname)
    key = (caller, (code.co_filename, code.co_qualname))
    _counts[key] = _counts.get(key, 0) + 1


def _marker() -> str:
    return os.path.join(DIR, f"pid-{os.getpid()}")


def _dump(number: str) -> None:
    rows = [[*(caller or (None, None)), *callee, n] for (caller, callee), n in _counts.copy().items()]
    path = os.path.join(DIR, f"dump-{number}-{os.getpid()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(rows, f)
    os.replace(path + ".tmp", path)  # the reader never sees half a dump


def _watch() -> None:
    """Dumps the counters once per new number in the trigger file."""
    seen = ""
    while True:
        try:
            with open(os.path.join(DIR, TRIGGER)) as f:
                number = f.read().strip()
        except OSError:
            number = ""
        if number and number != seen:
            seen = number
            _dump(number)
        time.sleep(POLL_S)


def _start() -> None:
    """Registers this process and starts its dumper (again in a forked child, whose threads did not survive)."""
    with open(_marker(), "w") as f:
        f.write(" ".join(sys.argv))
    threading.Thread(target=_watch, name="path-profiler", daemon=True).start()


def _forget() -> None:
    try:
        os.unlink(_marker())
    except OSError:
        pass


if DIR and ROOTS:
    _start()
    atexit.register(_forget)
    os.register_at_fork(after_in_child=_start)
    threading.setprofile(_profile)
    sys.setprofile(_profile)
