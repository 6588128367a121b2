"""The container healthcheck, exactly as docker-compose.yml and the Dockerfile run it, against a real server."""
from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import yaml
from deploy_harness import ROOT, heldout_inputs, start_replicas, wait_until

from seqserve.client.healthcheck import check
from seqserve.v1 import seqserve_pb2 as pb

COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _healthcheck(address: str) -> subprocess.CompletedProcess:
    """The compose healthcheck's command with the replica's local address in place of 127.0.0.1:50051."""
    test = COMPOSE["services"]["seqserve"]["healthcheck"]["test"]
    assert test[0] == "CMD" and test[-1] == "127.0.0.1:50051"
    command = [sys.executable if test[1] == "python" else test[1], *test[2:-1], address]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


def test_healthcheck_passes_while_serving_and_fails_while_draining(tiny_bundle, tmp_path):
    # One row per decoder step: eight batches of long generations (20,480 steps) keep the drain open far longer than
    # the healthcheck command takes to start, even on a busy machine; the grace period outlasts them.
    (replica,) = start_replicas(tiny_bundle, tmp_path, [{"max_batch_size": 1, "max_waiting": 1024,
                                                          "grace_seconds": 300}])
    try:
        serving = _healthcheck(replica.address)
        assert (serving.returncode, serving.stdout.strip()) == (0, "SERVING"), serving.stderr
        batch = pb.GenerateBatchRequest(inputs=heldout_inputs(tiny_bundle, 64),
                                        options=pb.DecodingOptions(max_new_tokens=40, min_new_tokens=40))
        with ThreadPoolExecutor(8) as pool:
            calls = [pool.submit(replica.stub.GenerateBatch, batch, timeout=300) for _ in range(8)]
            # every input of the eight calls is in the server before the drain (a call still arriving is refused)
            wait_until(lambda: replica.count("seqserve_running_requests") + replica.count("seqserve_waiting_requests")
                       + replica.count("seqserve_finished_requests_total", reason="length") == 8 * len(batch.inputs),
                       30, "the batches to arrive")
            replica.process.send_signal(15)  # SIGTERM: the drain begins
            wait_until(lambda: check(replica.address, timeout=1) == "NOT_SERVING", 10, "the drain")
            draining = _healthcheck(replica.address)
            # the calls run one after another (FCFS, one row at a time): the drain lasts until the last one ends
            assert not all(c.done() for c in calls), "the drain ended before the healthcheck ran: lengthen the work"
            results = [c.result() for c in calls]
        assert (draining.returncode, draining.stdout.strip()) == (1, "NOT_SERVING"), draining.stderr
        assert all(len(r.results) == 64 for r in results)  # the calls in flight finished during the drain
        assert replica.process.wait(300) == 0
        stopped = _healthcheck(replica.address)
        assert (stopped.returncode, stopped.stdout.strip()) == (1, "UNAVAILABLE")  # nothing listens any more
    finally:
        replica.close()
