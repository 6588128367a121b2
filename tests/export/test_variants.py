"""int8 and fp16 variants: the same contract as fp32, >= 99% top-1 agreement with fp32 (checked here independently,
with PyTorch's greedy tokens forced), their quality recorded in the manifest, and a lossy variant reported loudly."""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from seqserve.checks.quality import measure_quality
from seqserve.contract import names
from seqserve.contract.manifest import MANIFEST, Manifest, file_entry, load_manifest
from seqserve.contract.tsv import heldout_pairs
from seqserve.export.ort_io import cpu_session, decoder_feeds, encoder_feeds, inplace_step
from seqserve.model.checkpoint import load_checkpoint
from seqserve.model.decoding import greedy_decode, pad_batch


@pytest.fixture(scope="module")
def forced(full_bundle, tiny_checkpoint):
    """The fixed evaluation set (the tiny model's 200 held-out lines) and PyTorch's greedy tokens for it."""
    model, tok = load_checkpoint(tiny_checkpoint)
    max_new = load_manifest(full_bundle).max_new_tokens
    sources = [tok.encode(s).ids for s, _ in heldout_pairs(full_bundle, n=200)]
    tokens = [t for i in range(0, len(sources), 64) for t in greedy_decode(model, sources[i : i + 64], max_new)]
    targets = [t + [model.cfg.eos_id] if len(t) < max_new else t for t in tokens]
    return sources, targets, model.cfg


def teacher_forced_argmax(bundle, variant: str, sources, targets, cfg) -> list[np.ndarray]:
    """Plain onnxruntime sessions, present fed back as past; each row's argmax at its forced steps."""
    encoder, decoder = (cpu_session(bundle / names.graph_files(variant)[g]) for g in ("encoder", "decoder"))
    out = []
    for start in range(0, len(sources), 50):
        chunk, goal = sources[start : start + 50], targets[start : start + 50]
        ids, mask = (t.numpy() for t in pad_batch(chunk, cfg.pad_id))
        cross = encoder.run(None, encoder_feeds(ids, mask))
        b, width = len(chunk), max(len(t) for t in goal)
        inputs = np.full((b, width), cfg.pad_id, np.int64)
        inputs[:, 0] = cfg.bos_id
        for i, t in enumerate(goal):
            inputs[i, 1 : len(t)] = t[:-1]
        past = [np.zeros((b, cfg.n_heads, 0, cfg.head_dim), np.float32)] * (2 * cfg.n_decoder_layers)
        steps = []
        for t in range(width):
            result = decoder.run(None, decoder_feeds(inputs[:, t : t + 1], np.full((b, 1), t), np.ones((b, t + 1)),
                                                     mask, past, cross))
            steps.append(result[0].argmax(-1))
            past = result[1:]
        best = np.stack(steps, axis=1)
        out += [best[i, : len(goal[i])] for i in range(b)]
    return out


def teacher_forced_inplace_argmax(bundle, variant: str, sources, targets, cfg) -> list[np.ndarray]:
    """decoder_inplace through the reference driver (ort_io.inplace_step): every row's K/V written in place."""
    encoder = cpu_session(bundle / names.graph_files(variant)["encoder"])
    decoder = cpu_session(bundle / names.graph_files(variant)[names.DECODER_INPLACE])
    kv_dtype = np.float16 if variant == "fp16" else np.float32  # the manifest's kv_dtype (checked below)
    out = []
    for start in range(0, len(sources), 50):
        chunk, goal = sources[start : start + 50], targets[start : start + 50]
        ids, mask = (t.numpy() for t in pad_batch(chunk, cfg.pad_id))
        cross = [c.astype(kv_dtype) for c in encoder.run(None, encoder_feeds(ids, mask))]
        b, width = len(chunk), max(len(t) for t in goal)
        inputs = np.full((b, width), cfg.pad_id, np.int64)
        inputs[:, 0] = cfg.bos_id
        for i, t in enumerate(goal):
            inputs[i, 1 : len(t)] = t[:-1]
        kv = [np.zeros((b, cfg.n_heads, width, cfg.head_dim), kv_dtype) for _ in range(2 * cfg.n_decoder_layers)]
        best = np.stack([inplace_step(decoder, inputs[:, t : t + 1], np.full(b, t), mask, kv, cross).argmax(-1)
                         for t in range(width)], axis=1)
        out += [best[i, : len(goal[i])] for i in range(b)]
    return out


@pytest.mark.parametrize("variant", ["int8", "fp16"])
def test_inplace_top1_agreement_with_fp32_is_at_least_99_percent(full_bundle, forced, variant):
    """The same bar for decoder_inplace: each variant's in-place graph against the fp32 in-place graph, which
    itself follows PyTorch's greedy tokens at every forced step."""
    sources, targets, cfg = forced
    fp32 = teacher_forced_inplace_argmax(full_bundle, "fp32", sources, targets, cfg)
    got = teacher_forced_inplace_argmax(full_bundle, variant, sources, targets, cfg)
    steps = sum(len(a) for a in fp32)
    agree = sum(int((a == b).sum()) for a, b in zip(got, fp32)) / steps
    assert steps > 1000 and agree >= 0.99, f"{variant} decoder_inplace: {agree:.2%} of {steps} steps"
    assert all(np.array_equal(a, t) for a, t in zip(fp32, targets))


