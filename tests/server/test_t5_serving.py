"""T5 v1.0, Flan-T5 (T5 v1.1) and mT5 served token for token as transformers generates them.

For each: a random-weight directory built with transformers' own class (tests/hf_t5.py) goes through `seqserve
import` (logits against transformers), `seqserve export --int8 --fp16` (each variant's top-1 agreement measured),
`seqserve verify --checkpoint --hf` and a real gRPC server; over 50 real sentences (half with the "summarize: "
prefix) the served ids equal `model.generate`'s, greedy and beam 4 with its n-best, with the model's defaults and with
explicit options. Rows joining the batch at different steps (so at different decoder positions, each with its own
relative position bias) get, step by step, the logits each gets alone, through both decoder graphs.
"""
from __future__ import annotations

import json

import hf_fixtures
import hf_t5
import numpy as np
import pytest
from grpc_harness import Served
from row_alone import Alone
from test_hf_serving import _beam_4_n_best_equals_transformers, _hf, _served

from seqserve.cli.main import main
from seqserve.contract import names
from seqserve.contract.quality import MIN_TOP1
from seqserve.engine.runtime.device import RuntimeConfig
from seqserve.engine.runtime.runner import Runner
from seqserve.engine.runtime.slots import Joining
from seqserve.export.ort_io import cpu_session
from seqserve.server import settings as st
from seqserve.v1 import seqserve_pb2 as pb

pytest.importorskip("transformers")
N_SENTENCES, MAX_NEW = 50, 16


