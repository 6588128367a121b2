"""`seqserve verify --hf` compares the bundle's tokenizer with transformers' own, not only the logits: a bundle whose
tokenizer was converted from another sentencepiece model than the directory's fails naming the first string that
differs, while the logits still agree."""
from __future__ import annotations

import hf_fixtures
import pytest

from seqserve.checks.hf_parity import TOKENIZER_CHECK
from seqserve.cli.main import main

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")


def _verify(bundle, checkpoint, hf, capsys) -> tuple[int, dict[str, str]]:
    """(exit status, check name -> its table line)."""
    rc = main(["verify", str(bundle), "--checkpoint", str(checkpoint), "--hf", str(hf), "--quiet", "--threads", "1",
               "--n", "4", "--quality-n", "4"])
    lines = capsys.readouterr().out.splitlines()
    return rc, {name: next((line for line in lines if line.startswith(name)), f"no {name!r} row")
                for name in (TOKENIZER_CHECK, "PyTorch vs transformers")}


def test_verify_hf_fails_on_a_tokenizer_converted_from_another_spm(tmp_path, capsys):
    hf = hf_fixtures.build_marian(tmp_path / "hf")
    assert main(["import", str(hf), "--out", str(tmp_path / "ck"), "--quiet", "--no-verify"]) == 0
    assert main(["export", str(tmp_path / "ck"), "--out", str(tmp_path / "bundle"), "--quiet"]) == 0
    rc, rows = _verify(tmp_path / "bundle", tmp_path / "ck", hf, capsys)
    assert rc == 0 and rows[TOKENIZER_CHECK].endswith("ok"), rows
    assert f"{len(hf_fixtures.real_strings())}/{len(hf_fixtures.real_strings())} strings identical" in \
        rows[TOKENIZER_CHECK]

    # The directory's source.spm is now another one (trained on the other half of the strings): the bundle's
    # tokenizer was converted from a model that is not the directory's, the weights are the same.
    other = [s for s in hf_fixtures.real_strings()[1::2] if s.strip()]
    (hf / "source.spm").write_bytes(hf_fixtures._train_sentencepiece(other, hf_fixtures.TINY.vocab))
    rc, rows = _verify(tmp_path / "bundle", tmp_path / "ck", hf, capsys)
    assert rc == 1 and rows[TOKENIZER_CHECK].endswith("FAIL"), rows
    first = hf_fixtures.real_strings()[0]
    assert f"string 0 {first[:60]!r} differs" in rows[TOKENIZER_CHECK]
    assert rows["PyTorch vs transformers"].endswith("ok"), rows  # the logits alone cannot see it
