"""onnxruntime against PyTorch on held-out inputs: the part of `seqserve verify` that needs torch and the checkpoint.

PyTorch is the oracle: encoder outputs, every decoder step fed PyTorch's own past, cached ORT steps against one
full causal forward (teacher forcing), and the engine's greedy tokens against model.decoding.greedy_decode (a row
may diverge only at a near-tie of the reference's logits: checks/greedy_match.py).
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from seqserve.checks.greedy_match import match_row, summarise
from seqserve.checks.quality import BATCH, CPU, forced_targets, generate, teacher_forced
from seqserve.checks.table import Check
from seqserve.contract import names
from seqserve.contract.manifest import load_manifest
from seqserve.contract.tsv import heldout_pairs
from seqserve.engine.runtime.device import RuntimeConfig
from seqserve.engine.runtime.runner import Runner
from seqserve.export import ort_io
from seqserve.model.checkpoint import load_checkpoint
from seqserve.model.config import ModelConfig
from seqserve.model.decoding import apply_generation_rules, greedy_decode, pad_batch
from seqserve.server.model_defaults import default_max_new_tokens

PARITY_N = 256  # held-out lines compared with PyTorch
# Sources for a bundle without a held-out split (an imported model): scripts, digits, odd whitespace, one letter.
PROBE_TEXTS = ("Hello world.", "The quick brown fox jumps over the lazy dog.", "Zwölf Boxkämpfer jagen Viktor.",
               "¿Dónde está la parada del autobús?", "1234 5678", "naïve café — déjà vu", "  spaced   out  ", "a",
               "Один, два, три.", "東京は日本の首都です。", "x" * 40, "The end.")
ATOL = RTOL = 1e-4
LIMIT = f"atol=rtol={ATOL:g}"
TIE_LIMIT = f"equal, but at a tie: margin <= {ATOL:g} + {RTOL:g}*|logit|"


class MaxDiff:
    """Running max |ort - torch| per output name, and whether any element broke |d| <= atol + rtol * |torch|."""

    def __init__(self) -> None:
        self.max: dict[str, float] = defaultdict(float)
        self.broken: dict[str, bool] = defaultdict(bool)

    def add(self, name: str, got: np.ndarray, want: torch.Tensor | np.ndarray) -> None:
        want = want.detach().numpy() if isinstance(want, torch.Tensor) else want
        diff = np.abs(got.astype(np.float64) - want)
        if diff.size:
            self.max[name] = max(self.max[name], float(np.nan_to_num(diff, nan=np.inf).max()))
        self.broken[name] |= bool(~(diff <= ATOL + RTOL * np.abs(want)).all())  # NaN breaks it too

    def rows(self, check: str) -> list[Check]:
        return [Check(check, name, f"max |diff| {self.max[name]:.2e}", LIMIT, not self.broken[name])
                for name in self.max]


@torch.no_grad()
def torch_parity(bundle: Path, checkpoint: Path, n: int, runtime: RuntimeConfig = CPU) -> list[Check]:
    model, tok = load_checkpoint(checkpoint)
    manifest = load_manifest(bundle)
    rows = [_weights_finite(model, checkpoint)]
    if model.cfg != ModelConfig.from_dict(manifest.model):  # a bundle from before an option existed has its default
        return rows + [Check("checkpoint matches bundle", str(checkpoint), "model config differs", "equal", False)]
    texts = [s for s, _ in heldout_pairs(bundle, n)] or list(PROBE_TEXTS)  # an imported model has no held-out split
    sources = [tok.encode(s).ids[: model.cfg.max_positions] for s in texts]
    max_new = decode_length(manifest)
    encoder, decoder = ort_io.cpu_session(bundle / names.ENCODER_FILE), ort_io.cpu_session(bundle / names.DECODER_FILE)
    runners = [Runner(bundle, runtime, "fp32", kv_cache=kind) for kind in _kv_caches(manifest, runtime)]
    engine = {r.kv_cache: forced_targets(generate(r, tok, sources, max_new), model.cfg.eos_id) for r in runners}
    enc, step, forced = MaxDiff(), MaxDiff(), {r.kv_cache: MaxDiff() for r in runners}
    matches: dict[str, list] = {r.kv_cache: [] for r in runners}
    for start in range(0, len(sources), BATCH):
        chunk = sources[start : start + BATCH]
        ids, mask = pad_batch(chunk, model.cfg.pad_id)  # (B, S) with padded rows
        cross = model.cross_kv(model.encode(ids, mask))
        for name, got, want in zip(names.encoder_outputs(model.cfg.n_decoder_layers),
                                   encoder.run(None, ort_io.encoder_feeds(ids.numpy(), mask.numpy())),
                                   [t for kv in cross for t in kv]):
            enc.add(name, got, want)
        tokens = greedy_decode(model, chunk, max_new, generation=manifest.generation)
        targets = [t + [model.cfg.eos_id] if len(t) < max_new else t for t in tokens]
        inputs = _forced_inputs(targets, model.cfg)  # (B, T)
        _decoder_steps(model, decoder, inputs, mask, cross, step)
        full, _ = model.decode(inputs, torch.arange(inputs.shape[1]).expand_as(inputs), torch.ones_like(inputs),
                               mask, cross)  # (B, T, V) one causal forward
        ruled = _ruled(full, max_new, manifest.generation).numpy()  # (B, T, V) what greedy_decode took argmaxes of
        for runner in runners:
            _, ort_logits = next(teacher_forced(runner, chunk, targets, batch_size=len(chunk)))
            for i, target in enumerate(targets):
                forced[runner.kv_cache].add(names.LOGITS, ort_logits[i, : len(target)], full[i, : len(target)])
                matches[runner.kv_cache].append(match_row(engine[runner.kv_cache][start + i], target,
                                                          ruled[i, : len(target)], ATOL, RTOL))
    rows += enc.rows("encoder vs torch") + step.rows("decoder step vs torch")
    for runner in runners:  # both decoder graphs the bundle carries, each through the engine with its own cache
        graph = f"{runner.cache.graph}.onnx, {runner.kv_cache} KV cache, {runner.provider}"
        rows += forced[runner.kv_cache].rows(f"teacher forcing: cached steps ({graph}) vs torch forward")
        value, ok = summarise(matches[runner.kv_cache], max_new)
        rows.append(Check(f"greedy tokens: engine ({graph}) vs torch", "fp32", value, TIE_LIMIT, ok))
    return rows


def decode_length(manifest) -> int:
    """The model's own max_new_tokens (its generation default) within the bundle's limit, else that limit."""
    return min(default_max_new_tokens(manifest.generation) or manifest.max_new_tokens, manifest.max_new_tokens)


def _weights_finite(model, checkpoint: Path) -> Check:
    """NaN or infinite weights can still give equal tokens on both sides (argmax of NaN): refuse them outright."""
    bad = {name: int((~torch.isfinite(w)).sum()) for name, w in model.state_dict().items()
           if w.is_floating_point() and not bool(torch.isfinite(w).all())}
    value = "finite" if not bad else f"{sum(bad.values())} non-finite values in {', '.join(sorted(bad)[:3])}" + (
        f" and {len(bad) - 3} more tensors" if len(bad) > 3 else "")
    return Check("checkpoint weights finite", str(checkpoint), value, "finite", not bad)


def _ruled(logits: torch.Tensor, max_new_tokens: int, generation: dict) -> torch.Tensor:
    """(B, T, V) logits with the model's token rules applied at each step, as greedy_decode applies them."""
    ruled = logits.clone()
    if generation:
        for t in range(ruled.shape[1]):
            apply_generation_rules(ruled[:, t], t, max_new_tokens, generation)
    return ruled


