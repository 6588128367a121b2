"""Real strings a converted tokenizer is compared with its original on (`seqserve verify --hf`, and the import's
tests): number sentences in four languages (model/corpus.py), English sentences from the docstrings of Python's
builtins and a few standard modules, and odd cases (whitespace runs, NBSP, emoji, CJK, combining marks, the empty
string). Deterministic wherever Python 3.11 runs.
"""
from __future__ import annotations

import random

from seqserve.model.corpus import KINDS, LANGS, make_example

SEED = 0
# Odd inputs a tokenizer must encode exactly as the original does (whitespace runs, invisible characters, scripts
# and symbols the tokenizers never saw in training).
ODD_STRINGS = (
    "", " ", "  ", "\t", "\n", "a", " leading space", "trailing space ", "  both  ", "two  spaces inside",
    "tab\tinside", "new\nline", "carriage\r\nreturn", "mixed \t \n whitespace", "non\u00a0breaking\u00a0space",
    "narrow\u202fno-break", "zero\u200bwidth", "em\u2003space", "ideographic\u3000space", "Straße und Fuß",
    "Ärger über Öl", "café crème brûlée", "¿Dónde está el baño? ¡Mañana!", "Ça va, garçon ?",
    "cafe\u0301 (combining acute)", "ﬁ ligature", "ｆｕｌｌｗｉｄｔｈ",
    "日本語のテキスト", "中文句子。", "한국어 문장", "Привет, мир!", "Γειά σου κόσμε", "שלום עולם", "مرحبا بالعالم",
    "emoji 😀 here", "flags 🇫🇷🇩🇪", "family 👨‍👩‍👧", "math ∑ x² ≤ ∞", "quotes “curly” ‘single’ «guillemets»",
    "dash – and — and ‐", "ellipsis… and ...", "price: 12,50 € / $3.99 / £7", "C:\\path\\to\\file.txt",
    "https://example.com/a?b=c&d=e#f", "<html> & </html>", "{\"json\": [1, 2.5, null]}", "1234567890",
    "ALL CAPS SENTENCE.", "MiXeD cAsE", "tab at end\t", "\tleading tab", "punctuation!!!???", "a,b;c:d.e",
    "trailing newline\n", "   ", "control\x07char", "soft\u00adhyphen", "right-to-left \u200fmark",
)


def real_strings(seed: int = SEED) -> list[str]:
    """>= 1,000 distinct real strings, deterministic wherever Python 3.11 runs (see the module docstring)."""
    seen: dict[str, None] = {}
    for text in [*_verbalised(seed, 400), *_docstring_sentences(), *ODD_STRINGS]:
        seen.setdefault(text)
    return list(seen)

def pairs(seed: int, n: int) -> list[tuple[str, str]]:
    """n (source, target) number sentences of model/corpus.py, seeded."""
    rng = random.Random(seed)
    return [make_example(rng, rng.choice(LANGS), rng.choice(KINDS)) for _ in range(n)]


def _verbalised(seed: int, n: int) -> list[str]:
    return [text for pair in pairs(seed, n) for text in pair]


def _docstring_sentences(limit: int = 900) -> list[str]:
    """English lines from the docstrings of builtins and a few stdlib modules, in a fixed order."""
    import builtins
    import collections
    import itertools
    import json as json_module
    import os
    import re
    import string
    import textwrap

    lines: list[str] = []
    for owner in (builtins, str, bytes, list, dict, set, int, float, os.path, re, json_module, collections,
                  itertools, textwrap, string):
        for name in sorted(dir(owner)):
            doc = getattr(getattr(owner, name, None), "__doc__", None)
            if not isinstance(doc, str):
                continue
            for line in doc.splitlines():
                line = line.strip()
                if 20 <= len(line) <= 200 and any(c.isalpha() for c in line):
                    lines.append(line)
    return list(dict.fromkeys(lines))[:limit]
