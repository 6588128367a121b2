"""engine/decoding/beam.py's Beams against the PyTorch reference (model/beam.py's SourceBeams), step by step, on a
synthetic
model with many exact ties: every beam request of a changing batch gets the reference's n-best, exactly.

The synthetic model's logits are a function of the request and the row's own tokens so far (read back from the slot
map), so a beam continued from the wrong parent, a row reordered wrongly or a tie broken the other way changes the
result. The real Runner runs a real decoder step on the tiny bundle each step (its logits are replaced), so the KV
caches' reorder and the concat cache's compaction (rows moving between slots) happen as in serving.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from seqserve.engine.decoding.beam import Beams
from seqserve.engine.decoding.sampling import log_softmax
from seqserve.engine.decoding.token_rules import TokenRules
from seqserve.engine.request import Request, SamplingParams
from seqserve.engine.runtime.device import RuntimeConfig
from seqserve.engine.runtime.runner import Runner
from seqserve.engine.runtime.slots import Joining
from seqserve.engine.step.outputs import Outputs
from seqserve.model.beam import BeamOptions, SourceBeams

LEVELS = np.array([0.0, -0.5, -1.0, -1.5, -2.0, -4.0], np.float32)  # few values: ties everywhere, at any rank


def synthetic_logits(seed: int, prefix: list[int], vocab: int, eos: int) -> np.ndarray:
    """(V,) float32: half the prefixes draw from LEVELS (exact ties), half from a rounded normal (a few)."""
    rng = np.random.default_rng([seed, *prefix])
    if rng.random() < 0.5:
        x = rng.choice(LEVELS, vocab)
    else:
        x = np.round(rng.normal(0.0, 1.5, vocab), 1).astype(np.float32)
    end = rng.random()  # the end token often ties for the best, or ranks just behind the best candidates
    x[eos] = x.max() if end < 0.2 else x.max() - 0.3 if end < 0.6 else x[eos]
    return x


class SpacedIds:
    """A tokenizer whose text is the ids themselves, so each sequence's text names its tokens."""

    def decode(self, ids, skip_special_tokens=True) -> str:
        return " ".join(map(str, ids))


def reference(seed: int, opts: BeamOptions, vocab: int, eos: int):
    search = SourceBeams(opts, eos)
    while not search.done:
        table = np.stack([log_softmax(synthetic_logits(seed, list(b.tokens), vocab, eos)) for b in search.live])
        search.advance(torch.from_numpy(table))
    return search.results()


CASES = [  # (joins at step, num_beams, num_return_sequences, max_new, min_new, length_penalty, early_stopping, top)
    (0, 4, 4, 9, 0, 1.0, False, 3), (0, 2, 1, 6, 3, 0.0, True, 0), (0, 5, 3, 12, 2, -0.7, False, 0),
    (1, 3, 3, 8, 0, 2.5, False, 2), (2, 4, 2, 10, 4, 1.0, True, 0), (4, 2, 2, 7, 0, 1.0, False, 0),
    (4, 6, 6, 11, 1, 0.5, False, 1), (7, 3, 1, 5, 5, 1.0, False, 0), (7, 4, 4, 8, 0, -2.0, True, 0),
]


