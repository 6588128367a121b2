"""Multilingual Hugging Face models (M2M100, NLLB, mBART-50) served with per-request languages (issue 19).

For each family: a random-weight model with a tokenizer trained here (tests/hf_fixtures.py) goes through
`seqserve import` (which compares its logits with transformers'), `seqserve export`, `seqserve verify --checkpoint
--hf` and a real gRPC server. For 3 target languages x 50 real sentences, the served token ids equal transformers'
`generate` with the tokenizer's src_lang set and forced_bos_token_id = the target language's token, greedy and beam
4 (with its n-best), and the text equals the tokenizer's decode(skip_special_tokens=True). Rows of different
languages share one running batch and each equals that request served alone; missing, unknown and unexpected
languages answer INVALID_ARGUMENT naming the field.
"""
from __future__ import annotations

import json
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import grpc
import hf_fixtures
import pytest
import torch
from grpc_harness import Served, wait_for

from seqserve.cli.main import main
from seqserve.model.config import ModelConfig
from seqserve.v1 import seqserve_pb2 as pb

pytest.importorskip("transformers")
N_PER_LANGUAGE, MAX_NEW = 50, 12


@pytest.fixture(scope="module", params=hf_fixtures.MULTILINGUAL)
def family(request, tmp_path_factory):
    """(name, HF directory, the served bundle's server, the HF model, its transformers tokenizer, checkpoint)."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    root = tmp_path_factory.mktemp(request.param)
    hf_dir = hf_fixtures.build(request.param, root / "hf")
    checkpoint, bundle = root / "checkpoint", root / "bundle"
    assert main(["import", str(hf_dir), "--out", str(checkpoint), "--quiet"]) == 0
    assert main(["export", str(checkpoint), "--out", str(bundle), "--quiet"]) == 0
    assert main(["verify", str(bundle), "--checkpoint", str(checkpoint), "--hf", str(hf_dir), "--quiet",
                 "--threads", "1"]) == 0
    model = AutoModelForSeq2SeqLM.from_pretrained(str(hf_dir)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = AutoTokenizer.from_pretrained(str(hf_dir))
    server = Served(bundle).wait_ready()
    yield request.param, hf_dir, server, model, tok, checkpoint
    server.stop()


@pytest.fixture(scope="module")
def sentences():
    """Real sentences the tokenizers were not trained on."""
    unseen = [s for s in hf_fixtures.real_strings()[1::2] if s.strip()]
    return unseen[:: max(1, len(unseen) // N_PER_LANGUAGE)][:N_PER_LANGUAGE]


def _hf(model, tok, text: str, source: str, target: str, **options) -> list[list[int]]:
    """transformers' generate for one source in `source`, forced into `target`: each sequence without the start
    token, the end token and pads."""
    tok.src_lang = source
    ids = tok(text).input_ids
    eos = model.generation_config.eos_token_id
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             forced_bos_token_id=tok.convert_tokens_to_ids(_token(tok, target)), do_sample=False,
                             max_new_tokens=MAX_NEW, **options)
    rows = []
    for row in out.tolist():
        row = row[1:]
        rows.append(row[: row.index(eos)] if eos in row else row)
    return rows


def _token(tok, code: str) -> str:
    """The language code's token: M2M100's `__fr__`, mBART-50's code itself."""
    return tok.get_lang_token(code) if hasattr(tok, "get_lang_token") else code


def _served_batches(server, texts: list[str], source: str, targets: tuple[str, ...], **options) -> dict:
    """{target: results}: one GenerateBatch per target language, all sent at once (their rows share the engine)."""
    def call(target):
        return server.stub.GenerateBatch(pb.GenerateBatchRequest(
            inputs=texts, options=pb.DecodingOptions(max_new_tokens=MAX_NEW, **options), source_language=source,
            target_language=target), timeout=300).results

    with ThreadPoolExecutor(len(targets)) as pool:
        return dict(zip(targets, pool.map(call, targets)))


