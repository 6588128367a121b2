"""engine/decoding/token_rules.py: each token rule on a hand-made array against values worked out by hand, the list's
order
(transformers'), and a rule added to the list acting on greedy, sampled and beam rows alike."""
from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
from token_choice_bundle import Recording, with_token_choice

from seqserve.contract import manifest as mf
from seqserve.contract import names
from seqserve.contract.generation import GenerationDefaults
from seqserve.contract.tokenizer import load_tokenizer
from seqserve.contract.tsv import heldout_pairs
from seqserve.engine.decoding.rule import Rows
from seqserve.engine.decoding.rule_bad_words import BadWords
from seqserve.engine.decoding.rule_forced_bos import ForcedBOS
from seqserve.engine.decoding.rule_forced_eos import ForcedEOS
from seqserve.engine.decoding.rule_min_new import MinNewTokens
from seqserve.engine.decoding.rule_never_sampled import NeverSampled
from seqserve.engine.decoding.rule_renormalize import Renormalize
from seqserve.engine.decoding.rule_repetition import RepetitionPenalty
from seqserve.engine.decoding.token_rules import TokenRules
from seqserve.engine.request import Request, SamplingParams
from seqserve.engine.runtime.device import RuntimeConfig
from seqserve.engine.runtime.runner import Runner
from seqserve.engine.step.engine import Engine
from seqserve.engine.step.scheduler import Scheduler, SchedulerConfig
from seqserve.engine.step_output import Need

INF = np.inf
SPECIAL = {"pad_id": 0, "bos_id": 1, "eos_id": 2, "unk_id": 3}


def rows(n: int, length=0, max_new=10, min_new=0, first=-1, penalty=1.0, sampled=False, ids=None,
         logprobs=False) -> Rows:
    """n rows; each field one value for all rows or one per row; ids (n, 1 + T) BOS then the generated ids."""
    def each(v, dtype):
        return np.broadcast_to(np.asarray(v, dtype), (n,)).copy()
    length = each(length, np.int64)
    table = np.zeros((n, 1 + int(length.max(initial=0))), np.int64) if ids is None else np.asarray(ids, np.int64)
    return Rows(length, each(max_new, np.int64), each(min_new, np.int64), each(first, np.int64),
                each(penalty, np.float64), each(sampled, bool), table, np.arange(n), logprobs)


def run(rule, scores, at: Rows, on=None) -> np.ndarray:
    """The rule through a one-rule list (acts, then apply on those rows), on a float64 copy."""
    out = np.array(scores, np.float64)
    TokenRules((rule,)).apply(out, at, None if on is None else np.asarray(on))
    return out


def test_repetition_penalty_divides_positive_and_multiplies_negative_scores_of_generated_ids():
    scores = [[2.0, -1.0, 0.5, 3.0], [2.0, -1.0, 0.5, 3.0]]
    at = rows(2, length=3, penalty=[2.0, 1.0], ids=[[9, 0, 1, 0], [9, 0, 1, 0]])
    assert run(RepetitionPenalty(), scores, at).tolist() == [[1.0, -2.0, 0.5, 3.0], [2.0, -1.0, 0.5, 3.0]]


def test_bad_words_are_never_chosen_by_the_rows_allowed():
    out = run(BadWords((1, 3)), [[0.0, 1.0, 2.0, 3.0]] * 2, rows(2), on=[True, False])
    assert out.tolist() == [[0.0, -INF, 2.0, -INF], [0.0, 1.0, 2.0, 3.0]]


def test_never_sampled_ids_mask_only_sampled_rows():
    assert NeverSampled.ids_for(SPECIAL).tolist() == [0, 1, 3]  # the end token stays
    assert NeverSampled.ids_for(SPECIAL, forced_bos=1, banned=(5,)).tolist() == [0, 3, 5]
    out = run(NeverSampled(np.array([0, 3])), [[1.0, 1.0, 1.0, 1.0]] * 2, rows(2, sampled=[True, False]))
    assert out.tolist() == [[-INF, 1.0, 1.0, -INF], [1.0, 1.0, 1.0, 1.0]]


def test_min_new_tokens_masks_the_end_token_until_reached():
    out = run(MinNewTokens(2), [[1.0, 2.0, 3.0]] * 3, rows(3, length=[0, 1, 2], min_new=2))
    assert out.tolist() == [[1.0, 2.0, -INF], [1.0, 2.0, -INF], [1.0, 2.0, 3.0]]


