"""What a client process loads: the container probe, the services listing, the Python client and a load generator
(the locust file, `seqserve loadtest`'s driver) load nothing of seqserve.server and neither onnxruntime nor torch.
tests/test_layers.py proves the import graph statically; this imports the modules for real, in a fresh process."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CLIENT_SIDE = ("seqserve.client.client", "seqserve.client.healthcheck", "seqserve.client.services",
               "seqserve.loadtest.locustfile", "seqserve.loadtest.command")
ENGINE_SIDE = ("seqserve.server", "onnxruntime", "torch")


def test_a_client_process_loads_nothing_of_the_engine():
    code = (f"import importlib, sys\n"
            f"for name in {CLIENT_SIDE!r}:\n"
            f"    importlib.import_module(name)\n"
            f"assert 'seqserve.client.channel' in sys.modules\n"  # the imports above really ran
            f"print(sorted(m for m in sys.modules if m.startswith({ENGINE_SIDE!r})))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout
