"""`seqserve import` of a directory whose tokenizer files are hostile or broken: exit 2 with a message naming the
file and the field, no traceback, and a bounded peak memory (model/hf_tokenizer_files.py).

Each case copies one tiny random-weight fixture (tests/hf_fixtures.py) and breaks one tokenizer file; every case runs
the real CLI in one child process (tests/import_runner.py), after the untouched Marian fixture's import, whose peak
RSS is the baseline.
"""
from __future__ import annotations

import json
import random
import shutil

import hf_fixtures
import pytest
from import_runner import RSS_MARGIN, Batch, import_argv, run_batch

from seqserve.cli.main import main

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

HEALTHY = "healthy"  # the untouched Marian fixture's import: the baseline peak RSS
MAX_DEPTH = 32  # contract/jsonfile.py's bound, stated here so a change to it shows up in this test


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """family -> its tiny fixture directory, each built once for the module."""
    cache = {}

    def get(family: str):
        if family not in cache:
            cache[family] = hf_fixtures.build(family, tmp_path_factory.mktemp(family) / "hf")
        return cache[family]
    return get


def _edit(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _set(key, value):
    return lambda data: data.__setitem__(key, value)


def _first_piece(data) -> str:
    return next(piece for piece in data if piece.startswith("▁"))


def _vocab_id(value):
    """Sets the id of vocab.json's first '▁' piece to value."""
    return lambda hf: _edit(hf / "vocab.json", lambda d: d.__setitem__(_first_piece(d), value(d[_first_piece(d)])))


def _link_outside(name):
    """Replaces hf/name by a symlink to a copy of it just outside the directory."""
    def edit(hf):
        outside = hf.parent / f"outside-{name}"
        shutil.copyfile(hf / name, outside)
        (hf / name).unlink()
        (hf / name).symlink_to(outside)
    return edit


def _noise(n: int = 5000) -> bytes:
    return random.Random(0).randbytes(n)


def _deep(levels: int) -> str:
    return '{"a": ' * levels + "1" + "}" * levels


M, B, N, M2 = hf_fixtures.MARIAN, hf_fixtures.BART, hf_fixtures.NLLB, hf_fixtures.M2M100
# (family, edit of the copied directory, the file the message names, what else it must say)
CASES = {
    "vocab-id-string": (M, _vocab_id(str), "vocab.json", "must be an integer"),
    "vocab-id-float": (M, _vocab_id(float), "vocab.json", "must be an integer"),
    "vocab-id-null": (M, _vocab_id(lambda _: None), "vocab.json", "got None"),
    "vocab-id-bool": (M, lambda hf: _edit(hf / "vocab.json", _set("<unk>", True)), "vocab.json", "'<unk>'"),
    "vocab-id-huge": (M, _vocab_id(lambda _: 1 << 40), "vocab.json", "must be an integer in 0.."),
    "vocab-deep": (M, lambda hf: (hf / "vocab.json").write_text(_deep(10 * MAX_DEPTH)), "vocab.json",
                   f"nested more than {MAX_DEPTH} levels"),
    "vocab-not-object": (M, lambda hf: (hf / "vocab.json").write_text("[1, 2]"), "vocab.json", "JSON object"),
    "eos-token-object": (M, lambda hf: _edit(hf / "tokenizer_config.json", _set("eos_token", {"x": 1})),
                         "tokenizer_config.json", "eos_token must be a token"),
    "unk-token-int": (M, lambda hf: _edit(hf / "tokenizer_config.json", _set("unk_token", 5)),
                      "tokenizer_config.json", "unk_token must be a token"),
    "added-token-flag-string": (M, lambda hf: _edit(hf / "tokenizer_config.json", _set("pad_token", {
        "content": "<pad>", "lstrip": "no"})), "tokenizer_config.json", "pad_token"),
    "separate-vocabs-int": (M, lambda hf: _edit(hf / "tokenizer_config.json", _set("separate_vocabs", 0)),
                            "tokenizer_config.json", "separate_vocabs must be a bool"),
    "spm-empty": (M, lambda hf: (hf / "source.spm").write_bytes(b""), "source.spm", "empty"),
    "spm-noise": (M, lambda hf: (hf / "source.spm").write_bytes(_noise()), "source.spm", "not a sentencepiece"),
    "spm-symlink-out": (M, _link_outside("source.spm"), "source.spm", "resolves outside"),
    "target-spm-empty": (M, lambda hf: (hf / "target.spm").write_bytes(b""), "target.spm", "empty"),
    "m2m-vocab-null": (M2, _vocab_id(lambda _: None), "vocab.json", "got None"),
    "m2m-language-codes-list": (M2, lambda hf: _edit(hf / "tokenizer_config.json", _set("language_codes", ["x"])),
                                "tokenizer_config.json", "language_codes must be a str"),
    "m2m-added-tokens-float": (M2, lambda hf: _edit(hf / "added_tokens.json", lambda d: d.__setitem__(
        next(iter(d)), 1.5)), "added_tokens.json", "got 1.5"),
    "bart-tokenizer-json-model": (B, lambda hf: _edit(hf / "tokenizer.json", _set("model", 5)), "tokenizer.json",
                                  "not a `tokenizers` tokenizer"),
    "bart-merges-noise": (B, lambda hf: ((hf / "tokenizer.json").unlink(), (hf / "merges.txt").write_bytes(_noise())),
                          "merges.txt", "not UTF-8"),
    "bart-merges-line": (B, lambda hf: (hf / "merges.txt").write_text("#version: 0.2\na b\nc d e\n"), "merges.txt",
                         "line 3"),
    "bart-vocab-id-string": (B, lambda hf: _edit(hf / "vocab.json", _set("<unk>", "x")), "vocab.json", "'<unk>'"),
    "bart-eos-token-object": (B, lambda hf: _edit(hf / "tokenizer_config.json", _set("eos_token", {"x": 1})),
                              "tokenizer_config.json", "eos_token"),
    "nllb-tokenizer-json-vocab": (N, lambda hf: _edit(hf / "tokenizer.json", lambda d: d["model"].__setitem__(
        "vocab", "x")), "tokenizer.json", "expected a map"),
    "nllb-tokenizer-json-truncated": (N, lambda hf: (hf / "tokenizer.json").write_bytes(
        (hf / "tokenizer.json").read_bytes()[:1000]), "tokenizer.json", "not valid JSON"),
    "nllb-tokenizer-json-deep": (N, lambda hf: (hf / "tokenizer.json").write_text(_deep(10 * MAX_DEPTH)),
                                 "tokenizer.json", "nested more than"),
    "nllb-tokenizer-json-symlink-out": (N, _link_outside("tokenizer.json"), "tokenizer.json", "resolves outside"),
    "nllb-unk-token-int": (N, lambda hf: _edit(hf / "tokenizer_config.json", _set("unk_token", 5)),
                           "tokenizer_config.json", "unk_token must be a token"),
    "nllb-eos-token-object": (N, lambda hf: _edit(hf / "tokenizer_config.json", _set("eos_token", {"x": 1})),
                              "tokenizer_config.json", "eos_token must be a token"),
    "nllb-legacy-int": (N, lambda hf: _edit(hf / "tokenizer_config.json", _set("legacy_behaviour", 1)),
                        "tokenizer_config.json", "legacy_behaviour must be a bool"),
    "nllb-added-tokens-decoder": (N, lambda hf: _edit(hf / "tokenizer_config.json", _set("added_tokens_decoder",
                                                                                         {"0": 5})),
                                  "tokenizer_config.json", "added_tokens_decoder"),
    "nllb-extra-tokens-int": (N, lambda hf: _edit(hf / "tokenizer_config.json", _set("extra_special_tokens", [7])),
                              "tokenizer_config.json", "extra_special_tokens[0]"),
}


@pytest.fixture(scope="module")
def imports(built, tmp_path_factory) -> tuple[dict, Batch]:
    """Each case's copy, edited, then every import in one child: the healthy Marian first, then the cases in order."""
    dirs = {HEALTHY: built(hf_fixtures.MARIAN)}
    for case, (family, edit, _, _) in CASES.items():
        hf = tmp_path_factory.mktemp(case) / "hf"
        shutil.copytree(built(family), hf, symlinks=True)
        edit(hf)
        dirs[case] = hf
    runs = run_batch({case: import_argv(hf, hf.parent / "out") for case, hf in dirs.items()},
                     tmp_path_factory.mktemp("batch"))
    healthy = runs[HEALTHY]
    assert healthy.code == 0 and healthy.traceback is None, (healthy.traceback, healthy.stderr)
    return dirs, runs


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_tokenizer_file_is_refused_naming_it(case, imports):
    _, _, name, field = CASES[case]
    dirs, runs = imports
    hf, run = dirs[case], runs[case]
    assert run.traceback is None, run.traceback
    assert run.code == 2, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert f"{hf / name}:" in run.stderr and field in run.stderr, run.stderr
    limit = runs[HEALTHY].peak_rss + RSS_MARGIN
    assert run.peak_rss <= limit, (f"peak RSS {run.peak_rss >> 20} MiB > the healthy import's + {RSS_MARGIN >> 20} "
                                   f"MiB ({limit >> 20} MiB), first exceeded by {runs.first_over(limit)}")
    assert not (hf.parent / "out" / "metrics.json").exists()


@pytest.mark.parametrize("token", [{"content": "</s>"}, {"__type": "AddedToken", "content": "</s>", "lstrip": False,
                                                          "normalized": True, "rstrip": False, "single_word": False}],
                         ids=["content-only", "save-pretrained-form"])
def test_an_added_token_object_is_a_legitimate_special_token(token, built, tmp_path, capsys):
    hf = tmp_path / "hf"
    shutil.copytree(built(hf_fixtures.MARIAN), hf)
    _edit(hf / "tokenizer_config.json", _set("eos_token", token))
    assert main(["import", str(hf), "--out", str(tmp_path / "out"), "--quiet", "--no-verify"]) == 0, \
        capsys.readouterr().err