def test_forced_bos_forces_the_first_token_and_a_rows_own_replaces_it():
    scores = [[5.0, 1.0, 2.0, 3.0]] * 3
    out = run(ForcedBOS(2), scores, rows(3, length=[0, 0, 1], first=[-1, 3, 3]))
    assert out.tolist() == [[-INF, -INF, 0.0, -INF], [-INF, -INF, -INF, 0.0], [5.0, 1.0, 2.0, 3.0]]
    out = run(ForcedBOS(None), scores, rows(3, length=0, first=[-1, 1, -1]))  # no model token: own rows only
    assert out.tolist() == [[5.0, 1.0, 2.0, 3.0], [-INF, 0.0, -INF, -INF], [5.0, 1.0, 2.0, 3.0]]


def test_forced_eos_forces_the_end_token_at_the_last_step_max_new_tokens_allows():
    out = run(ForcedEOS(2), [[5.0, 1.0, 2.0]] * 2, rows(2, length=[3, 4], max_new=5))
    assert out.tolist() == [[5.0, 1.0, 2.0], [-INF, -INF, 0.0]]


def test_renormalize_acts_on_log_probabilities_only():
    third = float(np.log(1 / 3))
    out = run(Renormalize(), [[0.0, 0.0, -INF, 0.0]], rows(1, logprobs=True))
    assert np.allclose(out[0, [0, 1, 3]], third, rtol=0, atol=1e-15) and out[0, 2] == -INF
    assert run(Renormalize(), [[0.0, 0.0, -INF, 0.0]], rows(1)).tolist() == [[0.0, 0.0, -INF, 0.0]]


def test_the_list_is_in_transformers_order():
    """generation/utils.py `_get_logits_processor`: RepetitionPenalty, NoBadWords, MinNewTokensLength, ForcedBOS,
    ForcedEOS, ..., LogitNormalization last; sampling's never-sampled ids sit with the bad words."""
    generation = {"bad_words_ids": [5], "forced_bos_token_id": 4, "forced_eos_token_id": 2,
                  "renormalize_logits": True}
    kinds = [type(r) for r in TokenRules.for_model(generation, SPECIAL).rules]
    assert kinds == [RepetitionPenalty, BadWords, NeverSampled, MinNewTokens, ForcedBOS, ForcedEOS, Renormalize]
    assert [type(r) for r in TokenRules.for_model({}, SPECIAL).rules] == [RepetitionPenalty, NeverSampled,
                                                                           MinNewTokens]


def test_the_order_decides_who_wins():
    """A forced token comes after the bad words and min_new_tokens in the list, so it wins over both (as in
    transformers: min_new_tokens = max_new_tokens still ends with the forced end token)."""
    rules = TokenRules.for_model({"bad_words_ids": [4], "forced_bos_token_id": 4, "forced_eos_token_id": 2}, SPECIAL)
    scores = np.zeros((2, 5))
    rules.apply(scores, rows(2, length=[0, 4], max_new=5, min_new=5))
    assert scores.tolist() == [[-INF, -INF, -INF, -INF, 0.0], [-INF, -INF, 0.0, -INF, -INF]]


def test_whether_a_step_needs_the_host_logits_is_the_rules_answer():
    rules = TokenRules.for_model({"forced_eos_token_id": 2, "renormalize_logits": True}, SPECIAL)
    assert not rules.need_logits(rows(2, length=[1, 2], max_new=5))  # nobody at its last step, no min_new
    assert rules.need_logits(rows(2, length=[1, 4], max_new=5))  # the forced end token
    assert not rules.need_logits(rows(2, length=[1, 4], max_new=5), on=np.array([True, False]))  # not a live row
    assert rules.need_logits(rows(1, min_new=1))
    assert rules.acting(rows(1, logprobs=True)) and not rules.need_logits(rows(1, logprobs=True))  # renormalising


def test_the_models_bad_words_forced_bos_and_forced_eos_per_row():
    """generation_config's rules as transformers' logits processors apply them, on greedy rows' logits."""
    rules = TokenRules.for_model({"bad_words_ids": [4], "forced_bos_token_id": 1, "forced_eos_token_id": 2}, SPECIAL)
    scores = np.zeros((3, 6))
    scores[:, 4] = 9.0  # the banned token is everyone's best
    rules.apply(scores, rows(3, length=[0, 3, 4], max_new=5))
    assert scores[0].argmax() == 1 and np.isinf(scores[0, [0, 2, 3, 4, 5]]).all()  # first token: forced BOS
    assert scores[1, 4] == -np.inf and np.isfinite(scores[1, [0, 1, 2, 3, 5]]).all()  # only the ban
    assert scores[2].argmax() == 2 and scores[2, 2] == 0 and np.isinf(scores[2, [0, 1, 3, 4, 5]]).all()  # the last


