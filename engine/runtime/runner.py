"""Pure execution on onnxruntime: encode sources (ahead of admission, in batches), place rows into slots, and run one
decoder step for every stepped row. Owns the slot map (slots.py) and the KV cache (inplace_cache.py or kv_cache.py).
Every decoder call goes through IO binding; with the concat cache on CUDA the self-attention past stays on the device
(encoder outputs and the cross-attention mirror still cross the bus when rows join); on CPU the same path runs with CPU
OrtValues.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from seqserve.contract import names
from seqserve.contract.manifest import Manifest, check_session_io, load_error, load_manifest
from seqserve.engine.runtime.device import Device, RuntimeConfig
from seqserve.engine.runtime.device_cache import DeviceCross, DeviceInPlaceCache
from seqserve.engine.runtime.inplace_cache import InPlaceCache
from seqserve.engine.runtime.kv_cache import ConcatCache
from seqserve.engine.runtime.slots import Joining, Slots
from seqserve.engine.step_output import Need, StepOutput

DEFAULT_CAPACITY = 256  # rows the slot map holds; the scheduler's max_batch_size must not exceed it
# Variants whose K/V column of a row is bit-equal wherever the row sits in the batch: int8's projections accumulate in
# integers (DynamicQuantizeMatMul), while a float32 GEMM rounds a row by its position in the batch (the imported
# families' beams then left transformers' tokens). Only there may a beam reorder skip the prefix two beams share.
SHARED_PREFIX_VARIANTS = ("int8",)


def choose_cache(kind: str, variant_files: dict, provider_device: str) -> str:
    """inplace (decoder_inplace.onnx, contrib ops, K/V written in place) or concat (plain decoder.onnx). auto: inplace
    on the CPU, and on CUDA for float16 buffers (CUDA's GroupQueryAttention takes only fp16/bf16)."""
    has = names.DECODER_INPLACE in variant_files
    if kind == "inplace" and not has:
        raise ValueError("--kv-cache inplace: this bundle variant has no decoder_inplace graph (re-export it)")
    if kind == "auto":
        half = has and variant_files[names.DECODER_INPLACE].get("kv_dtype") == "float16"
        return "inplace" if has and (provider_device == "cpu" or half) else "concat"
    return kind


class Runner:
    def __init__(self, bundle: str | Path, runtime: RuntimeConfig = RuntimeConfig(), variant: str = "fp32",
                 capacity: int = DEFAULT_CAPACITY, kv_cache: str = "auto", device_cache: bool | None = None) -> None:
        """device_cache: the in-place cache's buffers as device OrtValues (device_cache.py); None: on CUDA only (on
        the CPU the numpy InPlaceCache measured faster, docs/architecture.md "The device path")."""
        self.bundle = Path(bundle)
        self.manifest: Manifest = load_manifest(self.bundle)
        if variant not in self.manifest.variants:
            raise ValueError(f"variant {variant!r} is not in {self.bundle} (has {sorted(self.manifest.variants)})")
        self.variant = variant
        self.device = Device(runtime)
        files = self.manifest.variants[variant]
        self.encoder = self._session(files["encoder"]["file"], "encoder")
        cfg, special = self.manifest.model, self.manifest.special_tokens
        self.pad_id = special["pad_id"]
        self.n_layers = cfg["n_decoder_layers"]
        max_new, heads, head_dim = int(self.manifest.max_new_tokens), cfg["n_heads"], names.head_dim(cfg)
        self.slots = Slots(capacity, max_new, self.manifest.decoder_start_id)  # every row's first decoder input
        self.kv_cache = choose_cache(kv_cache, files, self.device.ort_device)  # the encoder session settled the device
        if self.kv_cache == "inplace":
            kv_dtype = np.dtype(files[names.DECODER_INPLACE].get("kv_dtype", "float32"))  # fp16: float16 buffers
            on_device = self.device.ort_device != "cpu" if device_cache is None else device_cache
            width = cfg["max_positions"] if self.device.cuda_graphs else 0  # captured graphs need a fixed width
            self.cache = DeviceInPlaceCache(self.device, self.n_layers, heads, head_dim, capacity, max_new,
                                            cfg["vocab_size"], kv_dtype, width) if on_device else InPlaceCache(
                self.device, self.n_layers, heads, head_dim, capacity, max_new, cfg["vocab_size"], kv_dtype)
        else:
            self.cache = ConcatCache(self.device, self.n_layers, heads, head_dim)
        self.decoder = self._session(files[self.cache.graph]["file"], self.cache.graph,
                                     capture=getattr(self.cache, "device_resident", False))
        outputs = {o.name for o in self.decoder.get_outputs()}
        self.token_choice = set(names.TOKEN_CHOICE_OUTPUTS) <= outputs  # steps may fetch ids instead of logits
        if getattr(self.cache, "captured", False):  # CUDA graphs: every bucket captured before the first request
            self.cache.capture(self.decoder, self.slots)
        self.cross_bytes_per_token = 2 * self.n_layers * heads * head_dim * 4  # float32 K and V of one source token
        self._left = False  # a row left since the last step

    def _session(self, file: str, graph: str, capture: bool = False):
        path = self.bundle / file
        try:
            session = self.device.decoder_session(path) if capture else self.device.session(path)
        except Exception as exc:  # a corrupted graph: onnxruntime's error types, or a UnicodeDecodeError
            if isinstance(exc, RuntimeError) and str(exc).startswith("--device"):  # our own, already clear
                raise
            raise load_error(path, f"variants.{self.variant}.{graph}", exc) from None
        check_session_io(path, session, graph, self.manifest)
        return session

    @property
    def provider(self) -> str:
        return self.device.provider

    @property
    def nbytes(self) -> int:
        return self.cache.nbytes(self.slots.n_live)

    def encode(self, request_ids: list[int], sources: list[list[int]]) -> tuple[dict[int, object], float]:
        """One encoder call for these sources: each one's cross K/V [(H, S, Dh) per layer and kind] by request id, for
        the engine to keep until its rows join (encode-ahead); and the seconds spent."""
        start = time.perf_counter()
        if getattr(self.cache, "device_resident", False):  # the outputs stay on the device until their rows join
            values, mask = run_encoder(self.encoder, self.device, self.pad_id, self.n_layers, sources)
            cross = {i: DeviceCross(values, n, int(mask[n].sum())) for n, i in enumerate(request_ids)}
            return cross, time.perf_counter() - start
        host, mask = self.run_encoder(sources)
        cross = {i: [np.ascontiguousarray(c[n, :, : int(mask[n].sum())]) for c in host]  # a copy: the batch is freed
                 for n, i in enumerate(request_ids)}
        return cross, time.perf_counter() - start

    def run_encoder(self, sources: list[list[int]]) -> tuple[list[np.ndarray], np.ndarray]:
        """Right-padded sources -> cross K/V per layer and kind (B, H, S, Dh) as host arrays, and the mask (B, S)."""
        cross, mask = run_encoder(self.encoder, self.device, self.pad_id, self.n_layers, sources)
        return [self.device.get(v) for v in cross], mask

    def admit(self, rows: Joining, cross: list) -> list[int]:
        """Rows (one cross K/V each: a beam request's beams share their source's) take the lowest free slots; their
        cross K/V move into the cache. Returns the slots they took."""
        if not len(rows):
            return []
        into = self.slots.free(len(rows))
        self.cache.admit(cross, into, empty=not self.slots.n_live)
        self.slots.place(rows, into)
        return into

    def retire(self, request_ids: list[int]) -> None:
        """Frees the rows of requests that left (the next step drops free slots or unused past columns if it pays:
        after this step's admissions, which take free slots first)."""
        freed = [s for i in request_ids for s in list(self.slots.slots_of(i))]
        for slot in freed:
            self.slots.release(slot)
        if freed:
            self.cache.release(freed)
            self._left = True
        if freed and not self.slots.n_live:  # nothing runs a next step soon: release the memory now
            self.cache.after_leave(self.slots)
            self._left = False

    def step(self) -> np.ndarray:
        """One decoder step for every stepped row: logits (hi, V) float32 for slots [0, hi); a free slot's are noise."""
        return self.run_step(Need.LOGITS).logits

    def run_step(self, need: Need) -> StepOutput:
        """One decoder step for every stepped row: what `need` asks for (step_output.py) of slots [0, hi), the logits
        when the decoder has no token-choice outputs; a free slot's rows are noise."""
        if self._left:  # only a leaving row can leave slots free or past columns unused
            self.cache.after_leave(self.slots)
            self._left = False
        need = need if self.token_choice else Need.LOGITS
        return self.cache.run(self.decoder, self.slots, need=need).head(self.slots.hi)

    def probe(self, rows: list[int]) -> None:
        """Runs the step for these slots alone, changing nothing: raises if one of them makes the graph fail."""
        self.cache.run(self.decoder, self.slots, np.asarray(rows, np.int64))

    def reorder(self, dst: np.ndarray, src: np.ndarray) -> None:
        """Beam search: rows dst continue from rows src (tokens so far and self K/V), right after a step; dst and src
        are disjoint beams of the same requests. Only the K/V columns written so far are copied, and for an int8
        graph the in-place cache skips the columns of the prefix the two beams share (SHARED_PREFIX_VARIANTS)."""
        if not len(dst):
            return
        columns = int(self.slots.length[src].max()) + 1  # the step just wrote column `length` from token `length`
        shared = (self.slots.shared_prefix(dst, src, columns) if self.variant in SHARED_PREFIX_VARIANTS
                  else np.zeros(len(dst), np.int64))  # (N,) read before the tokens are copied
        self.slots.copy_rows(dst, src)
        self.cache.reorder(dst, src, columns, shared)


def run_encoder(encoder, device: Device, pad_id: int, n_layers: int,
                sources: list[list[int]]) -> tuple[list, np.ndarray]:
    """Right-padded sources -> cross K/V per layer and kind (B, H, S, Dh) as OrtValues on the device, and the mask
    (B, S) (the runner and loadtest/graph_loop.py both encode through here)."""
    width = max(len(s) for s in sources)
    ids = np.full((len(sources), width), pad_id, np.int64)  # (B, S)
    mask = np.zeros((len(sources), width), np.int64)  # (B, S)
    for i, s in enumerate(sources):
        ids[i, : len(s)], mask[i, : len(s)] = s, 1
    binding = encoder.io_binding()
    binding.bind_cpu_input(names.INPUT_IDS, ids)
    binding.bind_cpu_input(names.ATTENTION_MASK, mask)
    for name in names.encoder_outputs(n_layers):
        binding.bind_output(name, device.ort_device)
    encoder.run_with_iobinding(binding)
    return binding.get_outputs(), mask
