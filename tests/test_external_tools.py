"""A test session that skipped tests for a missing external tool ends by naming the tools and how to install them."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_missing_tools_are_named_on_the_last_line_before_the_counts():
    env = {k: v for k, v in os.environ.items() if k != "CI"} | {"PATH": str(Path(sys.executable).parent)}  # no promtool
    test = "tests/deploy/test_compose_and_images.py::test_promtool_accepts_the_config_and_rules"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and "2 skipped" in lines[-1], done.stdout + done.stderr
    sudo = "" if os.geteuid() == 0 else "sudo "
    assert lines[-2] == (f"deploy tests skipped: promtool not installed; for every test: {sudo}apt-get install -y "
                         "nginx prometheus docker-compose (README: What `make test` needs)")