@pytest.mark.parametrize("variant", ["int8", "fp16"])
def test_top1_agreement_with_fp32_is_at_least_99_percent(full_bundle, forced, variant):
    sources, targets, cfg = forced
    fp32 = teacher_forced_argmax(full_bundle, "fp32", sources, targets, cfg)
    got = teacher_forced_argmax(full_bundle, variant, sources, targets, cfg)
    steps = sum(len(a) for a in fp32)
    agree = sum(int((a == b).sum()) for a, b in zip(got, fp32)) / steps
    assert steps > 1000 and agree >= 0.99, f"{variant}: {agree:.2%} of {steps} steps"
    # fp32 itself follows PyTorch's greedy tokens at every forced step (those tokens are its argmax)
    assert all(np.array_equal(a, t) for a, t in zip(fp32, targets))


def test_manifest_lists_variants_with_measured_quality(full_bundle):
    manifest = load_manifest(full_bundle)  # sha256 of every variant file checked here
    assert list(manifest.variants) == ["fp32", "int8", "fp16"]
    for name, variant in manifest.variants.items():
        assert {variant["encoder"]["file"], variant["decoder"]["file"],
                variant[names.DECODER_INPLACE]["file"]} == set(names.graph_files(name).values())
        assert variant["decoder"]["kv_cache"] == names.KV_CONCAT
        inplace = variant[names.DECODER_INPLACE]
        assert inplace["kv_cache"] == names.KV_INPLACE and inplace["max_len"] == manifest.model["max_positions"]
        assert inplace["kv_dtype"] == ("float16" if name == "fp16" else "float32")
        assert inplace["contrib_ops"] == ["GroupQueryAttention", "MultiHeadAttention"]
        q = variant["quality"]
        assert q["n"] == 200 and q["split"] == "heldout.tsv" and q["nan_free"] is True
        assert 0.9 <= q["exact_match"] <= 1.0 and "warning" not in q
        if name != "fp32":
            assert q["top1_agreement"] >= 0.99 and q["top1_steps"] > 1000
            assert q["exact_match_drop_points"] == pytest.approx(
                100 * (manifest.variants["fp32"]["quality"]["exact_match"] - q["exact_match"]), abs=1e-3)
    cpu = manifest.variants["fp16"]["quality"]["cpu_provider"]
    assert cpu["runs"] is True and set(cpu["kernels"]) == {"float16", "float32"}
    assert ("note" in cpu) == bool(cpu["kernels"]["float32"])  # ops cast back to float32 on CPU are said so


def test_variants_keep_float32_io(full_bundle):
    for variant in ("int8", "fp16"):
        for graph in ("encoder", "decoder"):
            ref = cpu_session(full_bundle / names.graph_files("fp32")[graph])
            got = cpu_session(full_bundle / names.graph_files(variant)[graph])
            assert [(v.name, v.type) for v in got.get_inputs() + got.get_outputs()] == \
                   [(v.name, v.type) for v in ref.get_inputs() + ref.get_outputs()]


def test_inplace_variants_keep_float32_io_except_fp16_kv_buffers(full_bundle):
    """int8 decoder_inplace keeps every type; fp16 has float16 K/V (past and present are one buffer, so no Cast may
    sit between them) and float32 logits; ids, lengths and masks keep their integer types everywhere."""
    ref = cpu_session(full_bundle / names.graph_files("fp32")[names.DECODER_INPLACE])
    want = [(v.name, v.type) for v in ref.get_inputs() + ref.get_outputs()]
    n = (len(ref.get_outputs()) - 1) // 2  # present K and V per layer after the logits
    kv = set(names.past_inputs(n) + names.cross_inputs(n) + names.present_outputs(n))
    for variant, kv_type in (("int8", "tensor(float)"), ("fp16", "tensor(float16)")):
        got = cpu_session(full_bundle / names.graph_files(variant)[names.DECODER_INPLACE])
        choice = [(name, "tensor(float)" if name == names.TOP_LOGPROBS else "tensor(int64)")
                  for name in names.TOKEN_CHOICE_OUTPUTS] if variant == "fp16" else []  # the CUDA graph's
        assert [(v.name, v.type) for v in got.get_inputs() + got.get_outputs()] == \
               [(name, kv_type if name in kv else t) for name, t in want] + choice
    assert dict(want)[names.LOGITS] == "tensor(float)" and dict(want)[names.PAST_SEQ_LENS] == "tensor(int32)"


def test_lossy_variant_is_reported_loudly(full_bundle, tmp_path, capsys):
    """A variant whose weights are badly damaged must show up as a warning on stderr and in its quality entry."""
    bundle = tmp_path / "lossy"
    shutil.copytree(full_bundle, bundle)
    data = json.loads((bundle / MANIFEST).read_text())
    rng = np.random.default_rng(0)
    for graph in ("decoder", names.DECODER_INPLACE):  # both decoder graphs: the engine may run either
        path = bundle / names.graph_files("int8")[graph]
        model = onnx.load(str(bundle / names.graph_files("fp32")[graph]))
        for init in model.graph.initializer:
            w = numpy_helper.to_array(init)
            if w.dtype == np.float32 and w.size > 1:
                init.CopyFrom(numpy_helper.from_array(w + rng.standard_normal(w.shape).astype(np.float32), init.name))
        onnx.save(model, str(path))
        data["variants"]["int8"][graph] |= file_entry(bundle, path.name)
    Manifest(**data).save(bundle)  # manifest.json and its digest (bundle.sha256)
    quality = measure_quality(bundle, ["int8"], n=40, progress=False)
    assert "loses" in quality["int8"]["warning"] and quality["int8"]["exact_match_drop_points"] > 1
    assert "WARNING: variant int8 loses" in capsys.readouterr().err
    assert "warning" not in quality["fp32"]
