"""Written and spoken forms of numbers, ordinals, years, decimals, euro amounts and dates in en, fr, de and es.

The written form follows babel's locale conventions (grouping, decimal separator, currency layout); the spoken
form comes from num2words, fed exact ints/Decimals so the words always match the written digits.
"""
from __future__ import annotations

import datetime as dt
import random
import re
from decimal import Decimal
from functools import lru_cache

from babel import Locale
from babel.dates import get_month_names
from babel.numbers import format_currency, format_decimal
from num2words import num2words

LANGS: tuple[str, ...] = ("en", "fr", "de", "es")
KINDS: tuple[str, ...] = ("cardinal", "ordinal", "year", "decimal", "currency", "date")
Pair = tuple[str, str]  # (source, target)
Value = int | Decimal | dt.date  # int for cardinal/ordinal/year, Decimal for decimal/currency, date for date

MAX_CARDINAL = 9_999_999
MAX_ORDINAL = 1000
YEARS = (1000, 2099)
DATE_RANGE = (dt.date(1900, 1, 1), dt.date(2099, 12, 31))
MAX_AMOUNT_DIGITS = 5  # decimals and euro amounts stay below 100,000

# babel's fr grouping uses U+202F and its currency layout U+00A0; plain spaces keep the corpus typeable.
_SPACES = str.maketrans({"\u202f": " ", "\u00a0": " "})
# 1-2 decimals, the last non-zero: babel and num2words both drop trailing zeros, so "12.50" would not be exact.
_DECIMAL_RE = re.compile(r"^\d+\.\d?[1-9]$")


@lru_cache(maxsize=None)
def _locale(lang: str) -> Locale:
    # Parsing a locale per call would dominate generation time.
    return Locale.parse(lang)


@lru_cache(maxsize=None)
def _months(lang: str) -> dict[int, str]:
    # babel already lowercases month names where the language does (fr, es) and capitalises them in en, de.
    return dict(get_month_names("wide", locale=_locale(lang)))


def _check_lang_kind(lang: str, kind: str) -> None:
    if lang not in LANGS:
        raise ValueError(f"unknown language {lang!r}; expected one of {LANGS}")
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {KINDS}")


def _log_uniform_int(rng: random.Random, max_digits: int) -> int:
    """Uniform digit count, then uniform value: 7 and 7,654,321 are equally likely kinds of number."""
    digits = rng.randint(1, max_digits)
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def sample_value(rng: random.Random, kind: str) -> Value:
    """A random value of the given kind, in the ranges the corpus covers."""
    if kind == "cardinal":
        return _log_uniform_int(rng, len(str(MAX_CARDINAL)))
    if kind == "ordinal":
        return rng.randint(1, MAX_ORDINAL)
    if kind == "year":
        return rng.randint(*YEARS)
    if kind == "decimal":
        places = rng.randint(1, 2)
        frac = rng.randint(0, 10 ** (places - 1) - 1) * 10 + rng.randint(1, 9)  # last decimal never 0
        return Decimal(f"{_log_uniform_int(rng, MAX_AMOUNT_DIGITS)}.{frac:0{places}d}")
    if kind == "currency":
        return Decimal(f"{_log_uniform_int(rng, MAX_AMOUNT_DIGITS)}.{rng.randint(0, 99):02d}")
    if kind == "date":
        first, last = (d.toordinal() for d in DATE_RANGE)
        return dt.date.fromordinal(rng.randint(first, last))
    raise ValueError(f"unknown kind {kind!r}; expected one of {KINDS}")


def _ordinal_suffix_en(n: int) -> str:
    if n % 100 in (11, 12, 13):
        return "th"
    return {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


def _written_ordinal(lang: str, n: int) -> str:
    # Plain digits (no grouping) as ordinals are usually written: 1000th, 1000e, 1000., 1000.º
    if lang == "en":
        return f"{n}{_ordinal_suffix_en(n)}"
    if lang == "fr":
        return "1er" if n == 1 else f"{n}e"
    return f"{n}." if lang == "de" else f"{n}.º"


def _check_value(kind: str, value: Value) -> None:
    """Rejects values whose written form would not carry exactly the digits the words say."""
    ok = {
        "cardinal": lambda v: isinstance(v, int) and 0 <= v <= MAX_CARDINAL,
        "ordinal": lambda v: isinstance(v, int) and 1 <= v <= MAX_ORDINAL,
        "year": lambda v: isinstance(v, int) and YEARS[0] <= v <= YEARS[1],
        "decimal": lambda v: isinstance(v, Decimal) and bool(_DECIMAL_RE.match(str(v))),
        "currency": lambda v: isinstance(v, Decimal) and v >= 0 and v.as_tuple().exponent == -2,
        "date": lambda v: isinstance(v, dt.date) and DATE_RANGE[0] <= v <= DATE_RANGE[1],
    }[kind]
    if isinstance(value, bool) or not ok(value):
        raise ValueError(f"value {value!r} is out of range or of the wrong type for kind {kind!r}")


def written(lang: str, kind: str, value: Value) -> str:
    """The source string: language tag, a space, and the value as it is written in that locale."""
    _check_lang_kind(lang, kind)
    _check_value(kind, value)
    loc = _locale(lang)
    if kind in ("cardinal", "decimal"):
        text = format_decimal(value, locale=loc)
    elif kind == "ordinal":
        text = _written_ordinal(lang, value)
    elif kind == "year":
        text = str(value)
    elif kind == "currency":
        text = format_currency(value, "EUR", locale=loc)
    else:
        text = value.isoformat()
    return f"<{lang}> {text.translate(_SPACES)}"


def _spoken_date(lang: str, d: dt.date) -> str:
    """One convention per language, as read aloud: day, month name, year (num2words' 'year' reading).

    en: "the fifth of March, twenty twenty-four"
    fr: "le cinq mars deux mille vingt-quatre" ("le premier mars" on the 1st)
    de: "fünfter März zweitausendvierundzwanzig" (strong ordinal, no article)
    es: "cinco de marzo de dos mil veinticuatro" ("uno de marzo" on the 1st, as in Spain)
    """
    month, year = _months(lang)[d.month], num2words(d.year, lang=lang, to="year")
    if lang == "en":
        return f"the {num2words(d.day, lang='en', to='ordinal')} of {month}, {year}"
    if lang == "fr":
        day = num2words(1, lang="fr", to="ordinal") if d.day == 1 else num2words(d.day, lang="fr")
        return f"le {day} {month} {year}"
    if lang == "de":
        # num2words gives the weak form ("fünfte"); without an article German uses the strong form ("fünfter").
        return f"{num2words(d.day, lang='de', to='ordinal')}r {month} {year}"
    return f"{num2words(d.day, lang='es')} de {month} de {year}"


def spoken(lang: str, kind: str, value: Value) -> str:
    """The target string: the value read aloud in that language."""
    _check_lang_kind(lang, kind)
    _check_value(kind, value)
    if kind == "date":
        return _spoken_date(lang, value)
    if kind == "currency":
        return num2words(value, lang=lang, to="currency", currency="EUR")
    # num2words supports to="year" in all four languages (fr and es read years as plain cardinals).
    to = {"ordinal": "ordinal", "year": "year"}.get(kind, "cardinal")
    return num2words(value, lang=lang, to=to)  # a Decimal keeps "12.05" exact: "twelve point zero five"


def verbalise(lang: str, kind: str, value: Value) -> Pair:
    """(source, target) for one value, e.g. ("<fr> 3e", "troisième")."""
    return written(lang, kind, value), spoken(lang, kind, value)
