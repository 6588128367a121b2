"""Hugging Face Marian and BART models served token for token as transformers generates them.

For each family: a random-weight model of a small config with a tokenizer trained here, saved with save_pretrained,
goes through `seqserve import` (which compares its logits with transformers'), `seqserve export --int8`,
`seqserve verify --checkpoint --hf` and a real gRPC server; over 100 real sentences the served token ids equal
transformers' own `generate` (greedy, and beam 4 with its n-best) and the text equals the tokenizer's decode.
"""
from __future__ import annotations

import json
import subprocess
import sys

import hf_fixtures
import pytest
import torch
from grpc_harness import Served

from seqserve.cli.main import main
from seqserve.v1 import seqserve_pb2 as pb

pytest.importorskip("transformers")
N_SENTENCES, MAX_NEW = 100, 16
FAMILIES = {name: build for name, build in hf_fixtures.BUILDERS.items() if name not in hf_fixtures.MULTILINGUAL}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    """(name, HF directory, the served bundle's server, the HF model, the model's own transformers tokenizer)."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    root = tmp_path_factory.mktemp(request.param)
    hf_dir = FAMILIES[request.param](root / "hf")
    if request.param == "marian":
        _favour_pad(hf_dir)
    checkpoint, bundle = root / "checkpoint", root / "bundle"
    assert main(["import", str(hf_dir), "--out", str(checkpoint), "--quiet"]) == 0
    assert main(["export", str(checkpoint), "--out", str(bundle), "--int8", "--quiet"]) == 0
    assert main(["verify", str(bundle), "--checkpoint", str(checkpoint), "--hf", str(hf_dir), "--quiet",
                 "--threads", "1"]) == 0
    model = AutoModelForSeq2SeqLM.from_pretrained(str(hf_dir)).eval()
    server = Served(bundle).wait_ready()
    yield request.param, hf_dir, server, model, AutoTokenizer.from_pretrained(str(hf_dir))
    server.stop()


def _favour_pad(hf_dir) -> None:
    """Raises <pad>'s final_logits_bias so that it would win some steps: generation_config's bad_words_ids=[[pad]]
    (opus-mt's) must ban it, or the served ids differ from transformers'."""
    from safetensors.torch import load_file, save_file

    pad = json.loads((hf_dir / "config.json").read_text())["pad_token_id"]
    weights = load_file(str(hf_dir / "model.safetensors"))
    weights["final_logits_bias"][0, pad] = 5.6  # its embedding row is zero, so this is its logit: near the top
    save_file(weights, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def sentences():
    """Real sentences the tokenizers were not trained on (English docstring lines, number words in four languages,
    odd whitespace and unicode)."""
    unseen = [s for s in hf_fixtures.real_strings()[1::2] if s.strip()]
    return unseen[:: max(1, len(unseen) // N_SENTENCES)][:N_SENTENCES]


def _hf(model, ids: list[int], **options) -> list[list[int]]:
    """transformers' generate for one source: each returned sequence without the start token, end token and pads."""
    eos = model.generation_config.eos_token_id
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             **options)
    rows = []
    for row in out.tolist():
        row = row[1:]
        rows.append(row[: row.index(eos)] if eos in row else row)
    return rows


def _served(server, texts: list[str], **options) -> list[pb.GenerateResponse]:
    results = []
    for start in range(0, len(texts), 50):  # within max_batch_inputs
        reply = server.stub.GenerateBatch(pb.GenerateBatchRequest(inputs=texts[start: start + 50],
                                                                  options=pb.DecodingOptions(**options)), timeout=120)
        results += reply.results
    return results


def test_greedy_token_ids_and_text_equal_transformers(family, sentences):
    name, _, server, model, tok = family
    served = _served(server, sentences, num_beams=1, max_new_tokens=MAX_NEW)
    ended_by_eos = banned_was_best = 0
    generation = model.generation_config
    for text, got in zip(sentences, served):
        ids = tok(text).input_ids
        (want,) = _hf(model, ids, num_beams=1, max_new_tokens=MAX_NEW, do_sample=False)
        assert list(got.token_ids) == want, text
        assert got.text == tok.decode(want, skip_special_tokens=True)
        ended_by_eos += got.finish_reason == pb.FINISH_REASON_EOS
        if generation.bad_words_ids:  # the rule is exercised: the raw logits' best token was the banned one
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ids]),
                               decoder_input_ids=torch.tensor([[generation.decoder_start_token_id] + want])).logits
            banned_was_best += int((logits[0].argmax(-1) == generation.bad_words_ids[0][0]).sum())
    assert ended_by_eos == len(sentences)  # every row ends with the end token: forced at max_new_tokens if not before
    if name == "marian":  # bad_words_ids=[[<pad>]] (opus-mt's): <pad> would have won at some steps
        assert banned_was_best > 0
    else:  # forced_bos_token_id (bart-large-cnn's): every output starts with <s>
        assert all(r.token_ids[0] == generation.forced_bos_token_id for r in served)


