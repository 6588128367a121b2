"""verify's rows for the variants against fp32: agreement measured on non-finite logits is no agreement."""
from __future__ import annotations

from seqserve.checks.verify import _quality_rows


def _entry(nan_free: bool) -> dict:
    return {"n": 10, "exact_match": 1.0, "exact_match_drop_points": 0.0, "top1_agreement": 1.0, "top1_steps": 50,
            "nan_free": nan_free}


def _failed(quality: dict) -> set[tuple[str, str]]:
    return {(r.check, r.subject) for r in _quality_rows(quality) if not r.ok}


def test_finite_variants_that_agree_pass():
    assert _failed({"fp32": _entry(True), "int8": _entry(True)}) == set()


def test_agreement_with_a_nan_fp32_fails_the_variants_rows_too():
    """NaN argmaxes are equal on both sides: 100% top-1 agreement and equal outputs say nothing then."""
    assert _failed({"fp32": _entry(False), "int8": _entry(True)}) == {
        ("no NaN: held-out teacher forcing", "fp32"), ("exact match (engine)", "int8"),
        ("top-1 agreement vs fp32", "int8")}
    assert _failed({"fp32": _entry(True), "int8": _entry(False)}) == {
        ("no NaN: held-out teacher forcing", "int8"), ("exact match (engine)", "int8"),
        ("top-1 agreement vs fp32", "int8")}