@pytest.mark.parametrize("kv_cache", ["inplace", "concat"])
def test_every_request_in_a_changing_batch_gets_the_references_n_best(tiny_bundle, kv_cache):
    runner = Runner(tiny_bundle, RuntimeConfig(device="cpu", intra_op_threads=1), capacity=48, kv_cache=kv_cache)
    vocab, eos = runner.manifest.model["vocab_size"], runner.manifest.special_tokens["eos_id"]
    beams = Beams(runner, eos)
    outputs = Outputs(SpacedIds(), eos)
    requests = []
    for i, (_, width, n, max_new, min_new, penalty, early, top) in enumerate(CASES):
        params = SamplingParams(max_new_tokens=max_new, min_new_tokens=min_new, num_beams=width,
                                num_return_sequences=n, length_penalty=penalty, early_stopping=early,
                                return_logprobs=True, top_logprobs=top)
        requests.append(Request(input_ids=[5 + i, 7, 9, eos][: 2 + i % 3] + [eos], params=params))
    seed = {r.id: 1000 + i for i, r in enumerate(requests)}
    cancelled = requests[2]  # leaves mid-search, as a cancel does
    results, ended, step = {}, [], 0
    while len(results) + 1 < len(requests):
        runner.retire([r.id for r in ended])
        for r in ended:
            beams.drop(r.id)
        if step == 3:
            runner.retire([cancelled.id])
            beams.drop(cancelled.id)
        joining = [r for r, case in zip(requests, CASES) if case[0] == step]
        if joining:
            cross, _ = runner.encode([r.id for r in joining], [r.input_ids for r in joining])
            runner.admit(Joining.of(joining), [cross[r.id] for r in joining for _ in range(r.n_rows)])
            beams.admit(joining)
        slots = runner.slots
        assert beams.owns().tolist() == [slots.owners[s] is not None for s in range(slots.hi)]
        runner.step()  # the real decoder step: its K/V are written, reordered and compacted as in serving
        logits = np.zeros((slots.hi, vocab), np.float32)
        for s in np.flatnonzero(slots.live[: slots.hi]).tolist():
            logits[s] = synthetic_logits(seed[slots.owners[s]], slots.output(s), vocab, eos)
        done = beams.advance(logits)
        results.update({b.request.id: (b, outputs.nbest(b.request, b.hypotheses)) for b in done})
        ended = [b.request for b in done]
        step += 1
        assert step < 40
    for r, case in zip(requests, CASES):
        if r is cancelled:
            continue
        p = r.params
        want = reference(seed[r.id], BeamOptions(p.max_new_tokens, p.min_new_tokens, p.num_beams,
                                                 p.num_return_sequences, p.length_penalty, p.early_stopping,
                                                 p.top_logprobs), vocab, eos)
        got, sequences = results[r.id]
        assert [s.token_ids for s in sequences] == [h.token_ids for h in want], case
        assert [s.finish_reason.value for s in sequences] == [h.finish_reason for h in want]
        assert [(s.cumulative_logprob, s.score) for s in sequences] == [(h.cumulative_logprob, h.score)
                                                                        for h in want]
        assert [[t.logprob for t in s.logprobs] for s in sequences] == [h.token_logprobs for h in want]
        assert [[list(t.top) for t in s.logprobs] for s in sequences] == [h.top_logprobs for h in want]
        assert [s.text for s in sequences] == [" ".join(map(str, h.token_ids)) for h in want]
        assert got.finish_reason == sequences[0].finish_reason and got.generated == len(want[0].token_ids)
    assert cancelled.id not in results  # it left before it could end
    runner.retire([r.id for r in ended])
    assert runner.slots.n_live == 0 and not beams.owns().any()


@pytest.mark.parametrize(("min_new", "max_new"), [(0, 20), (3, 20), (0, 1)])
def test_a_step_with_bans_and_renormalize_gives_transformers_log_probabilities(tiny_bundle, min_new, max_new,
                                                                              monkeypatch):
    """An imported Marian's beam steps (bad_words_ids, min_new_tokens, forced_eos_token_id at the last step,
    renormalize_logits): the beams' best ids and log-probabilities are those of transformers' own processors on
    torch's log_softmax of the same logits, computed as one log_softmax of the changed logits (never the rule-by-rule
    float64 pass)."""
    from transformers.generation.logits_process import (ForcedEOSTokenLogitsProcessor, LogitNormalization,
                                                        MinNewTokensLengthLogitsProcessor, NoBadWordsLogitsProcessor)

    runner = Runner(tiny_bundle, RuntimeConfig(device="cpu", intra_op_threads=1), capacity=8)
    vocab, special = runner.manifest.model["vocab_size"], runner.manifest.special_tokens
    eos, banned = special["eos_id"], 7
    rules = TokenRules.for_model({"bad_words_ids": [banned], "forced_eos_token_id": eos, "renormalize_logits": True},
                                 special)
    beams = Beams(runner, eos, rules)
    request = Request(input_ids=[5, 6, eos], params=SamplingParams(num_beams=3, min_new_tokens=min_new,
                                                                             max_new_tokens=max_new))
    cross, _ = runner.encode([request.id], [request.input_ids])
    runner.admit(Joining.of([request]), [cross[request.id]] * request.n_rows)
    beams.admit([request])
    runner.step()
    logits = np.random.default_rng(min_new).normal(0.0, 3.0, (runner.slots.hi, vocab)).astype(np.float32)
    logits[:, banned] = logits.max() + 1.0  # the banned id would win every row
    rows = np.flatnonzero(beams.owns())
    monkeypatch.setattr(beams, "_ruled", None)  # the rule-by-rule pass would be called here
    idx, lp, _ = beams._from_logits(logits, rows, 6)
    processors = [NoBadWordsLogitsProcessor([[banned]], eos), MinNewTokensLengthLogitsProcessor(1, min_new, eos),
                  ForcedEOSTokenLogitsProcessor(1 + max_new, eos), LogitNormalization()]
    want = torch.log_softmax(torch.from_numpy(logits[rows]), dim=-1)
    for processor in processors:
        want = processor(torch.ones((rows.size, 1), dtype=torch.long), want)
    want = want.double().numpy()
    assert idx.tolist() == np.sort(np.argsort(-want, axis=1, kind="stable")[:, :6], axis=1).tolist()
    np.testing.assert_allclose(lp, np.take_along_axis(want, idx, 1), rtol=0, atol=1e-6)
    finite = np.isfinite(lp)
    if max_new == 1:  # the forced end token alone, at log-probability 0
        assert (finite.sum(axis=1) == 1).all() and (idx[finite] == eos).all() and (lp[finite] == 0.0).all()
    assert not np.isin(idx[finite], [banned] + ([eos] if min_new else [])).any()
