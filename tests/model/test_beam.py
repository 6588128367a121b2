"""The reference beam search: greedy at one beam, exhaustive search at full width, HF's scores and stopping rules."""
from __future__ import annotations

import itertools

import pytest
import torch

from seqserve.model.beam import (
    EOS,
    LENGTH,
    BeamOptions,
    SourceBeams,
    beam_search,
    greedy_logprobs,
    teacher_forced_logprobs,
)
from seqserve.model.config import ModelConfig
from seqserve.model.decoding import greedy_decode
from seqserve.model.transformer import Transformer

SOURCES = [[5, 9, 4, 2], [7, 2], [4, 4, 6, 8, 9, 5, 2], [6, 5, 2]]  # different lengths, each ending with the end token


def random_model(vocab: int, seed: int = 0, norm_first: bool = False) -> Transformer:
    """Untrained: a small vocabulary makes the end token likely, so both finish reasons occur."""
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab, d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=64,
                      dropout=0.0, max_positions=64, norm_first=norm_first)
    return Transformer(cfg).eval()


def sources_for(model: Transformer) -> list[list[int]]:
    v, eos = model.cfg.vocab_size, model.cfg.eos_id
    return [[t % v for t in s[:-1]] + [eos] for s in SOURCES]


def target(h) -> list[int]:
    """What a hypothesis was scored on: its ids and, when it ended so, the end token."""
    return h.token_ids + [2] * (h.finish_reason == EOS)


@pytest.mark.parametrize("vocab, seed, norm_first, reasons", [
    (40, 0, False, {LENGTH}), (6, 0, False, {EOS, LENGTH}), (6, 3, True, {EOS, LENGTH}), (7, 6, False, {EOS, LENGTH})])
def test_one_beam_is_greedy_decode(vocab, seed, norm_first, reasons):
    model = random_model(vocab, seed, norm_first)
    sources = sources_for(model)
    greedy = greedy_decode(model, sources, max_new_tokens=12)
    for hyps, ids in zip(beam_search(model, sources, BeamOptions(max_new_tokens=12)), greedy):
        (best,) = hyps
        assert best.token_ids == ids
        assert best.finish_reason == (EOS if len(ids) < 12 else LENGTH)
    assert {h.finish_reason for h in greedy_logprobs(model, sources, 12)} == reasons  # both kinds of finish seen


def _exhaustive(model, source, max_new, min_new, penalty) -> list[tuple[float, list[int], str]]:
    """Every complete hypothesis, scored from a teacher-forced forward: (score, ids, finish reason), best first."""
    cfg = model.cfg
    others = [t for t in range(cfg.vocab_size) if t != cfg.eos_id]
    targets = []
    for n in range(max_new):  # n tokens, then the end token (allowed once n >= min_new)
        targets += [list(p) + [cfg.eos_id] for p in itertools.product(others, repeat=n) if n >= min_new]
    targets += [list(p) for p in itertools.product(others, repeat=max_new)]  # stopped by the length
    logprobs = teacher_forced_logprobs(model, [source] * len(targets), targets)
    scored = [(sum(lp) / len(t) ** penalty, t[:-1] if t[-1] == cfg.eos_id else t,
               EOS if t[-1] == cfg.eos_id else LENGTH) for t, lp in zip(targets, logprobs)]
    return sorted(scored, key=lambda s: -s[0])


@pytest.mark.parametrize("penalty, min_new, early", [(1.0, 0, False), (0.0, 0, False), (2.0, 1, False),
                                                     (-0.5, 0, False), (1.0, 2, True)])
def test_full_width_equals_exhaustive_search(penalty, min_new, early):
    # 5 tokens, 3 steps: at most 4 * 4 * 5 = 80 candidates a step, so 80 beams rank every one of them in the
    # top num_beams; 85 complete hypotheses exist and the 80 best must come back in order.
    model = random_model(5, seed=4)
    width = 80
    opts = BeamOptions(max_new_tokens=3, min_new_tokens=min_new, num_beams=width, num_return_sequences=width,
                       length_penalty=penalty, early_stopping=early)
    for source in sources_for(model)[:2]:
        (hyps,) = beam_search(model, [source], opts)
        best = _exhaustive(model, source, 3, min_new, penalty)[:width]
        assert [(h.token_ids, h.finish_reason) for h in hyps] == [(ids, why) for _, ids, why in best]
        assert [h.score for h in hyps] == pytest.approx([s for s, _, _ in best], abs=1e-5)


