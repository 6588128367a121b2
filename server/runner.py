"""Pure execution on onnxruntime: encode newly admitted sources once (batched), then one decoder step for all
running rows. Owns the KV cache. Every call goes through IO binding, so on CUDA the cache stays on the GPU and
only token ids, masks and logits cross the bus; on CPU the same path runs with CPU OrtValues.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seqserve.contract import names
from seqserve.contract.manifest import Manifest, check_session_io, load_manifest
from seqserve.server.device import Device, RuntimeConfig
from seqserve.server.kv_cache import KVCache
from seqserve.server.request import Request


@dataclass
class StepTimes:
    """Seconds spent in onnxruntime during one engine step (the metrics' encoder and decoder histograms)."""

    encode: float | None = None
    decode: float | None = None


class Runner:
    def __init__(self, bundle: str | Path, runtime: RuntimeConfig = RuntimeConfig(), variant: str = "fp32") -> None:
        self.bundle = Path(bundle)
        self.manifest: Manifest = load_manifest(self.bundle)
        if variant not in self.manifest.variants:
            raise ValueError(f"variant {variant!r} is not in {self.bundle} (has {sorted(self.manifest.variants)})")
        self.variant = variant
        self.device = Device(runtime)
        files = self.manifest.variants[variant]
        self.encoder = self._session(files["encoder"]["file"], "encoder")
        self.decoder = self._session(files["decoder"]["file"], "decoder")
        cfg = self.manifest.model
        self.pad_id = self.manifest.special_tokens["pad_id"]
        self.cache = KVCache(self.device, cfg["n_decoder_layers"], cfg["n_heads"], cfg["d_model"] // cfg["n_heads"])
        self.slots: list[Request | None] = []  # the cache's rows: a request, or None for a free slot
        n = cfg["n_decoder_layers"]
        self._past_names = [names.past_input(i, k) for i in range(n) for k in names.KINDS]
        self._cross_names = [names.cross_input(i, k) for i in range(n) for k in names.KINDS]
        self._present_names = [names.present_output(i, k) for i in range(n) for k in names.KINDS]

    def _session(self, file: str, graph: str):
        path = self.bundle / file
        session = self.device.session(path)
        check_session_io(path, session, graph, self.manifest)
        return session

    @property
    def provider(self) -> str:
        return self.device.provider

    @property
    def rows(self) -> list[Request]:
        """The live rows, in slot order."""
        return [r for r in self.slots if r is not None]

    def update(self, retired: list[Request], admitted: list[Request]) -> float | None:
        """Frees retired rows' slots, encodes admitted rows into free slots (or new ones), and shrinks the cache
        when it pays; returns the encoder's seconds (None if nothing was admitted)."""
        if retired:
            gone = {id(r) for r in retired}
            freed = [i for i, r in enumerate(self.slots) if r is not None and id(r) in gone]
            for i in freed:
                self.slots[i] = None
            self.cache.release(freed)
        seconds = None
        if admitted:
            start = time.perf_counter()
            cross, src_mask = self.encode([r.input_ids for r in admitted])
            free = [i for i, r in enumerate(self.slots) if r is None][: len(admitted)]
            self.cache.admit(cross, src_mask, free)
            for slot, request in zip(free, admitted):
                self.slots[slot] = request
            self.slots += admitted[len(free) :]
            seconds = time.perf_counter() - start
        if retired:  # only a leaving row can leave slots free or past columns unused; admitted rows fill slots first
            self._shrink()
        return seconds

    def _shrink(self) -> None:
        """Drops free slots once more than a quarter of the batch is free (nobody came to take them); otherwise
        only trims past columns no live row uses."""
        live = [i for i, r in enumerate(self.slots) if r is not None]
        if 4 * (len(self.slots) - len(live)) > len(self.slots):
            self.cache.compact(live)
            self.slots = [self.slots[i] for i in live]
        else:
            self.cache.trim()

    def encode(self, sources: list[list[int]]) -> tuple[list[np.ndarray], np.ndarray]:
        """Right-padded sources -> cross K/V per layer (B, H, S, Dh) as host arrays, and the mask (B, S)."""
        width = max(len(s) for s in sources)
        ids = np.full((len(sources), width), self.pad_id, np.int64)  # (B, S)
        mask = np.zeros((len(sources), width), np.int64)
        for i, s in enumerate(sources):
            ids[i, : len(s)], mask[i, : len(s)] = s, 1
        binding = self.encoder.io_binding()
        binding.bind_cpu_input(names.INPUT_IDS, ids)
        binding.bind_cpu_input(names.ATTENTION_MASK, mask)
        for name in names.encoder_outputs(self.cache.n_layers):
            binding.bind_output(name, self.device.ort_device)
        self.encoder.run_with_iobinding(binding)
        return [self.device.get(v) for v in binding.get_outputs()], mask

    def step(self, last_tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """One decoder step for every slot: (B,) last ids and (B,) absolute positions -> logits (B, V) float32.

        Free slots take any id and position (say pad and 0); their logits are meaningless and ignored."""
        step_mask = self.cache.step_mask()  # (B, P+1)
        binding = self.decoder.io_binding()
        binding.bind_cpu_input(names.DECODER_INPUT_IDS, np.ascontiguousarray(last_tokens.reshape(-1, 1)))
        binding.bind_cpu_input(names.POSITION_IDS, np.ascontiguousarray(positions.reshape(-1, 1)))
        binding.bind_cpu_input(names.DECODER_ATTENTION_MASK, step_mask)
        binding.bind_cpu_input(names.ENCODER_ATTENTION_MASK, self.cache.src_mask)
        for name, value in zip(self._past_names, self.cache.past):
            binding.bind_ortvalue_input(name, value)
        for name, value in zip(self._cross_names, self.cache.cross):
            binding.bind_ortvalue_input(name, value)
        binding.bind_output(names.LOGITS, "cpu")  # sampling happens on the host
        for name in self._present_names:
            binding.bind_output(name, self.device.ort_device)
        self.decoder.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        self.cache.advance(outputs[1:], step_mask)
        return outputs[0].numpy()
