"""Budgets: stop strings (count, bytes each, bytes in all), request bytes held by calls in flight, the receive limit;
every limit reported by GetModelInfo and documented; issue 11's memory-amplification repro, scaled down, in a real
`seqserve serve` process whose RSS is read from /proc."""
from __future__ import annotations

import collections
import dataclasses
import os
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_harness import request, wait_for

from seqserve.v1 import seqserve_pb2 as pb
from seqserve.v1 import seqserve_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parents[2]
LONG = dict(min_new_tokens=30, max_new_tokens=30)
Code = grpc.StatusCode
MiB = 1 << 20


def _error(call, *args, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    return info.value


@pytest.mark.parametrize("stop, message", [
    (["x" * 257], "options.stop[0] has 257 bytes, more than max_stop_string_bytes=256"),
    (["ok", "é" * 129], "options.stop[1] has 258 bytes, more than max_stop_string_bytes=256"),  # bytes, not chars
    (["y" * 250] * 5, "options.stop has 1250 bytes in all, more than max_stop_bytes=1024"),
    (["z"] * 9, "options.stop has 9 strings, more than max_stop_strings=8"),
])
def test_stop_string_budgets_are_invalid_argument_naming_the_limit(served, stop, message):
    for method in (served.stub.Generate, served.stub.GenerateBatch):
        message_class = pb.GenerateRequest if method is served.stub.Generate else pb.GenerateBatchRequest
        inputs = {"input": "b 5 9"} if message_class is pb.GenerateRequest else {"inputs": ["b 5 9"]}
        err = _error(method, message_class(options=pb.DecodingOptions(stop=stop), **inputs), timeout=10)
        assert err.code() == Code.INVALID_ARGUMENT and err.details() == message


def test_model_info_reports_every_limit_and_docs_describe_each(served):
    limits = served.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).limits
    resolved = dataclasses.asdict(served.model.limits)
    assert {f.name: getattr(limits, f.name) for f in pb.Limits.DESCRIPTOR.fields} == resolved
    s = served.app.settings
    assert (limits.max_stop_string_bytes, limits.max_stop_bytes, limits.max_receive_message_bytes,
            limits.max_inflight_bytes) == (s.max_stop_string_bytes, s.max_stop_bytes, s.max_receive_message_bytes,
                                           s.max_inflight_bytes) == (256, 1024, 256 * 1024, 32 * MiB)
    doc = (REPO / "docs" / "security.md").read_text()
    for name in resolved:
        assert f"`{name}`" in doc, f"docs/security.md does not describe the limit {name}"


def test_request_bytes_in_flight_are_bounded(make_server, heldout):
    """Calls hold their request's bytes until they end; one that would pass max_inflight_bytes is refused at once."""
    s = make_server(max_batch_size=1, max_receive_message_bytes=2048, max_inflight_bytes=3000)
    s.slow_down(0.05)  # 30 tokens: the first calls stay in flight while the next ones arrive
    heavy = request(heldout[0][0], stop=["q" * 250] * 4, **LONG)  # about 1 KB of payload, all of it valid
    size = heavy.ByteSize()
    assert 1000 < size and 2 * size <= 3000 < 3 * size
    first = [s.stub.Generate.future(heavy, timeout=60) for _ in range(2)]
    wait_for(lambda: s.metric("seqserve_inflight_request_bytes") == 2 * size, what="two calls' bytes held")
    err = _error(s.stub.Generate, heavy, timeout=60)
    assert err.code() == Code.RESOURCE_EXHAUSTED and "max_inflight_bytes=3000" in err.details()
    assert s.metric("seqserve_rejected_requests_total", reason="inflight_bytes") == 1
    light = s.stub.Generate.future(request(heldout[1][0], max_new_tokens=2), timeout=60)  # small calls still fit
    s.slow_down(0)
    assert [f.result().usage.generated_tokens for f in first] == [30, 30] and light.result().usage.generated_tokens
    wait_for(lambda: s.metric("seqserve_inflight_request_bytes") == 0, what="bytes released")
    assert s.stub.Generate(heavy, timeout=60).usage.generated_tokens == 30