def test_never_sampled_keeps_the_end_token_and_a_forced_first_token():
    special = {"pad_id": 1, "bos_id": 0, "eos_id": 2, "unk_id": 3, "decoder_start_id": 2}  # BART's
    assert NeverSampled.ids_for(special, forced_bos=0).tolist() == [1, 3]
    marian = {"pad_id": 9, "bos_id": 9, "eos_id": 0, "unk_id": 1, "decoder_start_id": 9}
    assert NeverSampled.ids_for(marian, banned=(9,)).tolist() == [1, 9]
    rules = TokenRules.for_model({"forced_bos_token_id": 0}, special)
    assert [r.ids.tolist() for r in rules.rules if isinstance(r, NeverSampled)] == [[1, 3]]  # built once, in the list


def test_a_rows_own_first_token_replaces_the_models_forced_bos_for_that_row_alone():
    """A multilingual batch: each row forces its own target language; -1 keeps the model's rule."""
    rules = TokenRules.for_model({"forced_bos_token_id": 1}, SPECIAL, per_row_first=True)
    assert ForcedBOS not in {type(r) for r in TokenRules.for_model({}, SPECIAL).rules}
    assert ForcedBOS in {type(r) for r in TokenRules.for_model({}, SPECIAL, per_row_first=True).rules}
    scores = np.zeros((4, 6))
    rules.apply(scores, rows(4, length=[0, 0, 0, 2], max_new=5, first=[4, 5, -1, 3]))
    assert [int(scores[r].argmax()) for r in range(3)] == [4, 5, 1]  # own, own, the model's
    assert all(np.isinf(np.delete(scores[r], t)).all() for r, t in ((0, 4), (1, 5), (2, 1)))
    assert np.isfinite(scores[3]).all()  # past its first token, a row's own token forces nothing


@dataclass(frozen=True)
class BanOne:
    """A test-only rule: one id is never chosen."""

    token: int
    host = True
    masks = True
    forces = False

    def acts(self, at: Rows) -> np.ndarray:
        return np.ones(len(at), bool)

    def apply(self, scores: np.ndarray, at: Rows, on: np.ndarray) -> None:
        scores[on, self.token] = -np.inf


KINDS = {"greedy": SamplingParams(max_new_tokens=12),
         "sampled": SamplingParams(max_new_tokens=12, temperature=0.3, seed=5),
         "beam": SamplingParams(max_new_tokens=12, num_beams=3, num_return_sequences=3)}


@pytest.fixture(scope="module")
def engine_and_sources(tiny_bundle):
    tok = load_tokenizer(tiny_bundle / "tokenizer.json")
    sources = [tok.encode(s).ids for s, _ in heldout_pairs(tiny_bundle, 8)]
    runner = Runner(tiny_bundle, RuntimeConfig(device="cpu", intra_op_threads=1), capacity=64)
    eng = Engine(runner, tok, Scheduler(SchedulerConfig(max_batch_size=64, encode_batch=16,
                                                        cross_bytes_per_token=runner.cross_bytes_per_token)))
    return eng, sources


def _emitted(eng: Engine, sources: list[list[int]]) -> dict[str, list[int]]:
    """Every id each kind of row returned, all kinds in one batch."""
    requests = {kind: [Request(s, p) for s in sources] for kind, p in KINDS.items()}
    eng.generate([r for rs in requests.values() for r in rs])
    return {kind: [t for r in rs for s in r.sequences for t in s.token_ids] for kind, rs in requests.items()}


def _use(eng: Engine, rules: TokenRules) -> None:
    """The list every decider reads (as TokenRules.for_model would build it with the rule's line added)."""
    eng.rules = eng.choice.rules = eng.choice.greedy.rules = eng.choice.sampler.rules = eng.beams.rules = rules


def test_a_rule_added_to_the_list_acts_on_greedy_sampled_and_beam_rows_alike(engine_and_sources):
    eng, sources = engine_and_sources
    before = _emitted(eng, sources)
    banned = Counter(before["greedy"]).most_common(1)[0][0]  # the greedy rows' commonest token
    assert all(banned in ids for ids in before.values())  # every kind of row emits it without the rule
    model_rules = eng.rules
    _use(eng, model_rules + BanOne(banned))
    try:
        after = _emitted(eng, sources)
    finally:
        _use(eng, model_rules)
    assert all(ids and banned not in ids for ids in after.values())
    assert _emitted(eng, sources) == before  # without it, as before


def _with_generation(bundle: Path, out: Path, generation: dict) -> Path:
    """A copy of bundle whose manifest carries these generation defaults (an imported model's token rules)."""
    if not out.exists():
        shutil.copytree(bundle, out)
    manifest = mf.load_manifest(out, check_files=False)
    replace(manifest, generation=generation).save(out)
    return out


