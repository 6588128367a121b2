"""A malformed bundle is refused at load with a message naming the file and the field, and `seqserve serve` and
`seqserve verify` exit 2 (issue 11, defect 6): schema, confined paths, the manifest's digest, the tokenizer and the
graphs checked against the manifest."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from seqserve.cli.main import main
from seqserve.contract.manifest import DIGEST, MANIFEST, BundleError, IntegrityError, load_manifest

REPO = Path(__file__).resolve().parents[2]


def _rehash(bundle: Path, entry: dict) -> None:
    blob = (bundle / entry["file"]).read_bytes()
    entry.update(sha256=hashlib.sha256(blob).hexdigest(), bytes=len(blob))


def _corrupt_tokenizer(bundle: Path, data: dict) -> None:
    (bundle / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "nonsense"}}')
    _rehash(bundle, data["tokenizer"])  # consistent hashes: the parser itself must refuse it


def _link_outside(bundle: Path, data: dict) -> None:
    outside = bundle.parent / "outside.json"
    shutil.copyfile(bundle / "tokenizer.json", outside)
    (bundle / "link.json").symlink_to(outside)
    data["tokenizer"]["file"] = "link.json"


def _set(path: str, value):
    def edit(bundle: Path, data: dict) -> None:
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[key]
        if value is KeyError:
            del node[last]
        else:
            node[last] = value
    return edit


def _eos_5(bundle: Path, data: dict) -> None:
    data["special_tokens"]["eos_id"] = data["model"]["eos_id"] = 5  # consistent, but not the tokenizer's </s>


def _corrupt_graph(graph: str, old: bytes, new: bytes):
    """Bytes of a graph replaced (same length), its sha256 updated: onnxruntime itself must refuse it."""
    def edit(bundle: Path, data: dict) -> None:
        path = bundle / data["variants"]["fp32"][graph]["file"]
        blob = path.read_bytes()
        assert old in blob, f"{old!r} not in {path.name}"
        path.write_bytes(blob.replace(old, new))
        _rehash(bundle, data["variants"]["fp32"][graph])
    return edit


def _truncate_graph(graph: str):
    """Half of a graph (an interrupted copy), its sha256 updated."""
    def edit(bundle: Path, data: dict) -> None:
        path = bundle / data["variants"]["fp32"][graph]["file"]
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        _rehash(bundle, data["variants"]["fp32"][graph])
    return edit


def _nested(depth: int):
    """A manifest nested `depth` levels deep (raw text: json.dumps itself would recurse)."""
    return lambda bundle, data: Raw(("[" * depth + "]" * depth).encode())


def _padded(size: int):
    """The real manifest, padded with whitespace (valid JSON) to `size` bytes."""
    return lambda bundle, data: Raw(json.dumps(data).encode().ljust(size))


def _digest_file(blob: bytes):
    def edit(bundle: Path, data: dict) -> None:
        data[DIGEST] = blob  # _bundle writes it after the manifest
    return edit


class Raw(bytes):
    """manifest.json's exact bytes (the digest is computed over them)."""


# (id, edit of the bundle copy and its manifest data (or a replacement), what the message must name): all exit 2.
CASES = [
    ("manifest-is-a-list", lambda b, d: [], "manifest.json: must be a JSON object, got list"),
    ("missing-model-field", _set("model.n_heads", KeyError), "model.n_heads is missing"),
    ("missing-model", _set("model", KeyError), "manifest.json: model is missing"),
    ("variants-as-a-list", _set("variants", [{"name": "fp32"}]), "variants must be an object, got a list"),
    ("empty-fp32", _set("variants.fp32", {}), "variants.fp32.encoder is missing"),
    ("d_model-string", _set("model.d_model", "64"), "model.d_model must be an integer, got a string '64'"),
    ("corrupt-tokenizer", _corrupt_tokenizer, "tokenizer.json: not a usable tokenizer"),
    ("n_heads-mismatch", _set("model.n_heads", 8), "but the manifest's model.n_heads is 8"),
    ("eos-disagrees", _eos_5, "special_tokens.eos_id=5 but tokenizer.json has id 2 for that token"),
    ("absolute-path", _set("tokenizer.file", "/etc/passwd"),
     "tokenizer.file must be a path inside the bundle directory (relative, no '..'), got '/etc/passwd'"),
    ("dotdot-path", _set("variants.fp32.decoder.file", "../../decoder.onnx"),
     "variants.fp32.decoder.file must be a path inside the bundle directory"),
    ("link-out-of-bundle", _link_outside, "link.json: listed in manifest.json but resolves outside the bundle"),
    ("max_positions-overstated", _set("model.max_positions", 128),
     "cannot run at the manifest's model.max_positions=128"),
    ("max_new_tokens-beyond-positions", _set("max_new_tokens", 100), "max_new_tokens=100 exceeds model.max_positions"),
    ("unknown-field", _set("graphs", {}), "unknown field(s) ['graphs']"),
    ("bad-sha256", _set("tokenizer.sha256", "xyz"), "tokenizer.sha256 must be 64 lowercase hex digits"),
    # issue 16, item 5: each crashed (a traceback) or said nothing useful
    ("max_positions-1e12", _set("model.max_positions", 10**12),
     "manifest.json: model.max_positions must be <= 65536, got 1000000000000"),
    ("max_positions-1e30", _set("model.max_positions", 10**30),
     "manifest.json: model.max_positions must be <= 65536, got a 31-digit number"),
    ("vocab_size-1e30", _set("model.vocab_size", 10**30), "manifest.json: model.vocab_size must be <= 4194304"),
    ("max_new_tokens-1e30", _set("max_new_tokens", 10**30), "manifest.json: max_new_tokens must be <= 65536"),
    ("truncated-decoder-inplace", _truncate_graph("decoder_inplace"),
     "decoder_inplace.onnx: onnxruntime cannot load it (variants.fp32.decoder_inplace in manifest.json)"),
    ("graph-error-not-utf8", _corrupt_graph("decoder_inplace", b"GroupQueryAttention", b"GroupQueryAttenti\xffn"),
     "decoder_inplace.onnx: onnxruntime cannot load it (variants.fp32.decoder_inplace in manifest.json): its error "
     "message is not valid UTF-8 (the file is corrupted)"),
    ("nested-100000-deep", _nested(100_000), "manifest.json: nested more than 32 levels deep"),
    ("nested-100-deep", _nested(100), "manifest.json: nested more than 32 levels deep"),
    ("digest-not-utf8", _digest_file(b"\xff\xfe\x00bad  manifest.json\n"),
     "bundle.sha256: not text (byte 0 is not ASCII)"),
    ("digest-huge", _digest_file(b"0" * 10_000), "bundle.sha256: more than 4096 bytes"),
    ("manifest-over-1MiB", _padded((1 << 20) + 1), "manifest.json: 1048577 bytes, more than a manifest may have"),
]


