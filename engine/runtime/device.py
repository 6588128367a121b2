"""Execution provider choice, onnxruntime sessions, and host <-> device transfers of OrtValues.

The same code serves CUDA (device-resident buffers) and CPU (OrtValues over numpy memory, zero-copy):
tests run the very IO-binding path the GPU uses.
"""
from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from seqserve.contract.devices import CPU_PROVIDER, CUDA_PROVIDER, DEVICES

log = logging.getLogger(__name__)

CUDA, CPU = CUDA_PROVIDER, CPU_PROVIDER


@dataclass(frozen=True)
class RuntimeConfig:
    device: str = "auto"  # auto: CUDA when onnxruntime can create it, else CPU
    intra_op_threads: int = 0  # 0 = onnxruntime's default (one per core)
    inter_op_threads: int = 1
    allow_spinning: bool = True  # idle spinning of intra-op threads; off helps when other work shares the cores
    # TF32 rounds fp32 matmul inputs to 10 mantissa bits: measured 9.6e-3 max logit error against PyTorch on an H100
    # (verify's tolerance is 1e-4), so fp32 stays exact by default; the fp16 variant is the fast GPU path.
    cuda_tf32: bool = False
    optimization: str = "all"  # onnxruntime graph optimisation level: disable | basic | extended | all
    # CUDA only: the decoder session captures one CUDA graph per batch bucket at warm-up and replays it (the device
    # cache pads each step to its bucket); never taken on the CPU provider (docs/architecture.md, "The device path").
    cuda_graphs: bool = False

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        if self.intra_op_threads < 0 or self.inter_op_threads < 0:
            raise ValueError("thread counts must be >= 0")


_LEVELS = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL, "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
           "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}


# onnxruntime's CPU SkipLayerNormalization took 5x the time of the Add + LayerNormalization it fuses (64 x 512 float32:
# 172 vs 33 us, docs/benchmarks.md), so CPU sessions keep them apart; CUDA sessions leave the fusion on
CPU_UNFUSED = ["SkipLayerNormFusion"]


class Device:
    """Creates sessions on one provider and moves arrays to and from it."""

    def __init__(self, cfg: RuntimeConfig) -> None:
        self.cfg = cfg
        self.provider = self._choose_provider()
        self.ort_device = "cuda" if self.provider == CUDA else "cpu"
        self._run_options: dict[int, ort.RunOptions] = {}
        log.info("onnxruntime %s: %s execution provider %s", ort.__version__,
                 "trying" if self.provider == CUDA and cfg.device == "auto" else "using", self.provider)

    def _choose_provider(self) -> str:
        available = ort.get_available_providers()
        if self.cfg.device == "cpu" or CUDA not in available:
            if self.cfg.device == "cuda":
                raise RuntimeError(f"--device cuda: onnxruntime {ort.__version__} offers only {available}")
            return CPU
        # onnxruntime-gpu lists CUDA even without its libraries; under auto its loader error is expected on CPU
        # machines, so only fatal messages pass and session() reports the fallback (--device cuda shows the reason).
        ort.set_default_logger_severity(4 if self.cfg.device == "auto" else 2)
        _preload_cuda_libraries(quiet=self.cfg.device == "auto")
        return CUDA  # confirmed (or refused) when the first session is created

    def session(self, path: Path, graph_capture: bool = False) -> ort.InferenceSession:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.cfg.intra_op_threads
        opts.inter_op_num_threads = self.cfg.inter_op_threads
        opts.graph_optimization_level = _LEVELS[self.cfg.optimization]
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if self.cfg.allow_spinning else "0")
        opts.log_severity_level = 3  # onnxruntime's own warnings about missing CUDA libraries are reported below
        cuda_options = {"use_tf32": "1" if self.cfg.cuda_tf32 else "0"}
        if graph_capture:  # every input and output must then be bound at fixed device addresses (device_cache.py)
            cuda_options["enable_cuda_graph"] = "1"
        providers = [(CUDA, cuda_options), CPU] if self.provider == CUDA else [CPU]
        session = ort.InferenceSession(str(path), sess_options=opts, providers=providers,
                                       disabled_optimizers=CPU_UNFUSED if self.provider == CPU else None)
        actual = session.get_providers()[0]
        if actual != self.provider:  # CUDA listed by onnxruntime-gpu, but its libraries or GPU are missing
            if self.cfg.device == "cuda":
                raise RuntimeError(f"--device cuda: onnxruntime could not create {CUDA} (got {actual})")
            # expected under auto on a machine without a GPU (onnxruntime-gpu lists CUDA anyway): not a warning
            log.info("%s unavailable (no GPU or CUDA libraries; --device cuda prints onnxruntime's reason): using %s",
                     self.provider, actual)
            self.provider, self.ort_device = actual, "cpu"
            return self.session(path, graph_capture)  # again, with the CPU's optimisers
        return session

    @property
    def cuda_graphs(self) -> bool:
        """Whether decoder sessions capture CUDA graphs: asked for, and the provider really is CUDA."""
        return self.cfg.cuda_graphs and self.provider == CUDA

    def decoder_session(self, path: Path) -> ort.InferenceSession:
        """The decoder's session: with CUDA graphs, captured per gpu_graph_id (run_options) on its first runs."""
        return self.session(path, graph_capture=self.cuda_graphs)

    def run_options(self, batch: int) -> ort.RunOptions | None:
        """A decoder run's options: with CUDA graphs, the graph id of the batch bucket (one captured graph each)."""
        if not self.cuda_graphs:
            return None
        if batch not in self._run_options:
            options = ort.RunOptions()
            options.add_run_config_entry("gpu_graph_id", str(batch))
            self._run_options[batch] = options
        return self._run_options[batch]

    def session_from_bytes(self, model: bytes) -> ort.InferenceSession:
        """A small graph built at run time (copy_graphs.py) on this device, without graph capture."""
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = 1, 1
        opts.log_severity_level = 3
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = [(CUDA, {"use_tf32": "0"}), CPU] if self.provider == CUDA else [CPU]
        return ort.InferenceSession(model, sess_options=opts, providers=providers)

    def put(self, array: np.ndarray) -> ort.OrtValue:
        """Host array -> OrtValue on this device (on CPU it wraps the numpy memory without a copy)."""
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), self.ort_device, 0)

    @staticmethod
    def get(value: ort.OrtValue) -> np.ndarray:
        """OrtValue -> host array (a view on CPU, a copy from the GPU)."""
        return value.numpy()


def _preload_cuda_libraries(quiet: bool) -> None:
    """Loads CUDA from pip's nvidia-* wheels (`onnxruntime-gpu[cuda,cudnn]`), which are not on the loader's path.

    A system CUDA on LD_LIBRARY_PATH is found either way; under auto a CPU machine's misses are not printed.
    """
    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return
    with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
        try:
            preload()
        except Exception as exc:  # a failed preload only means session() falls back or reports the missing library
            log.debug("onnxruntime.preload_dlls failed: %s", exc)
