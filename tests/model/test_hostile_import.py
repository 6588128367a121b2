"""`seqserve import` on hostile model directories: each case edits a copy of one tiny random-weight Marian directory
(tests/hf_fixtures.py); the real CLI must exit 2 with a message naming the file and the field, print no traceback,
leave the source directory as it was, and stay within a bounded peak RSS of a healthy import's.

Every import of this file runs in one child process (tests/import_runner.py): the healthy directory first, whose peak
RSS is the baseline, then each hostile case in order (the peak after each must stay within the baseline plus
RSS_MARGIN), then the directories that must import."""
from __future__ import annotations

import json
import random
import shutil
import struct
from pathlib import Path

import hf_fixtures
import pytest
from hostile_imports import HEALTHY, Imports, assert_refused, copy_of, import_all, snapshot

pytest.importorskip("transformers")

FC1 = "model.encoder.layers.0.fc1.weight"  # a (64, 32) weight of the tiny Marian


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory) -> Path:
    return hf_fixtures.build_marian(tmp_path_factory.mktemp("marian") / "hf")


# -- edits: each takes the copy, may return the --out directory to use ---------------------------------------------

def config(**changes):
    def edit(hf: Path):
        data = json.loads((hf / "config.json").read_text())
        data.update(changes)
        (hf / "config.json").write_text(json.dumps(data))
    return edit


def tensors(change):
    """Rewrites model.safetensors after change(dict of name -> tensor)."""
    def edit(hf: Path):
        from safetensors.torch import load_file, save_file

        data = load_file(hf / "model.safetensors")
        change(data)
        save_file(data, hf / "model.safetensors", metadata={"format": "pt"})
    return edit


def weights_bytes(make):
    """model.safetensors replaced by make(its bytes)."""
    def edit(hf: Path):
        path = hf / "model.safetensors"
        path.write_bytes(make(path.read_bytes()))
    return edit


def raw_header(header: dict, data: bytes, length: int | None = None):
    """A model.safetensors written by hand: the 8-byte length, the JSON header, the data."""
    blob = json.dumps(header).encode()
    return weights_bytes(lambda _: struct.pack("<Q", len(blob) if length is None else length) + blob + data)


def index(weight_map):
    """The weights moved into one shard, named by model.safetensors.index.json's weight_map(hf)."""
    def edit(hf: Path):
        (hf / "model.safetensors").rename(hf / "model-00001-of-00001.safetensors")
        (hf / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map(hf)}))
    return edit


def outside_weights(name_in_index):
    """The weights moved out of the directory, named by the index (name_in_index(hf) -> the name it lists)."""
    def edit(hf: Path):
        (hf / "model.safetensors").rename(hf.parent / "outside" / "w.safetensors")
        (hf / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {FC1: name_in_index(hf)}}))
    return edit


def symlink_out(name: str, move: bool = True):
    """hf/name becomes a symlink to a file outside the directory (the file itself moved there, or a secret)."""
    def edit(hf: Path):
        target = hf.parent / "outside" / name
        if move:
            (hf / name).rename(target)
        else:
            target.write_text("a file outside the model directory\n")
        (hf / name).symlink_to(target)
    return edit


def set_all(value: float):
    def change(data):
        for tensor in data.values():
            tensor.fill_(value)
    return change


def set_one(name: str, dtype, value=None):
    def change(data):
        data[name] = data[name].to(dtype)
        if value is not None:
            data[name].view(-1)[0] = value
    return change


def alias(data):
    data[FC1.removeprefix("model.")] = data[FC1].clone()


def nested(hf: Path):
    depth = 100_000
    (hf / "config.json").write_text('{"model_type": "marian", "x": ' + "[" * depth + "]" * depth + "}")


def _torch(name: str):
    import torch

    return getattr(torch, name)


F32_2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}