def test_the_import_records_the_familys_architecture_and_languages(family):
    name, _, server, _, tok, checkpoint = family
    cfg = ModelConfig.load(checkpoint / "config.json")
    assert cfg.norm_first
    if name in (hf_fixtures.M2M100, hf_fixtures.NLLB):  # fairseq sinusoids from pad + 1, no embedding LayerNorm
        assert (cfg.positions, cfg.position_offset, cfg.embed_norm, cfg.activation) == (
            "sinusoidal_fairseq", cfg.pad_id + 1, False, "relu")
    else:  # mBART: learned positions + 2, embedding LayerNorm
        assert (cfg.positions, cfg.position_offset, cfg.embed_norm) == ("learned", 2, True)
    info = server.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    codes = {code: tok.convert_tokens_to_ids(_token(tok, code)) for code in info.languages}
    assert dict(info.languages) == codes
    assert len(codes) == {hf_fixtures.M2M100: 100, hf_fixtures.NLLB: 202, hf_fixtures.MBART50: 52}[name]
    assert info.source_language_placement == "prefix"
    recorded = json.loads((checkpoint / "languages.json").read_text())
    assert recorded == {"codes": dict(info.languages), "source_placement": "prefix"}


@pytest.mark.parametrize("beams", [1, 4], ids=["greedy", "beam4"])
def test_served_tokens_equal_transformers_for_three_target_languages(family, sentences, beams):
    name, _, server, model, tok, _ = family
    source, targets = hf_fixtures.TEST_LANGUAGES[name]
    n_best = {"num_beams": beams, "num_return_sequences": beams}
    served = _served_batches(server, sentences, source, targets, **n_best)
    first_tokens = set()
    for target in targets:
        forced = tok.convert_tokens_to_ids(_token(tok, target))
        for text, got in zip(sentences, served[target]):
            want = _hf(model, tok, text, source, target, **n_best)
            assert [list(s.token_ids) for s in got.sequences] == want, (target, text)
            assert [s.text for s in got.sequences] == [tok.decode(w, skip_special_tokens=True) for w in want]
            assert all(s.token_ids[0] == forced for s in got.sequences)  # the target language came first
            first_tokens.add(got.token_ids[1] if len(got.token_ids) > 1 else None)
    assert len(first_tokens) > 1  # the outputs depend on the input: the comparison is not vacuous


def test_rows_of_different_languages_share_a_batch_and_equal_each_alone(family, sentences):
    """The engine is held at its first step until every request waits; then they run in one batch, and each
    output (greedy and beam 4) equals that request served alone."""
    name, _, server, _, _, _ = family
    source, targets = hf_fixtures.TEST_LANGUAGES[name]
    calls = [(text, target, beams) for text in sentences[:2] for target in targets for beams in (1, 4)]

    def req(text, target, beams):
        return pb.GenerateRequest(input=text, source_language=source, target_language=target,
                                  options=pb.DecodingOptions(max_new_tokens=MAX_NEW, num_beams=beams))

    alone = [server.stub.Generate(req(*c), timeout=60) for c in calls]
    runner, scheduler = server.runner, server.engine.scheduler
    gate, batches, step = threading.Event(), [], runner.run_step

    def held_step(*args):
        gate.wait(120)
        slots = runner.slots
        batches.append({int(slots.first[s]) for s in range(slots.hi) if slots.live[s]})
        return step(*args)

    runner.run_step = held_step  # the engine's one call per decoder step
    try:
        futures = [server.stub.Generate.future(req(*c), timeout=300) for c in calls]
        wait_for(lambda: scheduler.n_waiting + len(runner.slots.index) == len(calls), what="every request queued")
        gate.set()
        together = [f.result() for f in futures]
    finally:
        del runner.run_step
    assert [list(r.token_ids) for r in together] == [list(r.token_ids) for r in alone]
    assert [r.text for r in together] == [r.text for r in alone]
    assert max(len(b) for b in batches) == len(targets)  # one step ran rows of every target language


