"""The `graph-loop` benchmark row: the bundle's own ONNX graphs driven by a bare loop, the ceiling of the engine.

Static batches in input order: the encoder once per batch, then one decoder step for the whole batch at a time with
an argmax, until every row has produced the end token or max_new_tokens (a finished row is still stepped, as in
any static batch, but its later tokens are not counted). No scheduler, no slots, no detokenising, no metrics: the
engine row on the same graph and inputs minus this row is the engine's own overhead.

The decoder graph is the one the engine row runs (engine/runtime/runner.py's choose_cache):
  * in-place (decoder_inplace): one set of (B, H, max_len, Dh) K/V buffers per batch, each present output bound to
    its past input's memory, as export/ort_io.inplace_step drives it; one IO binding per batch, of which only ids and
    lengths change per step;
  * concat (decoder): each step's present K/V (past + one column) is fed back as the next step's past, as
    export/ort_io.decoder_feeds lays the inputs out, kept on the device as OrtValues.
min_new_tokens suppresses the end token before that many tokens, as the engine's option does.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort

from seqserve.contract import names
from seqserve.contract.manifest import load_manifest
from seqserve.engine.runtime.device import Device, RuntimeConfig
from seqserve.engine.runtime.runner import choose_cache, run_encoder

Step = Callable[[np.ndarray, int], np.ndarray]  # (last ids (B,), step t) -> logits (B, V)


class GraphLoop:
    def __init__(self, bundle: str | Path, variant: str = "fp32", runtime: RuntimeConfig = RuntimeConfig(),
                 kv_cache: str = "auto") -> None:
        bundle = Path(bundle)
        manifest = load_manifest(bundle)
        files = manifest.variants[variant]
        self.device = Device(runtime)
        self.encoder = self.device.session(bundle / files[names.ENCODER]["file"])
        self.kv_cache = choose_cache(kv_cache, files, self.device.ort_device)
        if self.kv_cache == names.KV_INPLACE and self.device.ort_device != "cpu":
            raise ValueError("the in-place graph loop runs on the CPU provider (as the engine's in-place cache)")
        self.graph = names.DECODER_INPLACE if self.kv_cache == names.KV_INPLACE else names.DECODER
        self.decoder = self.device.session(bundle / files[self.graph]["file"])
        cfg, special = manifest.model, manifest.special_tokens
        self.n_layers, self.heads = cfg["n_decoder_layers"], cfg["n_heads"]
        self.head_dim = names.head_dim(cfg)
        self.pad_id, self.eos_id = special["pad_id"], special["eos_id"]
        self.start_id = manifest.decoder_start_id  # the decoder's first input (Marian: <pad>, BART: </s>)
        self.max_len = int(manifest.max_new_tokens)  # the in-place buffers' length, as the engine allocates them

    @property
    def provider(self) -> str:
        return self.device.provider

    def generate(self, sources: list[list[int]], max_new_tokens: int, batch_size: int,
                 min_new_tokens: int = 0) -> list[list[int]]:
        """Generated ids per source (end token excluded), in input order."""
        if max_new_tokens > self.max_len:
            raise ValueError(f"max_new_tokens {max_new_tokens} exceeds the bundle's {self.max_len}")
        return [ids for i in range(0, len(sources), batch_size)
                for ids in self._batch(sources[i : i + batch_size], max_new_tokens, min_new_tokens)]

    def _batch(self, sources: list[list[int]], max_new_tokens: int, min_new_tokens: int) -> list[list[int]]:
        cross, src_mask = run_encoder(self.encoder, self.device, self.pad_id, self.n_layers, sources)
        step = self._inplace(cross, src_mask) if self.kv_cache == names.KV_INPLACE else self._concat(cross, src_mask)
        b = len(sources)
        out = np.zeros((b, max_new_tokens), np.int64)  # (B, T)
        lengths = np.full(b, max_new_tokens, np.int64)  # (B,) tokens before the end token
        ids = np.full(b, self.start_id, np.int64)  # (B,)
        for t in range(max_new_tokens):
            logits = step(ids, t)  # (B, V)
            if t < min_new_tokens:
                logits[:, self.eos_id] = -np.inf  # logits is this step's own output array
            ids = logits.argmax(axis=-1)  # (B,)
            out[:, t] = ids
            ended = (ids == self.eos_id) & (lengths == max_new_tokens)  # (B,) rows ending now
            lengths[ended] = t
            if (lengths < max_new_tokens).all():
                break
        return [row[:n].tolist() for row, n in zip(out, lengths)]

    def _inplace(self, cross: list[ort.OrtValue], src_mask: np.ndarray) -> Step:
        b = src_mask.shape[0]
        buffers = [np.zeros((b, self.heads, self.max_len, self.head_dim), np.float32)  # (B, H, L, Dh)
                   for _ in range(2 * self.n_layers)]
        binding = self.decoder.io_binding()
        binding.bind_output(names.LOGITS, "cpu")  # first: get_outputs()[0]
        binding.bind_cpu_input(names.ENCODER_ATTENTION_MASK, src_mask)
        for past, present, buf in zip(names.past_inputs(self.n_layers), names.present_outputs(self.n_layers), buffers):
            value = ort.OrtValue.ortvalue_from_numpy(buf)  # wraps buf: the step writes its column in place
            binding.bind_ortvalue_input(past, value)
            binding.bind_ortvalue_output(present, value)
        for name, value in zip(names.cross_inputs(self.n_layers), cross):
            binding.bind_ortvalue_input(name, value)

        def step(ids: np.ndarray, t: int) -> np.ndarray:
            binding.bind_cpu_input(names.DECODER_INPUT_IDS, ids.reshape(-1, 1))
            binding.bind_cpu_input(names.PAST_SEQ_LENS, np.full(b, t, np.int32))  # every row has t cached tokens
            binding.bind_cpu_input(names.TOTAL_SEQ_LEN, np.array(t + 1, np.int32))
            self.decoder.run_with_iobinding(binding)
            _ = buffers  # the bound memory lives as long as this step function
            return binding.get_outputs()[0].numpy()

        return step

    def _concat(self, cross: list[ort.OrtValue], src_mask: np.ndarray) -> Step:
        b = src_mask.shape[0]
        empty = np.zeros((b, self.heads, 0, self.head_dim), np.float32)  # (B, H, 0, Dh): no past yet
        past = [self.device.put(empty) for _ in range(2 * self.n_layers)]
        past_names, cross_names = names.past_inputs(self.n_layers), names.cross_inputs(self.n_layers)

        def step(ids: np.ndarray, t: int) -> np.ndarray:
            nonlocal past
            binding = self.decoder.io_binding()
            binding.bind_cpu_input(names.DECODER_INPUT_IDS, ids.reshape(-1, 1))
            binding.bind_cpu_input(names.POSITION_IDS, np.full((b, 1), t, np.int64))
            binding.bind_cpu_input(names.DECODER_ATTENTION_MASK, np.ones((b, t + 1), np.int64))  # (B, P+1)
            binding.bind_cpu_input(names.ENCODER_ATTENTION_MASK, src_mask)
            for name, value in zip(past_names + cross_names, past + cross):
                binding.bind_ortvalue_input(name, value)
            binding.bind_output(names.LOGITS, "cpu")
            for name in names.present_outputs(self.n_layers):
                binding.bind_output(name, self.device.ort_device)
            self.decoder.run_with_iobinding(binding)
            outputs = binding.get_outputs()
            past = outputs[1:]  # (B, H, t+1, Dh) each: the next step's past
            return outputs[0].numpy()

        return step
