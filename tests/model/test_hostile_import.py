"""`seqserve import` on hostile model directories: each case edits a copy of one tiny random-weight Marian directory
(tests/hf_fixtures.py) and runs the real CLI in a child process, which must exit 2 with a message naming the file and
the field, print no traceback, leave the source directory as it was, and stay within a bounded peak RSS of a healthy
import's (os.wait4's ru_maxrss of the child)."""
from __future__ import annotations

import hashlib
import json
import os
import random
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import hf_fixtures
import pytest

pytest.importorskip("transformers")

SEQSERVE = str(Path(sys.executable).parent / "seqserve")
RSS_MARGIN = 300 << 20  # a refusal may use at most this much more memory than the healthy import
ADDRESS_SPACE = 4 << 30  # a regression fails in the child (MemoryError) instead of paging out the shared machine
GUARD_S = 300  # a regression that hangs is killed (and fails): not a timing assertion
FC1 = "model.encoder.layers.0.fc1.weight"  # a (64, 32) weight of the tiny Marian


@dataclass(frozen=True)
class Run:
    code: int
    stdout: str
    stderr: str
    peak_rss: int  # bytes


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_import(hf: Path, out: Path) -> Run:
    """`seqserve import HF --out OUT --quiet --no-verify` in a child process, and the child's peak RSS."""
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen([SEQSERVE, "import", str(hf), "--out", str(out), "--quiet", "--no-verify"],
                                stdout=stdout, stderr=stderr, preexec_fn=_limit)
        guard = threading.Timer(GUARD_S, proc.kill)
        guard.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            guard.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        stdout.seek(0)
        stderr.seek(0)
        return Run(proc.returncode, stdout.read().decode(errors="replace"), stderr.read().decode(errors="replace"),
                   usage.ru_maxrss * 1024)  # Linux reports kilobytes


def snapshot(directory: Path) -> dict[str, str]:
    """Every entry under directory (symlinks not followed) -> what it is: a link's target, a file's sha256."""
    found = {}
    for path in sorted(directory.rglob("*")):
        name = str(path.relative_to(directory))
        if path.is_symlink():
            found[name] = f"link {os.readlink(path)}"
        elif path.is_file():
            found[name] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[name] = "directory"
    return found


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory) -> Path:
    return hf_fixtures.build_marian(tmp_path_factory.mktemp("marian") / "hf")


@pytest.fixture(scope="module")
def healthy(marian_dir, tmp_path_factory) -> Run:
    """The pristine directory's import: the baseline peak RSS."""
    out = tmp_path_factory.mktemp("healthy") / "ck"
    run = run_import(marian_dir, out)
    assert run.code == 0, run.stderr
    return run


@pytest.fixture
def hf(marian_dir, tmp_path) -> Path:
    copy = tmp_path / "hf"
    shutil.copytree(marian_dir, copy)
    (tmp_path / "outside").mkdir()
    return copy


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


@pytest.mark.parametrize("case", CASES)
def test_a_hostile_directory_is_refused_naming_the_file_and_field(case, hf, healthy):
    edit, message = CASES[case]
    out = edit(hf) or hf.parent / "ck"
    before = snapshot(hf)
    run = run_import(hf, out)
    assert run.code == 2, f"exit {run.code}\n{run.stderr[-2000:]}"
    last = run.stderr.splitlines()[-1] if run.stderr.strip() else ""
    assert last.startswith("seqserve import: error: ") and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert message in run.stderr and str(hf) in run.stderr, run.stderr
    assert snapshot(hf) == before  # nothing written into (or removed from) the source
    assert not (out / "metrics.json").exists() and not (hf.parent / "ck").exists()
    assert run.peak_rss <= healthy.peak_rss + RSS_MARGIN, (run.peak_rss, healthy.peak_rss)


