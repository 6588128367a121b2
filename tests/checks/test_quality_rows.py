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


def _exact_match_value(quality: dict, variant: str) -> str:
    return next(r.value for r in _quality_rows(quality) if r.check == "exact match (engine)" and r.subject == variant)


def test_a_variant_below_fp32_is_printed_as_a_drop_and_one_above_as_a_gain():
    """fp32 1.80% and int8 1.40% is 0.40 points lost: the row must not read +0.40."""
    fp32 = {**_entry(True), "exact_match": 0.018}
    lower = {**_entry(True), "exact_match": 0.014, "exact_match_drop_points": 0.4}
    higher = {**_entry(True), "exact_match": 0.022, "exact_match_drop_points": -0.4}
    assert _exact_match_value({"fp32": fp32, "int8": lower}, "int8") == "1.40% (-0.40 pt vs fp32)"
    assert _exact_match_value({"fp32": fp32, "int8": higher}, "int8") == "2.20% (+0.40 pt vs fp32)"
