"""Corpora: the default number-verbalisation task (generated from a seed), the tiny copy task, and TSV files.

Splits are disjoint by source string. Each new source is dealt to a split at random in proportion to the
split's free slots, so every value space (say the 1000 French ordinals) is shared between the splits in the same
proportion and valid/test follow the training distribution.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from seqserve.model.verbalise import KINDS, LANGS, Pair, sample_value, spoken, verbalise, written

__all__ = [
    "LANGS", "KINDS", "Pair", "CorpusConfig", "make_example", "verbalise", "generate_splits", "copy_task_splits",
    "split_pairs", "COPY_ALPHABET",
]

COPY_ALPHABET = "abcdefghijklmnop0123456789"  # small, so the tiny preset's vocabulary stays small
_MAX_REDRAWS = 200  # consecutive already-seen sources after which a (lang, kind) group counts as exhausted


@dataclass(frozen=True)
class CorpusConfig:
    n_train: int = 60_000
    n_valid: int = 1_000
    n_test: int = 2_000
    seed: int = 0
    langs: tuple[str, ...] = LANGS
    kinds: tuple[str, ...] = KINDS


def make_example(rng: random.Random, lang: str, kind: str) -> Pair:
    """One random (source, target) pair of the given language and kind."""
    return verbalise(lang, kind, sample_value(rng, kind))


# A draw returns a source and a thunk for its target, so targets are only computed for sources that are kept.
Draw = Callable[[random.Random, Hashable], tuple[str, Callable[[], str]]]


def _fill_splits(sizes: dict[str, int], rng: random.Random, groups: list[Hashable],
                 draw: Draw) -> dict[str, list[Pair]]:
    """Draws unique sources from uniformly chosen groups until every split is full.

    A group whose value space is used up (e.g. the 1000 ordinals of a language) is dropped after _MAX_REDRAWS
    consecutive repeats; if every group is used up first, the request cannot be met and ValueError says so.
    """
    if any(n < 0 for n in sizes.values()):
        raise ValueError(f"split sizes must be >= 0, got {sizes}")
    out: dict[str, list[Pair]] = {name: [] for name in sizes}
    seen: set[str] = set()  # every source kept so far, in any split
    redraws = dict.fromkeys(groups, 0)
    active = list(groups)
    while len(seen) < sum(sizes.values()):
        if not active:
            raise ValueError(f"only {len(seen)} distinct sources could be drawn for this configuration; "
                             f"{sum(sizes.values())} were requested")
        group = rng.choice(active)
        source, target = draw(rng, group)
        if source in seen:
            redraws[group] += 1
            if redraws[group] >= _MAX_REDRAWS:
                active.remove(group)
            continue
        redraws[group] = 0
        seen.add(source)
        # Weighting by free slots deals the unique sources out like a shuffled deck: no source is wasted and
        # each split gets the same mix of kinds, even when a value space runs out mid-way.
        names = list(out)
        name = rng.choices(names, [sizes[n] - len(out[n]) for n in names])[0]
        out[name].append((source, target()))
    return out


def _draw_verbalisation(rng: random.Random, group: Hashable) -> tuple[str, Callable[[], str]]:
    lang, kind = group  # type: ignore[misc]
    value = sample_value(rng, kind)
    return written(lang, kind, value), lambda: spoken(lang, kind, value)


def generate_splits(cfg: CorpusConfig) -> dict[str, list[Pair]]:
    """The default corpus: train/valid/test, disjoint by source, deterministic from cfg.seed."""
    groups: list[Hashable] = [(lang, kind) for lang in cfg.langs for kind in cfg.kinds]  # uniform lang and kind
    if not groups:
        raise ValueError("CorpusConfig needs at least one language and one kind")
    sizes = {"train": cfg.n_train, "valid": cfg.n_valid, "test": cfg.n_test}
    return _fill_splits(sizes, random.Random(cfg.seed), groups, _draw_verbalisation)


def copy_task_splits(n_train: int, n_valid: int, n_test: int, seed: int = 0, min_len: int = 1,
                     max_len: int = 16) -> dict[str, list[Pair]]:
    """The tiny preset's task: copy a string of space-separated symbols; disjoint by source, deterministic."""
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got {min_len}, {max_len}")

    def draw(rng: random.Random, length: Hashable) -> tuple[str, Callable[[], str]]:
        source = " ".join(rng.choices(COPY_ALPHABET, k=length))  # type: ignore[arg-type]
        return source, lambda: source

    sizes = {"train": n_train, "valid": n_valid, "test": n_test}
    return _fill_splits(sizes, random.Random(seed), list(range(min_len, max_len + 1)), draw)


def split_pairs(pairs: list[Pair], seed: int, valid_fraction: float = 0.05,
                test_fraction: float = 0.05) -> dict[str, list[Pair]]:
    """For a BYO corpus: dedupe by source (first wins), shuffle deterministically, split disjointly."""
    if valid_fraction < 0 or test_fraction < 0 or valid_fraction + test_fraction >= 1:
        raise ValueError(f"need fractions >= 0 summing below 1, got {valid_fraction}, {test_fraction}")
    first: dict[str, str] = {}
    for src, tgt in pairs:
        first.setdefault(src, tgt)  # keeps the first target; dict order keeps the result independent of hashing
    unique = list(first.items())
    rng = random.Random(seed)
    rng.shuffle(unique)
    n_test, n_valid = round(len(unique) * test_fraction), round(len(unique) * valid_fraction)
    return {"train": unique[n_test + n_valid:], "valid": unique[n_test:n_test + n_valid], "test": unique[:n_test]}