@pytest.mark.parametrize("fields, message", [
    ({"target_language": "fr"}, "source_language is required by this multilingual model; GetModelInfo lists"),
    ({"source_language": "en"}, "target_language is required by this multilingual model; GetModelInfo lists"),
    ({"source_language": "en", "target_language": "xx_YY"},
     "target_language 'xx_YY' is not a language of this model; GetModelInfo lists"),
    ({"source_language": "klingon", "target_language": "fr"},
     "source_language 'klingon' is not a language of this model; GetModelInfo lists"),
], ids=["no-source", "no-target", "unknown-target", "unknown-source"])
def test_a_missing_or_unknown_language_is_refused_naming_the_field(family, fields, message):
    name, _, server, _, _, _ = family
    source, targets = hf_fixtures.TEST_LANGUAGES[name]
    codes = {"en": source, "fr": targets[0]}
    fields = {k: codes.get(v, v) for k, v in fields.items()}
    for call in (lambda: server.stub.Generate(pb.GenerateRequest(input="one two", **fields), timeout=10),
                 lambda: server.stub.GenerateBatch(pb.GenerateBatchRequest(inputs=["one two"], **fields), timeout=10),
                 lambda: list(server.stub.GenerateStream(pb.GenerateRequest(input="one two", **fields), timeout=10))):
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in err.value.details()


def test_the_client_cli_and_load_test_carry_the_languages(family, sentences, tmp_path, capsys):
    """client/client.py's keywords, `seqserve generate --source-language --target-language`, and `seqserve
    loadtest --source-language --languages` (a target language mix cycled call by call: every call succeeds, which
    a multilingual model allows only with both languages; an unknown code in the mix fails its share)."""
    from seqserve.client.client import Client

    name, _, server, model, tok, _ = family
    source, targets = hf_fixtures.TEST_LANGUAGES[name]
    text = sentences[3]
    expected = []
    with Client(server.address, timeout=30) as client:
        assert client.model_info()["languages"] == dict(server.stub.GetModelInfo(pb.GetModelInfoRequest()).languages)
        for target in targets:
            (want,) = _hf(model, tok, text, source, target, num_beams=1)
            got = client.generate(text, source_language=source, target_language=target, max_new_tokens=MAX_NEW,
                                  num_beams=1)
            assert got.token_ids == want
            streamed = list(client.stream(text, source_language=source, target_language=target,
                                          max_new_tokens=MAX_NEW, num_beams=1))
            assert [t for p in streamed for t in p.token_ids] == want
            (batched,) = client.generate_batch([text], source_language=source, target_language=target,
                                               max_new_tokens=MAX_NEW, num_beams=1)
            assert batched.token_ids == want
            expected.append(want)
            capsys.readouterr()
            assert main(["generate", text, "--server", server.address, "--source-language", source,
                         "--target-language", target, "--max-new-tokens", str(MAX_NEW), "--num-beams", "1"]) == 0
            assert capsys.readouterr().out == got.text + "\n"
        several = client.generate_batch([text] * len(targets), source_language=source, target_languages=list(targets),
                                        max_new_tokens=MAX_NEW, num_beams=1)  # one input per target language
        assert [r.token_ids for r in several] == expected
        for bad, message in (([targets[0]], "target_languages has 1 entries; it must be empty or have one per input"),
                             ([targets[0], "xx_YY"], "target_languages[1] 'xx_YY' is not a language of this model")):
            with pytest.raises(grpc.RpcError) as err:
                client.generate_batch([text] * 2, source_language=source, target_languages=bad)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in err.value.details()
    assert main(["generate", text, "--server", server.address]) == 1
    assert "INVALID_ARGUMENT: source_language is required" in capsys.readouterr().err
    (tmp_path / "heldout.tsv").write_text("".join(f"{s}\tx\n" for s in sentences if "\t" not in s and "\n" not in s))
    base = ["loadtest", "--target", server.address, "--heldout", str(tmp_path), "--users", "2", "--duration", "2s",
            "--max-new-tokens", "3", "--num-beams", "1", "--source-language", source]
    assert main([*base, "--report-dir", str(tmp_path / "mix"), "--languages", ",".join(targets),
                 "--max-failure-rate", "0"]) == 0
    mix = json.loads((tmp_path / "mix" / "summary.json").read_text())
    assert mix["requests"] > 0 and mix["failures"] == 0
    main([*base, "--report-dir", str(tmp_path / "bad"), "--languages", f"{targets[0]},xx_YY"])
    bad = json.loads((tmp_path / "bad" / "summary.json").read_text())
    assert set(bad["failures_by_code"]) == {"INVALID_ARGUMENT"} and 0 < bad["failures"] < bad["requests"]
