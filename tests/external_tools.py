"""The programs some tests run that pip does not install: Debian's nginx, prometheus (with promtool) and
docker-compose, the packages .ci/run installs. Without one, its tests are skipped (under CI=true they fail), and
the session ends with one line naming what was missing and the command that installs it."""
from __future__ import annotations

import os
import shutil

import pytest

PACKAGES = {"nginx": "nginx", "prometheus": "prometheus", "promtool": "prometheus", "docker-compose": "docker-compose"}
# as README's line says it: as root apt-get itself (a container has no sudo), as a user through sudo
INSTALL = ("" if os.geteuid() == 0 else "sudo ") + "apt-get install -y " + " ".join(dict.fromkeys(PACKAGES.values()))
missing: set[str] = set()  # the tools a test asked for and did not find, this session


def require(tool: str) -> str:
    """The tool's path; a failure under CI (which installs it), a skip elsewhere."""
    path = shutil.which(tool)
    if path is None:
        missing.add(tool)
        message = f"{tool} is not installed (Debian package {PACKAGES[tool]}; .ci/run installs it: {INSTALL})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def summary() -> str | None:
    """The session's last line when tests were skipped for a missing tool, else None."""
    if not missing:
        return None
    return (f"deploy tests skipped: {', '.join(sorted(missing))} not installed; for every test: {INSTALL} "
            "(README: What `make test` needs)")