def _beam_4_n_best_equals_transformers(server, model, tok, sentences, max_new: int) -> None:
    """Served beam-4 n-best ids and texts equal transformers' generate and decode (the T5 tests share this)."""
    served = _served(server, sentences, num_beams=4, num_return_sequences=4, max_new_tokens=max_new)
    for text, got in zip(sentences, served):
        want = _hf(model, tok(text).input_ids, num_beams=4, num_return_sequences=4, max_new_tokens=max_new,
                   do_sample=False)
        assert [list(s.token_ids) for s in got.sequences] == want, text
        assert [s.text for s in got.sequences] == [tok.decode(w, skip_special_tokens=True) for w in want]


def test_beam_4_n_best_equals_transformers(family, sentences):
    name, _, server, model, tok = family
    _beam_4_n_best_equals_transformers(server, model, tok, sentences, MAX_NEW)


def test_the_models_generation_defaults_are_served_and_shown(family, sentences):
    """generation_config.json's num_beams, max_length and length_penalty are what an unset request gets, as
    transformers' generate() without options uses them; GetModelInfo shows them; a request overrides them."""
    name, hf_dir, server, model, tok = family
    generation = json.loads((hf_dir / "generation_config.json").read_text())
    info = server.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert info.config["generation.num_beams"].int_value == generation["num_beams"] == 4
    assert info.limits.default_max_new_tokens == generation["max_length"] - 1
    texts = sentences[:8]
    for text, got in zip(texts, _served(server, texts)):
        (want,) = _hf(model, tok(text).input_ids)  # all of generation_config's defaults
        assert list(got.token_ids) == want
    (one,) = _served(server, texts[:1], num_beams=1, max_new_tokens=5)
    assert list(one.token_ids) == _hf(model, tok(texts[0]).input_ids, num_beams=1, max_new_tokens=5)[0]


def test_a_stream_says_what_transformers_decodes(family, sentences):
    name, _, server, model, tok = family
    for text in sentences[:5]:
        pieces = list(server.stub.GenerateStream(pb.GenerateRequest(
            input=text, options=pb.DecodingOptions(num_beams=1, max_new_tokens=MAX_NEW)), timeout=60))
        (want,) = _hf(model, tok(text).input_ids, num_beams=1, max_new_tokens=MAX_NEW, do_sample=False)
        assert [t for p in pieces for t in p.token_ids] == want
        assert "".join(p.text for p in pieces) == tok.decode(want, skip_special_tokens=True)


def test_sampling_never_returns_the_models_banned_or_special_ids(family, sentences):
    """Special ids sit where the model has them (Marian: <pad> last, </s> 0), and bad_words_ids hold for sampling."""
    name, hf_dir, server, model, tok = family
    config = json.loads((hf_dir / "config.json").read_text())
    never = {config["pad_token_id"], tok.unk_token_id} | {
        t for seq in (model.generation_config.bad_words_ids or []) for t in seq}
    served = _served(server, sentences[:30], num_beams=1, temperature=1.5, seed=1, max_new_tokens=MAX_NEW)
    produced = [t for r in served for t in r.token_ids]
    assert len(produced) > 100 and not never & set(produced)


def test_a_forced_end_token_wins_over_min_new_tokens(family, sentences):
    """min_new_tokens = max_new_tokens: transformers' MinLength processor masks the end token and ForcedEOS then
    forces it at the last step; the served ids are the same, greedy and beam."""
    name, _, server, model, tok = family
    text = sentences[0]
    for beams in (1, 4):
        (got,) = _served(server, [text], num_beams=beams, min_new_tokens=6, max_new_tokens=6)
        (want,) = _hf(model, tok(text).input_ids, num_beams=beams, min_new_tokens=6, max_new_tokens=6,
                      do_sample=False)
        assert list(got.token_ids) == want and len(want) == 5


def test_serving_an_imported_model_loads_no_torch_transformers_or_sentencepiece(family):
    """The server's own loading of an imported bundle (sessions, tokenizer, engine, warm-up) in a fresh process."""
    bundle = family[2].app.settings.bundle
    code = ("import sys\n"
            "from seqserve.server import settings as st\n"
            "from seqserve.server.app import App\n"
            "from seqserve.server.repository import scan\n"
            f"app = App(st.Settings(bundle={str(bundle)!r}, intra_op_threads=1))\n"
            "(source,) = scan(app.settings).values()\n"
            "core = app._load(source, 1, 0).engine\n"
            "core.stop()\n"
            "kinds = {type(r).__name__ for r in core.engine.rules.rules}\n"
            "assert {'BadWords', 'ForcedBOS', 'ForcedEOS'} & kinds  # the model's token rules are in force\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'sentencepiece'))\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