def test_float64_weights_import_as_float32_with_a_warning(hf, marian_dir, healthy, tmp_path):
    """F64 tensors are converted (docs/import.md): the checkpoint equals the float32 original's, and stderr says so."""
    from safetensors.torch import load_file

    tensors(lambda data: data.update({k: v.double() for k, v in data.items()}))(hf)
    run = run_import(hf, tmp_path / "ck")
    assert run.code == 0, run.stderr
    count = len(load_file(marian_dir / "model.safetensors"))
    assert f"{hf / 'model.safetensors'}: {count} tensor(s) stored as F64" in run.stderr
    assert "converted to float32" in run.stderr
    original = run_import(marian_dir, tmp_path / "ck32")
    assert original.code == 0 and "F64" not in original.stderr
    ours, theirs = load_file(tmp_path / "ck" / "model.safetensors"), load_file(tmp_path / "ck32" / "model.safetensors")
    assert ours.keys() == theirs.keys()
    assert all(ours[k].dtype == theirs[k].dtype and ours[k].equal(theirs[k]) for k in ours)


def test_an_out_that_cannot_be_written_exits_2_naming_it(hf, healthy):
    (hf.parent / "a-file").write_text("not a directory\n")
    before = snapshot(hf)
    run = run_import(hf, hf.parent / "a-file" / "ck")
    assert run.code == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert run.stderr.strip() == f"seqserve import: error: {hf.parent / 'a-file' / 'ck'}: Not a directory"
    assert snapshot(hf) == before


def test_shards_and_links_inside_the_directory_still_import(hf, marian_dir, healthy, tmp_path):
    """Confinement refuses only what leaves the directory: two shards named by the index, one of them through a
    symbolic link to a file inside the directory, import to the same weights as the single file."""
    from safetensors.torch import load_file, save_file

    data = load_file(hf / "model.safetensors")
    names = sorted(data)
    halves = {"model-00001-of-00002.safetensors": names[:40], "blobs/second": names[40:]}
    (hf / "blobs").mkdir()
    for file, keys in halves.items():
        save_file({k: data[k] for k in keys}, hf / file, metadata={"format": "pt"})
    (hf / "model-00002-of-00002.safetensors").symlink_to(hf / "blobs" / "second")
    shard = {"model-00001-of-00002.safetensors": names[:40], "model-00002-of-00002.safetensors": names[40:]}
    (hf / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: file for file, keys in shard.items() for k in keys}}))
    (hf / "model.safetensors").unlink()
    run = run_import(hf, tmp_path / "ck")
    assert run.code == 0, run.stderr
    assert run_import(marian_dir, tmp_path / "single").code == 0
    ours, theirs = (load_file(tmp_path / name / "model.safetensors") for name in ("ck", "single"))
    assert ours.keys() == theirs.keys() and all(ours[k].equal(theirs[k]) for k in ours)


def test_a_hugging_face_cache_snapshot_imports_and_a_link_out_of_its_blobs_is_refused(marian_dir, tmp_path):
    """The cache's layout (models--ORG--NAME/snapshots/REV/FILE -> ../../blobs/SHA) is what a downloaded model looks
    like: its links may lead into that model's blobs, and nowhere else."""
    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot, blobs = repo / "snapshots" / "0123abc", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, file in enumerate(sorted(p for p in marian_dir.iterdir() if p.is_file())):
        shutil.copyfile(file, blobs / f"blob{i}")
        (snapshot / file.name).symlink_to(Path("..") / ".." / "blobs" / f"blob{i}")
    run = run_import(snapshot, tmp_path / "ck")
    assert run.code == 0, run.stderr
    (tmp_path / "elsewhere.json").write_text((marian_dir / "config.json").read_text())
    (snapshot / "config.json").unlink()
    (snapshot / "config.json").symlink_to(tmp_path / "elsewhere.json")  # out of the model's blobs
    refused = run_import(snapshot, tmp_path / "ck2")
    assert refused.code == 2 and "config.json: resolves outside" in refused.stderr, refused.stderr