CASES = {
    # 1: sizes within the bundle's caps (contract/schema.py MODEL_CAPS), and their product within the weights
    "positions-4M": (config(max_position_embeddings=4_000_000),
                     "config.json: max_position_embeddings must be <= 65536, got 4000000"),
    "positions-1e9": (config(max_position_embeddings=10**9),
                      "config.json: max_position_embeddings must be <= 65536, got 1000000000"),
    "positions-table": (config(max_position_embeddings=65536),
                        "config.json: max_position_embeddings=65536 x d_model=32 is a position table of"),
    "width-x-vocab": (config(d_model=65536, vocab_size=1_000_000, decoder_vocab_size=1_000_000),
                      "config.json: vocab_size=1000000, d_model=65536"),
    "layers-200k": (config(encoder_layers=200_000), "config.json: encoder_layers must be <= 1024, got 200000"),
    "layers-at-cap": (config(encoder_layers=1024, decoder_layers=1024),
                      "config.json: vocab_size=600, d_model=32, encoder_layers=1024, decoder_layers=1024"),
    # 2: types, nesting, corrupt weight files, malformed indexes
    "heads-0": (config(encoder_attention_heads=0, decoder_attention_heads=0),
                "config.json: encoder_attention_heads must be >= 1, got 0"),
    "d_model-float": (config(d_model=32.0), "config.json: d_model must be an integer, got float 32.0"),
    "layers-float": (config(encoder_layers=2.0, decoder_layers=2.0),
                     "config.json: encoder_layers must be an integer, got float 2.0"),
    "vocab-bool": (config(vocab_size=True), "config.json: vocab_size must be an integer, got a boolean True"),
    "pad-float": (config(pad_token_id=599.0), "config.json: pad_token_id must be an integer, got float 599.0"),
    "activation-list": (config(activation_function=["swish"]),
                        "config.json: activation_function must be a string, got ['swish']"),
    "model_type-list": (config(model_type=["marian"]), "config.json: model_type ['marian'] is not supported"),
    "nested-100k": (nested, "config.json: nested more than 32 levels deep"),
    "weights-random": (weights_bytes(lambda b: random.Random(0).randbytes(len(b))),
                       "model.safetensors: the header claims"),
    "weights-truncated": (weights_bytes(lambda b: b[: len(b) // 2]), "do not lie within the file's"),
    "weights-empty": (weights_bytes(lambda b: b""), "model.safetensors: 0 bytes, too short for a safetensors file"),
    "header-2^40": (weights_bytes(lambda b: struct.pack("<Q", 1 << 40) + b[8:]),
                    "model.safetensors: the header claims 1099511627776 bytes"),
    "header-not-json": (weights_bytes(lambda b: struct.pack("<Q", 16) + b"\xff" * 16 + b[24:]),
                        "model.safetensors: the header is not a JSON object"),
    "tensors-overlap": (raw_header({"a": F32_2, "b": {**F32_2, "data_offsets": [4, 12]}}, bytes(12)),
                        "model.safetensors: tensor 'b' starts at byte 4 of the data, expected 8"),
    "shape-vs-offsets": (raw_header({"a": {**F32_2, "shape": [1 << 40, 1 << 40]}}, bytes(8)),
                         "model.safetensors: tensor 'a': data_offsets [0, 8] hold 8 bytes"),
    "dtype-unknown": (raw_header({"a": {**F32_2, "dtype": "F128"}}, bytes(8)),
                      "model.safetensors: tensor 'a': dtype 'F128' is not a safetensors dtype"),
    "tensor-stored-twice": (tensors(alias), "is also in model.safetensors; each weight must be stored once"),
    "index-map-list": (index(lambda hf: ["model-00001-of-00001.safetensors"]),
                       "model.safetensors.index.json: weight_map must be an object"),
    "index-map-ints": (index(lambda hf: {FC1: 1}), "model.safetensors.index.json: weight_map must be an object"),
    # 3: every file read lies inside the directory
    "index-dotdot": (outside_weights(lambda hf: "../outside/w.safetensors"),
                     "outside/w.safetensors: resolves outside"),
    "index-absolute": (outside_weights(lambda hf: str(hf.parent / "outside" / "w.safetensors")),
                       "outside/w.safetensors: resolves outside"),
    "weights-symlink-out": (symlink_out("model.safetensors"), "model.safetensors: resolves outside"),
    "config-symlink-out": (symlink_out("config.json"), "config.json: resolves outside"),
    "readme-symlink-out": (symlink_out("README.md", move=False), "README.md: resolves outside"),
    "generation-symlink-out": (symlink_out("generation_config.json"), "generation_config.json: resolves outside"),
    # 5: the output never overlaps the source
    "out-is-source": (lambda hf: hf, "--out is the model directory"),
    "out-inside-source": (lambda hf: hf / "checkpoint", "--out lies inside the model directory"),
    "out-contains-source": (lambda hf: hf.parent, "--out contains the model directory"),
    # 6: malformed values
    "scale_embedding-string": (config(scale_embedding="yes"),
                               "config.json: scale_embedding must be true or false, got 'yes'"),
    "tie-string": (config(tie_word_embeddings="no"), "config.json: tie_word_embeddings must be true or false"),
    "weights-int64": (tensors(set_one(FC1, _torch("int64"))),
                      f"model.safetensors: tensor {FC1!r} has dtype I64; weights must be floating point"),
    "weights-bool": (tensors(set_one(FC1, _torch("bool"))), f"model.safetensors: tensor {FC1!r} has dtype BOOL"),
    "weights-all-nan": (tensors(set_all(float("nan"))), "' holds NaN or infinite values"),
    "weights-one-inf": (tensors(set_one(FC1, _torch("float32"), float("inf"))),
                        f"model.safetensors: tensor {FC1!r} holds NaN or infinite values (1 of 2048"),
    "float64-beyond-float32": (tensors(set_one(FC1, _torch("float64"), 1e300)),
                               f"model.safetensors: tensor {FC1!r} holds NaN or infinite values"),
}


# -- directories that must import (or be refused) as prepared: each takes an empty root, returns (source, --out) ----

def float64_weights(marian_dir: Path, root: Path) -> tuple[Path, Path]:
    hf = copy_of(marian_dir, root)
    tensors(lambda data: data.update({k: v.double() for k, v in data.items()}))(hf)
    return hf, root / "ck"


def out_a_file(marian_dir: Path, root: Path) -> tuple[Path, Path]:
    hf = copy_of(marian_dir, root)
    (root / "a-file").write_text("not a directory\n")
    return hf, root / "a-file" / "ck"


SPLIT = 40  # the first shard's tensor count


def shards_and_links(marian_dir: Path, root: Path) -> tuple[Path, Path]:
    """Two shards named by the index, one of them through a symbolic link to a file inside the directory."""
    from safetensors.torch import load_file, save_file

    hf = copy_of(marian_dir, root)
    data = load_file(hf / "model.safetensors")
    names = sorted(data)
    halves = {"model-00001-of-00002.safetensors": names[:SPLIT], "blobs/second": names[SPLIT:]}
    (hf / "blobs").mkdir()
    for file, keys in halves.items():
        save_file({k: data[k] for k in keys}, hf / file, metadata={"format": "pt"})
    (hf / "model-00002-of-00002.safetensors").symlink_to(hf / "blobs" / "second")
    shard = {"model-00001-of-00002.safetensors": names[:SPLIT], "model-00002-of-00002.safetensors": names[SPLIT:]}
    (hf / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: file for file, keys in shard.items() for k in keys}}))
    (hf / "model.safetensors").unlink()
    return hf, root / "ck"


