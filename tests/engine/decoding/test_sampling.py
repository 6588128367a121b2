"""Next-token choice on hand-made logits: each decoding option changes exactly what it names."""
from __future__ import annotations

import numpy as np

from seqserve.engine.decoding.sampling import sample_row
from seqserve.engine.decoding.token_rules import TokenRules
from seqserve.engine.request import SamplingParams

EOS = 0
NONE = np.array([], np.int64)  # no banned ids: every token of these tiny vocabularies is a real one
RULES = TokenRules.for_request(EOS, NONE)  # the request-level rules alone
PROBS = np.array([0.05, 0.5, 0.3, 0.15])  # token 1 most likely, then 2, 3, and the end token 0


def draws(n: int = 400, output_ids: tuple[int, ...] = (), logits: np.ndarray = np.log(PROBS), **options) -> set[int]:
    """The tokens chosen over n independently seeded requests."""
    chosen = set()
    for seed in range(n):
        params = SamplingParams(seed=seed, **options)
        chosen.add(sample_row(logits.astype(np.float32), params, np.random.default_rng(params.seed),
                              np.array(output_ids, np.int64), RULES))
    return chosen


def test_temperature_samples_every_token_and_greedy_only_the_best():
    assert draws(temperature=1.0) == {0, 1, 2, 3}
    assert draws(temperature=0.0, repetition_penalty=1.01) == {1}  # temperature 0 is argmax even on the slow path


def test_top_k_keeps_the_k_most_likely():
    assert draws(temperature=1.0, top_k=2) == {1, 2}
    assert draws(temperature=5.0, top_k=1) == {1}


def test_top_p_keeps_the_smallest_set_reaching_p():
    assert draws(temperature=1.0, top_p=0.5) == {1}  # 0.5 alone reaches 0.5
    assert draws(temperature=1.0, top_p=0.7) == {1, 2}  # 0.5 + 0.3
    assert draws(temperature=1.0, top_p=0.9) == {1, 2, 3}


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    logits = np.array([-5.0, 2.0, 1.5, -1.0])
    assert draws(1, logits=logits, repetition_penalty=1.0001, output_ids=(1,)) == {1}
    assert draws(1, logits=logits, repetition_penalty=2.0, output_ids=(1,)) == {2}  # 2.0 / 2 < 1.5
    negative = np.array([-5.0, -1.0, -1.5, -9.0])
    assert draws(1, logits=negative, repetition_penalty=2.0, output_ids=(1,)) == {2}  # -1.0 * 2 < -1.5


def test_min_new_tokens_suppresses_the_end_token_until_reached():
    eos_first = np.log(np.array([0.9, 0.05, 0.03, 0.02]))
    assert draws(1, logits=eos_first, min_new_tokens=2, output_ids=(1,)) == {1}
    assert draws(1, logits=eos_first, min_new_tokens=2, output_ids=(1, 2)) == {EOS}


def test_a_seeded_request_draws_the_same_tokens_whatever_its_batch_mates():
    logits = np.log(np.tile(PROBS, (3, 1))).astype(np.float32)  # (B, V)

    def run(batch: list[SamplingParams], steps: int = 12) -> list[list[int]]:
        rngs, outputs = [np.random.default_rng(p.seed) for p in batch], [[] for _ in batch]
        for _ in range(steps):
            chosen = logits[: len(batch)].argmax(axis=-1)  # (B,) greedy rows: the argmax (engine/decoding/greedy.py)
            for i, p in enumerate(batch):
                if not p.greedy:
                    chosen[i] = sample_row(logits[i], p, rngs[i], np.array(outputs[i], np.int64), RULES)
            for out, token in zip(outputs, chosen.tolist()):
                out.append(token)
        return outputs

    options = SamplingParams(temperature=1.0, seed=7)
    [alone] = run([options])
    mates = run([SamplingParams(temperature=2.0, seed=1), SamplingParams(), options])
    assert mates[2] == alone and len(set(alone)) > 1
    assert mates[1] == [1] * 12  # the greedy mate takes the argmax every step


def test_sampling_never_returns_the_banned_ids():
    """pad, bos and unk are masked before sampling, however likely the model makes them."""
    special_first = np.log(np.array([0.02, 0.9, 0.05, 0.03]))  # token 1 (say <pad>) dominates
    params = SamplingParams(temperature=1.0, seed=3)
    rng, rules = np.random.default_rng(params.seed), TokenRules.for_request(EOS, np.array([1], np.int64))
    assert {sample_row(special_first.astype(np.float32), params, rng, NONE, rules) for _ in range(300)} == {0, 2, 3}