@pytest.mark.parametrize("penalty", [1.0, 0.6])
def test_scores_are_sum_of_logprobs_over_length_recomputed_by_teacher_forcing(penalty):
    model = random_model(9, seed=2)
    sources = sources_for(model)
    opts = BeamOptions(max_new_tokens=10, num_beams=4, num_return_sequences=4, length_penalty=penalty, top_logprobs=3)
    results = beam_search(model, sources, opts)
    reasons = set()
    for source, hyps in zip(sources, results):
        assert len(hyps) == 4
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        forced = teacher_forced_logprobs(model, [source] * 4, [target(h) for h in hyps])
        for h, lp in zip(hyps, forced):
            reasons.add(h.finish_reason)
            assert h.token_logprobs == pytest.approx(lp, abs=1e-5)
            assert h.cumulative_logprob == pytest.approx(sum(lp), abs=1e-5)
            assert h.score == pytest.approx(sum(lp) / len(lp) ** penalty, abs=1e-5)  # len counts the end token
            assert len(h.token_ids) <= 10 and (h.finish_reason == EOS or len(h.token_ids) == 10)
            for chosen, lp_chosen, top in zip(target(h), h.token_logprobs, h.top_logprobs):
                assert len(top) == 3 and [v for _, v in top] == sorted((v for _, v in top), reverse=True)
                assert lp_chosen <= top[0][1] and (chosen not in dict(top) or dict(top)[chosen] == lp_chosen)
    assert reasons == {EOS, LENGTH}


def test_top_logprobs_are_the_models_most_likely_tokens():
    model = random_model(9, seed=6)
    source = sources_for(model)[0]
    (h,) = greedy_logprobs(model, [source], 6, top_logprobs=4)
    tgt = target(h)
    src = torch.tensor([source])
    tgt_in = torch.tensor([[model.cfg.bos_id] + tgt[:-1]])
    with torch.no_grad():
        dist = torch.log_softmax(model(src, torch.ones_like(src), tgt_in, torch.ones_like(tgt_in)), -1)[0]  # (T, V)
    for step, top in enumerate(h.top_logprobs):
        values, ids = dist[step].topk(4)
        assert [t for t, _ in top] == ids.tolist() and [v for _, v in top] == pytest.approx(values.tolist(), abs=1e-5)
        assert top[0][0] == tgt[step]  # greedy picks the most likely token


def test_greedy_logprobs_match_teacher_forcing_and_honour_min_new_tokens():
    model = random_model(9, seed=2)
    sources = sources_for(model)
    free = greedy_logprobs(model, sources, 8)
    forced = greedy_logprobs(model, sources, 8, min_new_tokens=5)
    assert any(len(h.token_ids) < 5 for h in free)  # without the floor some stop early...
    for h in forced:
        assert len(h.token_ids) >= 5 and len(h.token_logprobs) <= 8  # ...with it none does, and none runs past 8
    for hyps in (free, forced):
        for source, h, lp in zip(sources, hyps, teacher_forced_logprobs(model, sources, [target(h) for h in hyps])):
            assert h.token_logprobs == pytest.approx(lp, abs=1e-5)  # the model's own log_softmax, not renormalised


def test_a_batch_of_sources_equals_each_alone():
    model = random_model(8, seed=8, norm_first=True)
    sources = sources_for(model)
    opts = BeamOptions(max_new_tokens=9, num_beams=3, num_return_sequences=3, length_penalty=1.2)
    together = beam_search(model, sources, opts)
    for source, batched in zip(sources, together):
        (alone,) = beam_search(model, [source], opts)
        assert [(h.token_ids, h.finish_reason) for h in batched] == [(h.token_ids, h.finish_reason) for h in alone]
        assert [h.score for h in batched] == pytest.approx([h.score for h in alone], abs=1e-5)