def test_a_step_takes_the_logits_only_when_a_rule_acts_on_one_of_its_rows(tiny_bundle, tmp_path_factory):
    """A model that forces its end token at max_new_tokens: with the token-choice outputs, a greedy batch copies ids
    on every step but the last, where the forced token needs the logits; the tokens are the host path's exactly."""
    tok = load_tokenizer(tiny_bundle / "tokenizer.json")
    sources = [tok.encode(s).ids for s, _ in heldout_pairs(tiny_bundle, 6)]
    manifest = mf.load_manifest(tiny_bundle, check_files=False)
    eos = manifest.special_tokens["eos_id"]
    generation = GenerationDefaults(decoder_start_token_id=manifest.decoder_start_id, eos_token_id=eos,
                                    forced_eos_token_id=eos, max_new_tokens=8).to_dict()
    root = tmp_path_factory.mktemp("rules")
    host = _with_generation(tiny_bundle, root / "host", generation)
    choice = _with_generation(with_token_choice(tiny_bundle, root / "choice"), root / "choice", generation)
    runs = {}
    for name, bundle in (("host", host), ("choice", choice)):
        runner = Recording(bundle, RuntimeConfig(device="cpu", intra_op_threads=1), capacity=8)
        eng = Engine(runner, tok, Scheduler(SchedulerConfig(max_batch_size=8,
                                                            cross_bytes_per_token=runner.cross_bytes_per_token)))
        done = eng.generate([Request(s, SamplingParams(max_new_tokens=8)) for s in sources])
        runs[name] = ([(r.output_ids, r.finish_reason) for r in done], runner.fetched, eng)
    assert runs["choice"][0] == runs["host"][0]
    assert all(reason.name in ("EOS", "LENGTH") for _, reason in runs["host"][0])
    fetched = runs["choice"][1]
    assert (names.NEXT_TOKEN_IDS,) in fetched and (names.LOGITS,) in fetched  # ids, then the forced last step
    assert fetched.count((names.LOGITS,)) == 1  # every row reaches its last step together
    eng = runs["choice"][2]
    eng.submit([Request(sources[0], SamplingParams(max_new_tokens=8))])
    eng.step()
    assert eng._need() is Need.IDS


def test_the_list_equals_transformers_processors_on_the_same_log_probabilities():
    """transformers' own list (`_get_logits_processor`, as beam search builds it) and this one, at every step of a
    5-token generation, on the same random log-probabilities: the same order, the same values."""
    torch = pytest.importorskip("torch")
    from transformers import GenerationConfig
    from transformers.generation.utils import GenerationMixin

    config = GenerationConfig(repetition_penalty=1.3, bad_words_ids=[[5]], min_new_tokens=3, forced_bos_token_id=4,
                              forced_eos_token_id=2, eos_token_id=2, max_length=6, renormalize_logits=True,
                              pad_token_id=0, decoder_start_token_id=1)
    config._eos_token_tensor, config._pad_token_tensor = torch.tensor([2]), torch.tensor(0)  # as generate() sets
    config._bos_token_tensor, config._decoder_start_token_tensor = None, torch.tensor(1)
    model = type("EncoderDecoder", (), {"config": type("C", (), {"is_encoder_decoder": True})(),
                                        "_merge_criteria_processor_list": staticmethod(
                                            lambda p, extra: GenerationMixin._merge_criteria_processor_list(
                                                None, p, extra))})()
    theirs = GenerationMixin._get_logits_processor(model, config, input_ids_seq_length=1, device="cpu",
                                                   model_kwargs={})
    ours = TokenRules.for_model({"bad_words_ids": [5], "forced_bos_token_id": 4, "forced_eos_token_id": 2,
                                 "renormalize_logits": True}, SPECIAL)
    assert [type(p).__name__ for p in theirs] == [
        "RepetitionPenaltyLogitsProcessor", "NoBadWordsLogitsProcessor", "MinNewTokensLengthLogitsProcessor",
        "ForcedBOSTokenLogitsProcessor", "ForcedEOSTokenLogitsProcessor", "LogitNormalization"]
    rng = np.random.default_rng(0)
    # transformers also penalises the decoder start token (id 1) in its input ids; these rows generate it once
    # first, so both penalise the same ids (sampled rows never draw it: NeverSampled)
    generated = np.concatenate([np.ones((3, 1), np.int64), rng.integers(2, 8, (3, 4))], axis=1)
    for length in range(5):
        x = rng.standard_normal((3, 8))
        lp = x - np.log(np.exp(x).sum(axis=1, keepdims=True))
        decoder_ids = torch.tensor(np.concatenate([np.ones((3, 1), np.int64), generated[:, :length]], axis=1))
        want = theirs(decoder_ids, torch.tensor(lp)).numpy()
        got = lp.copy()
        ours.apply(got, rows(3, length=length, max_new=5, min_new=3, penalty=1.3, logprobs=True,
                             ids=np.concatenate([np.ones((3, 1), np.int64), generated], axis=1)))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        assert (np.isinf(got) == np.isinf(want)).all()
