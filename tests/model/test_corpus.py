"""The generated corpora, TSV I/O and splitting: disjointness, determinism, and hand-checked verbalisations."""
from __future__ import annotations

import datetime as dt
import random
import re
from decimal import Decimal
from pathlib import Path

import pytest

from seqserve.contract.tsv import CorpusError, read_tsv, write_tsv
from seqserve.model.corpus import (
    COPY_ALPHABET,
    KINDS,
    LANGS,
    CorpusConfig,
    copy_task_splits,
    generate_splits,
    make_example,
    split_pairs,
    verbalise,
)
from seqserve.model.tokenizer import train_tokenizer

SMALL = CorpusConfig(n_train=1500, n_valid=200, n_test=300, seed=0)


@pytest.fixture(scope="module")
def splits() -> dict[str, list[tuple[str, str]]]:
    return generate_splits(SMALL)


def classify(source: str) -> tuple[str, str]:
    """(lang, kind) recovered from the written form alone, by rules written independently of the generator."""
    m = re.fullmatch(r"<(en|fr|de|es)> (\S.*)", source)
    assert m, source
    lang, text = m.groups()
    decimal_sep = "." if lang == "en" else ","
    if re.fullmatch(r"\d{4}-\d\d-\d\d", text):
        return lang, "date"
    if "€" in text:
        return lang, "currency"
    if re.fullmatch({"en": r"\d+(st|nd|rd|th)", "fr": r"\d+(er|e)", "de": r"\d+\.", "es": r"\d+\.º"}[lang], text):
        return lang, "ordinal"
    if re.fullmatch(r"(1\d|20)\d\d", text):  # cardinals of 4 digits are always grouped, years never
        return lang, "year"
    if re.search(re.escape(decimal_sep) + r"\d{1,2}$", text):
        return lang, "decimal"
    return lang, "cardinal"


def test_splits_have_requested_sizes_and_are_disjoint_by_source(splits):
    assert {k: len(v) for k, v in splits.items()} == {"train": 1500, "valid": 200, "test": 300}
    sources = {name: [s for s, _ in pairs] for name, pairs in splits.items()}
    for name, srcs in sources.items():
        assert len(set(srcs)) == len(srcs), f"duplicate source inside {name}"
    assert not set(sources["train"]) & set(sources["valid"])
    assert not set(sources["train"]) & set(sources["test"])
    assert not set(sources["valid"]) & set(sources["test"])


def test_splits_are_reproducible_from_the_seed(splits):
    assert generate_splits(SMALL) == splits
    other = generate_splits(CorpusConfig(n_train=1500, n_valid=200, n_test=300, seed=1))
    assert other["train"] != splits["train"] and other["test"] != splits["test"]


def test_every_language_and_kind_appears_and_text_is_clean(splits):
    every = {(lang, kind) for lang in LANGS for kind in KINDS}
    assert {classify(s) for s, _ in splits["train"]} == every
    assert {classify(s) for s, _ in splits["test"]} == every
    for pairs in splits.values():
        for src, tgt in pairs:
            assert re.match(r"<(en|fr|de|es)> \S", src)
            assert tgt.strip() == tgt and tgt
            assert not re.search("[\t\n\r\u00a0\u202f]", src + tgt)


def test_config_restricts_languages_and_kinds():
    out = generate_splits(CorpusConfig(n_train=200, n_valid=10, n_test=10, langs=("de",), kinds=("date", "ordinal")))
    kinds = {classify(s) for pairs in out.values() for s, _ in pairs}
    assert kinds == {("de", "date"), ("de", "ordinal")}


def test_exhausted_value_spaces_are_used_up_then_reported():
    # Only 1000 English ordinals exist: 950 must be found, 1001 cannot be.
    ok = generate_splits(CorpusConfig(n_train=900, n_valid=25, n_test=25, langs=("en",), kinds=("ordinal",)))
    assert sum(map(len, ok.values())) == 950
    with pytest.raises(ValueError, match="distinct sources"):
        generate_splits(CorpusConfig(n_train=1001, n_valid=0, n_test=0, langs=("en",), kinds=("ordinal",)))


def test_make_example_is_deterministic_and_tagged():
    a = [make_example(random.Random(7), lang, kind) for lang in LANGS for kind in KINDS]
    b = [make_example(random.Random(7), lang, kind) for lang in LANGS for kind in KINDS]
    assert a == b
    assert all(classify(src) == (lang, kind) for (src, _), (lang, kind) in
               zip(a, [(lang, kind) for lang in LANGS for kind in KINDS]))


