"""Which onnxruntime provider a session really gets here, and which GPU torch sees: the GPU check's first section.

    python -m seqserve.loadtest.device_probe [--device cuda|cpu]

Creates a one-node ONNX session through the server's own Device (engine/runtime/device.py), so the provider printed is
the
one the engine would run on, not merely one onnxruntime lists (onnxruntime-gpu lists CUDA on machines without a GPU).
Prints `provider: NAME`, `gpu: ...` and `torch: ...` lines; with --device cuda and no CUDA provider it prints
`no CUDA provider: <why>` on stderr (onnxruntime's own loader messages come before it) and exits 2.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from seqserve.engine.runtime.device import Device, RuntimeConfig

PROG = "python -m seqserve.loadtest.device_probe"
PROVIDER_LINE, NO_CUDA = "provider: ", "no CUDA provider"
PROBE_IR_VERSION = 10  # an IR every onnxruntime of the last years reads (onnx writes its newest by default)
NVIDIA_SMI_QUERY = ["--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]


def identity_model(path: Path) -> Path:
    """A float input copied to its output: the smallest graph a provider must accept."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=PROBE_IR_VERSION)
    onnx.save(model, str(path))
    return path


def provider(device: str) -> str:
    """The provider a session gets under the server's --device rules (RuntimeError when cuda cannot be had)."""
    with tempfile.TemporaryDirectory(prefix="seqserve-probe-") as tmp:
        dev = Device(RuntimeConfig(device=device))
        return dev.session(identity_model(Path(tmp) / "probe.onnx")).get_providers()[0]


def gpu_name() -> str:
    """nvidia-smi's name, driver and memory of each GPU, or why there is none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "none found (no nvidia-smi on PATH)"
    done = subprocess.run([smi, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=60)
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return "; ".join(lines) if done.returncode == 0 and lines else f"nvidia-smi failed: {done.stderr.strip()[:300]}"


def torch_device() -> str:
    try:
        import torch
    except ImportError:
        return "not installed (the transformers rows need it)"
    if torch.cuda.is_available():
        return f"{torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}"
    return f"{torch.__version__}, no CUDA device visible"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    args = p.parse_args(argv)
    import onnxruntime as ort

    print(f"onnxruntime {ort.__version__}, providers listed: {ort.get_available_providers()}")
    print(f"gpu: {gpu_name()}")
    print(f"torch: {torch_device()}", flush=True)
    try:
        used = provider(args.device)
    except RuntimeError as exc:
        print(f"{NO_CUDA}: {exc}", file=sys.stderr)
        return 2
    print(f"{PROVIDER_LINE}{used}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