def cache_snapshot(marian_dir: Path, root: Path) -> tuple[Path, Path]:
    """The Hugging Face cache's layout: models--ORG--NAME/snapshots/REV/FILE -> ../../blobs/SHA."""
    repo = root / "hub" / "models--org--tiny"
    snap, blobs = repo / "snapshots" / "0123abc", repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for i, file in enumerate(sorted(p for p in marian_dir.iterdir() if p.is_file())):
        shutil.copyfile(file, blobs / f"blob{i}")
        (snap / file.name).symlink_to(Path("..") / ".." / "blobs" / f"blob{i}")
    return snap, root / "ck"


def cache_link_out(marian_dir: Path, root: Path) -> tuple[Path, Path]:
    """The cache snapshot with config.json linked to a file out of the model's blobs."""
    snap, out = cache_snapshot(marian_dir, root)
    (root / "elsewhere.json").write_text((marian_dir / "config.json").read_text())
    (snap / "config.json").unlink()
    (snap / "config.json").symlink_to(root / "elsewhere.json")
    return snap, out


PREPARED = {"float64": float64_weights, "out-a-file": out_a_file, "shards-and-links": shards_and_links,
            "cache-snapshot": cache_snapshot, "cache-link-out": cache_link_out}


@pytest.fixture(scope="module")
def imports(marian_dir, tmp_path_factory) -> Imports:
    return import_all(marian_dir, CASES, PREPARED, tmp_path_factory)