@pytest.mark.parametrize("lang, kind, value, expected", [
    ("en", "cardinal", 1234567, ("<en> 1,234,567",
                                 "one million, two hundred and thirty-four thousand, five hundred and sixty-seven")),
    ("fr", "cardinal", 1234567, ("<fr> 1 234 567", "un million deux cent trente-quatre mille cinq cent soixante-sept")),
    ("de", "cardinal", 1234567,
     ("<de> 1.234.567", "eine Million zweihundertvierunddreißigtausendfünfhundertsiebenundsechzig")),
    ("es", "cardinal", 1234567,
     ("<es> 1.234.567", "un millón doscientos treinta y cuatro mil quinientos sesenta y siete")),
    ("en", "cardinal", 0, ("<en> 0", "zero")),
    ("en", "ordinal", 22, ("<en> 22nd", "twenty-second")),
    ("en", "ordinal", 11, ("<en> 11th", "eleventh")),
    ("en", "ordinal", 101, ("<en> 101st", "one hundred and first")),
    ("fr", "ordinal", 1, ("<fr> 1er", "premier")),
    ("fr", "ordinal", 3, ("<fr> 3e", "troisième")),
    ("de", "ordinal", 3, ("<de> 3.", "dritte")),
    ("es", "ordinal", 3, ("<es> 3.º", "tercero")),
    ("en", "year", 1987, ("<en> 1987", "nineteen eighty-seven")),
    ("fr", "year", 1987, ("<fr> 1987", "mille neuf cent quatre-vingt-sept")),
    ("de", "year", 1987, ("<de> 1987", "neunzehnhundertsiebenundachtzig")),
    ("es", "year", 2024, ("<es> 2024", "dos mil veinticuatro")),
    ("en", "decimal", Decimal("12.05"), ("<en> 12.05", "twelve point zero five")),
    ("fr", "decimal", Decimal("12.05"), ("<fr> 12,05", "douze virgule zéro cinq")),
    ("de", "decimal", Decimal("1234.5"), ("<de> 1.234,5", "eintausendzweihundertvierunddreißig Komma fünf")),
    ("es", "decimal", Decimal("0.5"), ("<es> 0,5", "cero punto cinco")),
    ("en", "currency", Decimal("12.50"), ("<en> €12.50", "twelve euro, fifty cents")),
    ("fr", "currency", Decimal("1234.99"),
     ("<fr> 1 234,99 €", "mille deux cent trente-quatre euros et quatre-vingt-dix-neuf centimes")),
    ("de", "currency", Decimal("12.05"), ("<de> 12,05 €", "zwölf Euro und fünf Cent")),
    ("es", "currency", Decimal("12.50"), ("<es> 12,50 €", "doce euros con cincuenta céntimos")),
    ("en", "date", dt.date(2024, 3, 5), ("<en> 2024-03-05", "the fifth of March, twenty twenty-four")),
    ("fr", "date", dt.date(2024, 3, 1), ("<fr> 2024-03-01", "le premier mars deux mille vingt-quatre")),
    ("fr", "date", dt.date(1999, 12, 31),
     ("<fr> 1999-12-31", "le trente et un décembre mille neuf cent quatre-vingt-dix-neuf")),
    ("de", "date", dt.date(2024, 3, 5), ("<de> 2024-03-05", "fünfter März zweitausendvierundzwanzig")),
    ("es", "date", dt.date(2024, 3, 5), ("<es> 2024-03-05", "cinco de marzo de dos mil veinticuatro")),
])
def test_hand_checked_verbalisations(lang, kind, value, expected):
    assert verbalise(lang, kind, value) == expected


@pytest.mark.parametrize("lang, kind, value", [
    ("en", "decimal", Decimal("1.234")),  # three decimals: babel would round what num2words reads in full
    ("en", "decimal", Decimal("12.50")),  # trailing zero: babel writes 12.5 but the value claims two places
    ("en", "ordinal", 0),
    ("en", "cardinal", 10_000_000),
    ("en", "currency", Decimal("12.5")),
    ("xx", "cardinal", 1),
    ("en", "fraction", 1),
])
def test_verbalise_rejects_values_it_cannot_write_exactly(lang, kind, value):
    with pytest.raises(ValueError):
        verbalise(lang, kind, value)