def _bundle(tiny_bundle: Path, tmp_path: Path, edit=None) -> Path:
    out = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, out, ignore=shutil.ignore_patterns("verified.json"))
    data = json.loads((out / MANIFEST).read_text())
    replaced = edit(out, data) if edit is not None else None
    data = data if replaced is None else replaced
    digest = data.pop(DIGEST, None) if isinstance(data, dict) else None
    blob = data if isinstance(data, Raw) else json.dumps(data, indent=2).encode()
    (out / MANIFEST).write_bytes(blob)
    (out / DIGEST).write_text(f"{hashlib.sha256(blob).hexdigest()}  {MANIFEST}\n")  # as export writes it
    if digest is not None:
        (out / DIGEST).write_bytes(digest)
    return out


@pytest.mark.parametrize("edit, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_serve_and_verify_exit_2_naming_the_problem(tiny_bundle, tmp_path, capsys, edit, message):
    bundle = _bundle(tiny_bundle, tmp_path, edit)
    for argv in (["serve", "--bundle", str(bundle), "--port", "0", "--metrics-port", "-1", "--device", "cpu"],
                 ["verify", str(bundle), "--quiet"]):
        assert main(argv) == 2, argv[0]
        err = capsys.readouterr().err
        assert f"seqserve {argv[0]}: error: " in err and message in err, (argv[0], err)
        print(f"\nexit 2: {err.strip().replace(str(bundle) + '/', '')}")  # docs/security.md lists these


def test_the_real_command_exits_2(tiny_bundle, tmp_path):
    bundle = _bundle(tiny_bundle, tmp_path, _set("model.d_model", "64"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEQSERVE_")}
    done = subprocess.run([sys.executable, "-m", "seqserve.cli", "serve", "--bundle", str(bundle), "--port", "0",
                           "--metrics-port", "-1"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "model.d_model must be an integer" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_manifest_digest_is_checked(tiny_bundle, tmp_path, capsys):
    bundle = _bundle(tiny_bundle, tmp_path)
    assert load_manifest(bundle).max_new_tokens > 0
    assert subprocess.run(["sha256sum", "--check", "--quiet", DIGEST], cwd=bundle).returncode == 0  # standard format
    data = json.loads((bundle / MANIFEST).read_text())
    data["max_new_tokens"] -= 1  # a plausible edit that every schema check accepts
    (bundle / MANIFEST).write_text(json.dumps(data, indent=2))
    with pytest.raises(IntegrityError, match=r"manifest\.json: sha256 .* does not match bundle\.sha256"):
        load_manifest(bundle)
    assert main(["serve", "--bundle", str(bundle), "--port", "0", "--metrics-port", "-1"]) == 2
    assert "does not match bundle.sha256" in capsys.readouterr().err
    assert main(["verify", str(bundle), "--quiet"]) == 1  # an integrity failure: verify reports it in its table
    assert "does not match bundle.sha256" in capsys.readouterr().out


def test_manifest_save_writes_the_digest(tiny_bundle, tmp_path):
    bundle = _bundle(tiny_bundle, tmp_path)
    (bundle / DIGEST).unlink()
    manifest = load_manifest(bundle)  # an older bundle without a digest still loads (with a warning)
    manifest.save(bundle)
    assert (bundle / DIGEST).read_text() == f"{hashlib.sha256((bundle / MANIFEST).read_bytes()).hexdigest()}  " \
                                            f"{MANIFEST}\n"
    assert load_manifest(bundle).to_json() == manifest.to_json()
    assert issubclass(IntegrityError, BundleError)