@pytest.mark.parametrize("case", CASES)
def test_a_hostile_directory_is_refused_naming_the_file_and_field(case, imports):
    assert_refused(imports, case, CASES[case][1])


def test_float64_weights_import_as_float32_with_a_warning(imports, marian_dir):
    """F64 tensors are converted (docs/import.md): the checkpoint equals the float32 original's, and stderr says so."""
    from safetensors.torch import load_file

    case, run, original = imports.cases["float64"], imports.runs["float64"], imports.runs[HEALTHY]
    assert run.code == 0 and run.traceback is None, (run.traceback, run.stderr)
    count = len(load_file(marian_dir / "model.safetensors"))
    assert f"{case.hf / 'model.safetensors'}: {count} tensor(s) stored as F64" in run.stderr
    assert "converted to float32" in run.stderr
    assert "F64" not in original.stderr
    ours = load_file(case.out / "model.safetensors")
    theirs = load_file(imports.cases[HEALTHY].out / "model.safetensors")
    assert ours.keys() == theirs.keys()
    assert all(ours[k].dtype == theirs[k].dtype and ours[k].equal(theirs[k]) for k in ours)


def test_an_out_that_cannot_be_written_exits_2_naming_it(imports):
    case, run = imports.cases["out-a-file"], imports.runs["out-a-file"]
    assert run.traceback is None, run.traceback
    assert run.code == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert run.stderr.strip() == f"seqserve import: error: {case.out}: Not a directory"
    assert snapshot(case.hf) == case.before


def test_shards_and_links_inside_the_directory_still_import(imports):
    """Confinement refuses only what leaves the directory: two shards named by the index, one of them through a
    symbolic link to a file inside the directory, import to the same weights as the single file."""
    from safetensors.torch import load_file

    run = imports.runs["shards-and-links"]
    assert run.code == 0 and run.traceback is None, (run.traceback, run.stderr)
    ours, theirs = (load_file(imports.cases[name].out / "model.safetensors") for name in ("shards-and-links", HEALTHY))
    assert ours.keys() == theirs.keys() and all(ours[k].equal(theirs[k]) for k in ours)


def test_a_hugging_face_cache_snapshot_imports_and_a_link_out_of_its_blobs_is_refused(imports):
    """The cache's layout (models--ORG--NAME/snapshots/REV/FILE -> ../../blobs/SHA) is what a downloaded model looks
    like: its links may lead into that model's blobs, and nowhere else."""
    run = imports.runs["cache-snapshot"]
    assert run.code == 0 and run.traceback is None, (run.traceback, run.stderr)
    refused = imports.runs["cache-link-out"]
    assert refused.traceback is None, refused.traceback
    assert refused.code == 2 and "config.json: resolves outside" in refused.stderr, refused.stderr