def _rss_kib(pid: int, field: str = "VmRSS") -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", status, re.M).group(1))


def _serve(bundle: Path, *flags: str) -> tuple[subprocess.Popen, str, list[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEQSERVE_")}
    proc = subprocess.Popen([sys.executable, "-m", "seqserve.cli", "serve", "--bundle", str(bundle), "--port", "0",
                             "--metrics-port", "-1", "--device", "cpu", "--intra-op-threads", "1", *flags],
                            cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    log, found = [], threading.Event()
    address = []

    def read() -> None:
        for line in proc.stderr:
            log.append(line)
            if m := re.search(r" on (127\.0\.0\.1:\d+) \(", line):
                address.append(m.group(1))
                found.set()

    threading.Thread(target=read, daemon=True).start()
    if not found.wait(60):
        proc.kill()
        raise AssertionError("".join(log))
    return proc, address[0], log


# Full scale, as in issue 11 (docs/security.md has the figures):
#   SEQSERVE_AMPLIFICATION_CALLS=250 pytest -s tests/server/test_security_budgets.py -k amplification
CALLS = int(os.environ.get("SEQSERVE_AMPLIFICATION_CALLS", "100"))


@pytest.mark.parametrize("chars, refused", [(250_000, "over the receive limit"), (60_000, "over the receive limit"),
                                            (15_000, "over the stop or in-flight budgets")])
def test_memory_amplification_repro_is_refused_with_bounded_rss(tiny_bundle, chars, refused):
    """Issue 11, defect 1, scaled down (100 concurrent calls instead of 250): 8 stop strings of `chars` x "é"
    against --max-batch-size 1. Before the budgets RSS went from 95 MB to 1.9 GB and stayed near 1 GB."""
    calls = CALLS
    proc, address, log = _serve(tiny_bundle, "--max-batch-size", "1")
    try:
        before = _rss_kib(proc.pid)
        payload = request("b 5 9 k", max_new_tokens=40, min_new_tokens=40, stop=["é" * chars] * 8)
        with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", -1)]) as channel:
            stub = pb_grpc.GenerationStub(channel)

            def call(_) -> grpc.StatusCode:
                try:
                    stub.Generate(payload, timeout=120)
                    return Code.OK
                except grpc.RpcError as err:
                    return err.code()

            with ThreadPoolExecutor(calls) as pool:
                codes = list(pool.map(call, range(calls)))
            if payload.ByteSize() > 256 * 1024:  # gRPC refuses them before anything is decoded
                assert codes == [Code.RESOURCE_EXHAUSTED] * calls
            else:  # admitted by bytes (or not, beyond max_inflight_bytes), then refused by the stop-string budget
                assert set(codes) <= {Code.INVALID_ARGUMENT, Code.RESOURCE_EXHAUSTED}, codes
            assert stub.Generate(request("b 5 9 k", max_new_tokens=4), timeout=60).usage.generated_tokens == 4
        peak, after = _rss_kib(proc.pid, "VmHWM"), _rss_kib(proc.pid)
        print(f"{calls} calls of {payload.ByteSize() / 1e6:.2f} MB, {refused}: "
              f"{dict(collections.Counter(c.name for c in codes))}; server RSS {before / 1024:.0f} MiB before, "
              f"peak {peak / 1024:.0f} MiB, {after / 1024:.0f} MiB after")
        assert peak - before < 400 * 1024, f"peak RSS grew by {(peak - before) / 1024:.0f} MiB"
        assert after - before < 200 * 1024, f"RSS stayed {(after - before) / 1024:.0f} MiB higher"
    finally:
        proc.terminate()
        assert proc.wait(60) == 0, "".join(log)
