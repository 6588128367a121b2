"""A server's private temporary directories, each naming the process that owns it, and the sweep of those whose owner
is dead.

A server makes two kinds under the system's temporary directory, both mode 0700: `seqserve-engine-*` (its engine
processes' ipc sockets) and `seqserve-front-ends-*` (engines.json, with --front-ends). Its processes remove them as
they stop, and after a kill -9 another of them does: an engine process whose front end died removes its socket
directory, an attached front end whose first front end died removes engines.json's. A kill -9 that leaves no such
process behind (the server killed while an engine process restarts after its back-off) leaves the directory; so
making a directory of a kind first sweeps away those of that kind whose owner is gone. Directories of other users are
never touched (their owner record cannot be read, and their uid is not ours), nor those without an owner record.

The owner record (OWNER inside): its pid, that process's start time (field 22 of /proc/PID/stat, in clock ticks
since boot), so a pid the system has given to another process since is not taken for the owner, and its pid
namespace, so a directory made in another container sharing this temporary directory is never judged from here.
"""
from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

log = logging.getLogger("seqserve.engine.remote.owned_dirs")
OWNER = "owner"


def _namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")  # e.g. pid:[4026531836]
    except OSError:
        return "pid:[?]"


_NAMESPACE = _namespace()


def make(prefix: str) -> Path:
    """A new private directory (0700) named prefix + random, owned by this process; stale ones swept first."""
    sweep(prefix)
    path = Path(tempfile.mkdtemp(prefix=prefix))
    (path / OWNER).write_text(f"{_identity(os.getpid())} {_NAMESPACE}")
    return path


def sweep(prefix: str) -> list[Path]:
    """Removes this user's directories of this kind whose owner is dead; those removed."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        try:
            info = os.lstat(path)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            owner = (path / OWNER).read_text()
        except OSError:  # gone meanwhile, or no owner record (being made, or made by an older version)
            continue
        if not _alive(owner):
            shutil.rmtree(path, ignore_errors=True)
            log.info("removed %s, left behind by process %s that is gone", path, owner.split()[0])
            removed.append(path)
    return removed


def _identity(pid: int) -> str | None:
    """`PID START` of a running process (None: no such process)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()  # after the command name, which may hold spaces
    except OSError:
        return None
    return f"{pid} {fields[19]}"  # field 22 of the line, the 20th after the name


def _alive(owner: str) -> bool:
    """Whether the owner a record names may still run (a record this module did not write, or one made in another
    pid namespace, is not ours to judge: alive)."""
    parts = owner.split()
    if len(parts) != 3 or not parts[0].isdigit() or parts[2] != _NAMESPACE:
        return True
    return _identity(int(parts[0])) == f"{parts[0]} {parts[1]}"