# Hand-built log-probability tables (token 0 is the end token; a, b, c = 1, 2, 3), fed to one source's search.
A, B, C, END = 1, 2, 3, 0
MISSING = [-9.0] * 4


def _run(table: dict, **options) -> tuple[list[tuple[list[int], float]], int]:
    """(ids and score of each returned hypothesis, how many steps the search took)."""
    opts = BeamOptions(max_new_tokens=10, **options)
    search, steps = SourceBeams(opts, eos_id=END), 0
    while not search.done:
        search.advance(torch.tensor([table.get(b.tokens, MISSING) for b in search.live]))
        steps += 1
    return [(h.token_ids, h.score) for h in search.results()], steps


TABLE = {  # num_beams 2, length_penalty 1
    (): [-1.6, -0.5, -2.0, -9.0],  # a -0.5 (live), END -1.6 (finished: -1.6), b -2.0 (live)
    (A,): [-1.0, -0.2, -9.0, -9.0],  # a a -0.7 (rank 0), a END -1.5 (rank 1: finished -0.75)
    (B,): [-0.1, -9.0, -9.0, -9.0],  # b END -2.1 (rank 2: dropped, though -1.05 beats -1.6: HF keeps only the top 2)
    (A, A): [-0.05, -5.0, -5.0, -5.0],  # a a END -0.75 (finished -0.25); live a a a, a a b at -5.7
}


def test_early_stopping_true_stops_at_num_beams_finished_hypotheses():
    hyps, steps = _run(TABLE, num_beams=2, num_return_sequences=2, early_stopping=True)
    assert steps == 2 and hyps == [([A], pytest.approx(-0.75)), ([], pytest.approx(-1.6))]


def test_early_stopping_false_goes_on_while_a_live_beam_can_still_beat_the_worst():
    # After step 2 the best live beam (a a, -0.7) scores -0.7 / 2 = -0.35 at its current length > -1.6: go on.
    # After step 3 it is a a a at -5.7 / 3 = -1.9 <= -0.75: stop.
    hyps, steps = _run(TABLE, num_beams=2, num_return_sequences=2, early_stopping=False)
    assert steps == 3 and hyps == [([A, A], pytest.approx(-0.25)), ([A], pytest.approx(-0.75))]


def test_early_stopping_false_judges_live_beams_at_their_current_length():
    # END at once scores -0.5; the live beam a (-0.6) is judged at length 1: -0.6 <= -0.5, so the search stops,
    # although a END would have scored (-0.6 - 0.01) / 2 = -0.305 (HF's documented inexactness for penalty > 0).
    table = {(): [-0.5, -0.6, -9.0, -9.0], (A,): [-0.01, -9.0, -9.0, -9.0]}
    assert _run(table, num_beams=1) == ([([], pytest.approx(-0.5))], 1)
    # Penalty 0 scores are sums, which only fall: the same rule is then exact, and a END (-0.61) cannot win either.
    assert _run(table, num_beams=1, length_penalty=0.0) == ([([], pytest.approx(-0.5))], 1)


def test_length_stops_every_beam_and_scores_count_generated_tokens():
    table = {(): [-3.0, -0.1, -0.2, -9.0], (A,): [-3.0, -0.1, -0.3, -9.0], (B,): [-3.0, -0.4, -0.1, -9.0]}
    opts = BeamOptions(max_new_tokens=2, num_beams=2, num_return_sequences=2, length_penalty=1.0)
    search = SourceBeams(opts, eos_id=END)
    search.advance(torch.tensor([table[b.tokens] for b in search.live]))
    search.advance(torch.tensor([table[b.tokens] for b in search.live]))
    assert search.done and not search.live
    assert [(h.token_ids, h.finish_reason, h.score) for h in search.results()] == [
        ([A, A], LENGTH, pytest.approx(-0.1)), ([B, B], LENGTH, pytest.approx(-0.15))]


def test_options_are_checked():
    with pytest.raises(ValueError, match="num_return_sequences"):
        BeamOptions(max_new_tokens=4, num_beams=2, num_return_sequences=3)
    with pytest.raises(ValueError, match="min_new_tokens"):
        BeamOptions(max_new_tokens=4, min_new_tokens=5)