@pytest.fixture(scope="module", params=sorted(hf_t5.SIZES))
def family(request, tmp_path_factory):
    """(kind, HF directory, bundle, the served bundle's server, the HF model, its transformers tokenizer)."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    root = tmp_path_factory.mktemp(request.param)
    hf_dir = hf_t5.build(request.param, root / "hf")
    checkpoint, bundle = root / "checkpoint", root / "bundle"
    assert main(["import", str(hf_dir), "--out", str(checkpoint), "--quiet"]) == 0
    assert main(["export", str(checkpoint), "--out", str(bundle), "--int8", "--fp16", "--quiet"]) == 0
    assert main(["verify", str(bundle), "--checkpoint", str(checkpoint), "--hf", str(hf_dir), "--quiet",
                 "--threads", "1"]) == 0
    model = AutoModelForSeq2SeqLM.from_pretrained(str(hf_dir)).eval()
    server = Served(bundle).wait_ready()
    yield request.param, hf_dir, bundle, server, model, AutoTokenizer.from_pretrained(str(hf_dir))
    server.stop()


@pytest.fixture(scope="module")
def sentences():
    """Real sentences the tokenizer was not trained on, every other one with T5's summarisation prefix."""
    unseen = [s for s in hf_fixtures.real_strings()[1::2] if s.strip()]
    picked = unseen[:: max(1, len(unseen) // N_SENTENCES)][:N_SENTENCES]
    return [hf_t5.SUMMARIZE + s if i % 2 else s for i, s in enumerate(picked)]


def test_the_imported_config_is_t5s(family):
    """What the import read: relative positions, RMS norm, no biases, unscaled attention; v1.0 relu with a scaled tied
    output, v1.1 and mT5 gated-gelu with an untied head and no output scale; Flan's n_heads * d_kv != d_model."""
    kind, _, bundle, *_ = family
    model = json.loads((bundle / "manifest.json").read_text())["model"]
    assert (model["positions"], model["norm"], model["bias"], model["scale_attention"]) == ("relative", "rms", False,
                                                                                          False)
    v1 = kind == hf_t5.T5
    assert (model["activation"], model["gated_ffn"], model["tie_output"], model["scale_output"]) == (
        ("relu", False, True, True) if v1 else ("gelu_tanh", True, False, False))
    assert (model["n_heads"] * model["d_kv"] != model["d_model"]) == (kind == hf_t5.FLAN)


def test_greedy_token_ids_and_text_equal_transformers(family, sentences):
    _, _, _, server, model, tok = family
    served = _served(server, sentences, num_beams=1, max_new_tokens=MAX_NEW)
    for text, got in zip(sentences, served):
        (want,) = _hf(model, tok(text).input_ids, num_beams=1, max_new_tokens=MAX_NEW, do_sample=False)
        assert list(got.token_ids) == want, text
        assert got.text == tok.decode(want, skip_special_tokens=True)
    assert len({tuple(r.token_ids) for r in served}) > len(sentences) // 2  # outputs depend on the source


def test_beam_4_n_best_equals_transformers(family, sentences):
    _, _, _, server, model, tok = family
    _beam_4_n_best_equals_transformers(server, model, tok, sentences, MAX_NEW)


def test_defaults_explicit_options_and_task_prefixes(family, sentences):
    """generation_config.json's num_beams and max_length are what an unset request gets (transformers' generate()
    without options uses them); explicit options override them; GetModelInfo shows the task prefixes."""
    _, hf_dir, _, server, model, tok = family
    info = server.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    tasks = json.loads((hf_dir / "config.json").read_text())["task_specific_params"]
    assert info.config["task.summarization.prefix"].string_value == tasks["summarization"]["prefix"] == "summarize: "
    assert info.config["task.translation_en_to_de.prefix"].string_value == "translate English to German: "
    assert info.config["generation.num_beams"].int_value == 4
    texts = sentences[:8]
    for text, got in zip(texts, _served(server, texts)):
        assert list(got.token_ids) == _hf(model, tok(text).input_ids)[0]
    explicit = dict(num_beams=3, length_penalty=0.5, min_new_tokens=4, max_new_tokens=9)
    for text, got in zip(texts, _served(server, texts, **explicit)):
        assert list(got.token_ids) == _hf(model, tok(text).input_ids, do_sample=False, **explicit)[0]


@pytest.mark.parametrize("kv_cache", ["concat", "inplace"])
def test_rows_at_different_positions_equal_each_row_alone(family, sentences, kv_cache):
    """Rows admitted at steps 0, 2, 5 and 9 sit at different decoder positions in every later step: each row's
    logits equal that row decoded alone by the plain graph (its own relative position bias in the batch)."""
    _, _, bundle, _, _, tok = family
    runner = Runner(bundle, RuntimeConfig(device="cpu"), kv_cache=kv_cache)
    cfg = runner.manifest.model
    encoder, decoder = cpu_session(bundle / names.ENCODER_FILE), cpu_session(bundle / names.DECODER_FILE)
    shape = dict(heads=cfg["n_heads"], head_dim=names.head_dim(cfg), layers=cfg["n_decoder_layers"],
                 bos=runner.manifest.decoder_start_id)
    rows = [Alone(encoder, decoder, tok(text).input_ids, **shape) for text in sentences[:4]]
    joins = {0: rows[0], 2: rows[1], 5: rows[2], 9: rows[3]}
    live = []
    for t in range(14):
        if t in joins:
            r = joins[t].request
            cross, _ = runner.encode([r.id], [r.input_ids])
            runner.admit(Joining.of([r]), [cross[r.id]])
            live.append(joins[t])
        logits = runner.step()  # (hi, V)
        chosen = np.zeros(runner.slots.hi, np.int64)
        for i, owner in enumerate(runner.slots.owners[: runner.slots.hi]):
            row = next(row for row in live if row.request.id == owner)
            want = row.step()
            np.testing.assert_allclose(logits[i], want, atol=1e-4, rtol=0)
            chosen[i] = int(want.argmax())
            row.output_ids.append(chosen[i])
        runner.slots.append(chosen, runner.slots.live[: runner.slots.hi])
    assert [len(r.output_ids) for r in rows] == [14, 12, 9, 5]


def test_variant_quality_is_recorded_and_a_variant_below_the_bar_is_refused(family, make_server):
    """fp16 keeps >= 99% top-1 agreement with fp32; the random tiny model's int8 does not, and the server refuses to
    serve it, naming the figure."""
    _, _, bundle, *_ = family
    variants = json.loads((bundle / "manifest.json").read_text())["variants"]
    assert variants["fp16"]["quality"]["top1_agreement"] >= MIN_TOP1 and variants["fp16"]["quality"]["nan_free"]
    int8 = variants["int8"]["quality"]
    assert int8["top1_agreement"] < MIN_TOP1 and int8["top1_steps"] > 500
    with pytest.raises(st.SettingsError) as info:
        make_server(bundle=bundle, variant="int8")
    assert f"top-1 agreement with fp32 is {int8['top1_agreement']:.2%}" in str(info.value)
    assert make_server(bundle=bundle, variant="fp16").stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).variant \
        == "fp16"


def test_seeded_sampling_is_the_same_alone_and_in_a_batch(family, sentences):
    """Per-request sampling over rows at different positions: each source's samples alone equal its samples inside
    one batch of eight, and differ from greedy."""
    _, _, _, server, _, _ = family
    sampling = dict(num_beams=1, temperature=1.5, top_k=50, seed=7, max_new_tokens=MAX_NEW)
    texts = sentences[:8]
    alone = [_served(server, [text], **sampling)[0].token_ids for text in texts]
    assert [r.token_ids for r in _served(server, texts, **sampling)] == alone
    assert alone != [r.token_ids for r in _served(server, texts, num_beams=1, max_new_tokens=MAX_NEW)]
