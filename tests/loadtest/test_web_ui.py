"""The same locustfile driven through locust's web UI, as a person would: the form sends every field as a string."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.parse
import urllib.request

from grpc_harness import wait_for
from ports import free_port

from seqserve.loadtest.driver import LOCUSTFILE


def _post(url: str, form: dict | None = None) -> dict:
    data = urllib.parse.urlencode(form or {}).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=data, method="POST"), timeout=10) as response:
        return json.loads(response.read())


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


def test_locustfile_runs_from_the_web_ui(server, tiny_bundle, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    summary_path = tmp_path / "summary.json"
    with (tmp_path / "locust.log").open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--host", server.address,
                                 "--web-host", "127.0.0.1", "--web-port", url.rsplit(":", 1)[1],
                                 "--heldout", str(tiny_bundle), "--summary-json", str(summary_path),
                                 "--stop-timeout", "10"], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _up(url), timeout=60, what="locust's web UI")
        blank = dict.fromkeys(["timeout", "temperature", "top_k", "top_p", "repetition_penalty", "stop", "seed"], "")
        form = {"user_count": "2", "spawn_rate": "2", "host": server.address, "heldout": str(tiny_bundle),
                "max_new_tokens": "3", "min_new_tokens": "3", "num_beams": "1", "return_logprobs": "true",
                "early_stopping": "false"} | blank
        assert _post(url + "/swarm", form)["success"]
        wait_for(lambda: server.metric("seqserve_requests_total", method="GenerateStream", code="OK") >= 5,
                 timeout=60, what="streams from the web UI's users")
        assert _post(url + "/stop")["success"]
        wait_for(summary_path.exists, timeout=30, what="summary.json after stop")
    finally:
        proc.terminate()
        proc.wait(30)
    summary = json.loads(summary_path.read_text())
    assert summary["users"] == 2 and summary["requests"] > 0 and summary["failures"] == 0
    assert summary["decoding"] == {"max_new_tokens": 3, "min_new_tokens": 3, "num_beams": 1, "return_logprobs": True,
                                   "early_stopping": False}
    assert summary["generated_tokens"] == 3 * summary["requests"]  # the form's strings reached the server as numbers