DIGIT_WORDS = {"en": "zero one two three four five six seven eight nine".split(),
               "fr": "zéro un deux trois quatre cinq six sept huit neuf".split()}


@pytest.mark.parametrize("lang, point", [("en", " point "), ("fr", " virgule ")])
def test_decimal_words_spell_exactly_the_written_decimals(splits, lang, point):
    decimals = [(s, t) for pairs in splits.values() for s, t in pairs if classify(s) == (lang, "decimal")]
    assert len(decimals) > 20
    sep = "." if lang == "en" else ","
    for src, tgt in decimals:
        written_frac = src.rsplit(sep, 1)[1]
        spoken_frac = tgt.split(point)[1].split()
        assert spoken_frac == [DIGIT_WORDS[lang][int(d)] for d in written_frac], (src, tgt)


def test_target_lengths_span_short_words_to_long_phrases(splits):
    tok = train_tokenizer([text for pair in splits["train"] for text in pair], vocab_size=500)
    lengths = [len(enc.ids) - 1 for enc in tok.encode_batch([t for _, t in splits["train"]])]  # minus EOS
    assert min(lengths) <= 2
    assert 20 <= max(lengths) <= 60


def test_read_tsv_parses_a_good_file(tmp_path: Path):
    path = tmp_path / "good.tsv"
    path.write_text("<en> 1\tone\r\n<fr> 2\tdeux\n\n  \n", encoding="utf-8")  # CRLF line, blank tail
    assert read_tsv(path) == [("<en> 1", "one"), ("<fr> 2", "deux")]


def test_read_tsv_lists_every_malformed_line(tmp_path: Path):
    path = tmp_path / "bad.tsv"
    lines = ["a\tb", "no tab here", "c\td", "e\tf", "g\th\ti", "j\tk"]  # lines 2 and 5 are malformed
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(CorpusError) as err:
        read_tsv(path)
    assert err.value.line_numbers == [2, 5]
    assert "bad.tsv" in str(err.value) and "2, 5" in str(err.value)


def test_read_tsv_rejects_empty_sides_and_truncates_long_reports(tmp_path: Path):
    path = tmp_path / "many.tsv"
    path.write_text("ok\tfine\n\tempty source\n" + "x\t \n" * 24 + "ok\tfine\n", encoding="utf-8")
    with pytest.raises(CorpusError) as err:
        read_tsv(path)
    assert err.value.line_numbers == list(range(2, 27))
    assert "and 5 more" in str(err.value) and ", 22" not in str(err.value)


def test_write_then_read_round_trips(tmp_path: Path, splits):
    pairs = splits["valid"] + [("<fr> «été» 🙂", "  spaced  words ")]
    write_tsv(pairs, tmp_path / "out.tsv")
    assert read_tsv(tmp_path / "out.tsv") == pairs
    with pytest.raises(ValueError):
        write_tsv([("a\tb", "c")], tmp_path / "never.tsv")


def test_split_pairs_dedupes_keeping_first_and_splits_disjointly():
    pairs = [(f"s{i}", f"t{i}") for i in range(200)] + [("s3", "other"), ("s7", "other")]
    out = split_pairs(pairs, seed=0, valid_fraction=0.1, test_fraction=0.05)
    assert [len(out[k]) for k in ("train", "valid", "test")] == [170, 20, 10]
    every = out["train"] + out["valid"] + out["test"]
    assert sorted(every) == sorted(pairs[:200])  # "other" targets were later duplicates
    assert split_pairs(pairs, seed=0, valid_fraction=0.1, test_fraction=0.05) == out
    assert split_pairs(pairs, seed=1, valid_fraction=0.1, test_fraction=0.05) != out


def test_copy_task_splits():
    out = copy_task_splits(500, 50, 50, seed=3, min_len=2, max_len=6)
    assert out == copy_task_splits(500, 50, 50, seed=3, min_len=2, max_len=6)
    sources = [s for pairs in out.values() for s, _ in pairs]
    assert len(sources) == len(set(sources)) == 600
    for pairs in out.values():
        for src, tgt in pairs:
            assert src == tgt
            symbols = src.split(" ")
            assert 2 <= len(symbols) <= 6 and all(len(c) == 1 and c in COPY_ALPHABET for c in symbols)
    with pytest.raises(ValueError):
        copy_task_splits(len(COPY_ALPHABET) + 1, 0, 0, min_len=1, max_len=1)  # only 26 one-symbol strings exist