def _kv_caches(manifest, runtime: RuntimeConfig) -> list[str]:
    """The plain graph always; the in-place one when the bundle has it and the engine would run it (CPU provider)."""
    has = names.DECODER_INPLACE in manifest.variants["fp32"]
    return ["concat"] + (["inplace"] if has and runtime.device == "cpu" else [])


def _forced_inputs(targets: list[list[int]], cfg) -> torch.Tensor:
    """(B, T) decoder inputs: BOS, then each row's targets shifted right, padding after its end."""
    inputs = torch.full((len(targets), max(len(t) for t in targets)), cfg.pad_id, dtype=torch.int64)
    inputs[:, 0] = cfg.decoder_start_id
    for i, target in enumerate(targets):
        inputs[i, 1 : len(target)] = torch.tensor(target[:-1], dtype=torch.int64)
    return inputs


def _decoder_steps(model, decoder, inputs: torch.Tensor, src_mask: torch.Tensor, cross, diffs: MaxDiff) -> None:
    """Every step of decoder.onnx fed exactly PyTorch's inputs (its past included) against PyTorch's step."""
    b, steps = inputs.shape
    cfg = model.cfg
    flat_cross = [t.numpy() for kv in cross for t in kv]
    past = [(torch.zeros(b, cfg.n_heads, 0, cfg.head_dim),) * 2 for _ in range(cfg.n_decoder_layers)]
    out_names = names.decoder_outputs(cfg.n_decoder_layers)
    for t in range(steps):
        ids, positions = inputs[:, t : t + 1], torch.full((b, 1), t, dtype=torch.int64)  # (B, 1)
        self_mask = torch.ones((b, t + 1), dtype=torch.int64)  # (B, P+1)
        logits, present = model.decode(ids, positions, self_mask, src_mask, cross, past, causal=False)
        feeds = ort_io.decoder_feeds(ids.numpy(), positions.numpy(), self_mask.numpy(), src_mask.numpy(),
                                     [x.numpy() for kv in past for x in kv], flat_cross)
        want = [logits[:, -1]] + [x for kv in present for x in kv]
        for name, got, expected in zip(out_names, decoder.run(None, feeds), want):
            diffs.add(name, got, expected)
        past = present
