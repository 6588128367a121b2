"""One request's failure anywhere in the engine's per-request bookkeeping ends that request alone (issue 16, items 1
and 2): its batch mates finish exactly as when served alone, a request that already finished keeps its result, and
no status message carries a Python repr.

The failures are injected into the real engine (a real runner on the tiny bundle, and a real server): each patched
phase raises only for the poisoned request, recognised by a seed nobody else uses.
"""
from __future__ import annotations

import grpc
import pytest
from grpc_harness import request, wait_for

from seqserve.contract.tokenizer import load_tokenizer
from seqserve.contract.tsv import heldout_pairs
from seqserve.engine.decoding import detokenizer, sampling
from seqserve.engine.request import FinishReason, Request, SamplingParams
from seqserve.engine.runtime.device import RuntimeConfig
from seqserve.engine.runtime.runner import Runner
from seqserve.engine.step import outputs
from seqserve.engine.step.engine import Engine
from seqserve.engine.step.finish import ERROR_MESSAGE
from seqserve.engine.step.scheduler import Scheduler, SchedulerConfig
from seqserve.v1 import seqserve_pb2 as pb

POISON_SEED = 666_666  # the poisoned request's seed: every patched phase raises for it alone
MAX_NEW = 16


def _poisoned(params: SamplingParams) -> bool:
    return params.seed == POISON_SEED


def _by_stop(stops: tuple[str, ...]) -> SamplingParams:
    return SamplingParams(seed=POISON_SEED if stops == ("never-there",) else 0)


def _by_top(n: int) -> SamplingParams:
    return SamplingParams(seed=POISON_SEED if n == 2 else 0)  # no batch mate asks for 2 alternatives


def _raise_for_poison(original, params_of):
    def patched(*args, **kwargs):
        if _poisoned(params_of(*args)):
            raise ZeroDivisionError("float division by zero (injected)")
        return original(*args, **kwargs)
    return patched


# phase -> (object, attribute, how the patched call finds its request's params, the poisoned request's options)
PHASES = {
    "sampling": (sampling, "sample_row", lambda logits, params, *a: params, dict(temperature=0.8)),
    "sampling its last token": (sampling, "sample_row", lambda logits, params, *a: params,
                                dict(temperature=0.8, max_new_tokens=1)),  # a finish rule also fires for its row
    "text": (detokenizer.TextStream, "push", lambda text, *a: _by_stop(text.stops), dict(stop=("never-there",))),
    "logprobs": (outputs, "top_alternatives", lambda lps, n: _by_top(n), dict(return_logprobs=True, top_logprobs=2)),
    "joining": (detokenizer.TextStream, "__init__", lambda text, tok, stops=(): _by_stop(stops),
                dict(stop=("never-there",))),
    "end": (outputs.Outputs, "final", lambda self, rec, *a: rec.request.params, {}),
    "beam end": (Engine, "_end_beams", lambda self, b, *a: b.request.params, dict(num_beams=2)),
}


@pytest.fixture(scope="module")
def setup(tiny_bundle):
    tok = load_tokenizer(tiny_bundle / "tokenizer.json")
    sources = [tok.encode(s).ids for s, _ in heldout_pairs(tiny_bundle, 10)]
    runner = Runner(tiny_bundle, RuntimeConfig(device="cpu", intra_op_threads=1), capacity=16)
    eng = Engine(runner, tok, Scheduler(SchedulerConfig(max_batch_size=16, encode_batch=16,
                                                        cross_bytes_per_token=runner.cross_bytes_per_token)))
    mates = [SamplingParams(max_new_tokens=MAX_NEW, seed=i, **opts) for i, opts in enumerate(
        [{}, dict(temperature=0.7), dict(stop=("9",)), dict(return_logprobs=True, top_logprobs=1), dict(num_beams=2),
         {}, dict(temperature=1.2, top_k=5), {}, {}, dict(return_logprobs=True, length_penalty=-10.0)])]
    alone = [_result(eng.generate([Request(s, p)])[0]) for s, p in zip(sources, mates)]
    return eng, sources, mates, alone


def _result(r: Request):
    return r.finish_reason, r.output_ids, r.text, [(s.token_ids, s.finish_reason) for s in r.sequences]


@pytest.mark.parametrize("phase", PHASES)
def test_a_failure_in_one_requests_bookkeeping_ends_it_alone(setup, monkeypatch, phase):
    eng, sources, mates, alone = setup
    owner, name, params_of, options = PHASES[phase]
    poisoned = Request(sources[0], SamplingParams(**{"max_new_tokens": MAX_NEW, "seed": POISON_SEED, **options}))
    monkeypatch.setattr(owner, name, _raise_for_poison(getattr(owner, name), params_of))
    mates_now, want = [Request(s, p) for s, p in zip(sources, mates)], alone
    eng.generate(mates_now[:4] + [poisoned] + mates_now[4:])
    assert poisoned.finish_reason is FinishReason.ERROR and poisoned.error == ERROR_MESSAGE
    assert poisoned.result.sequences == ()
    assert [_result(r) for r in mates_now] == want  # every batch mate exactly as alone
    monkeypatch.undo()
    assert _result(eng.generate([Request(sources[0], mates[0])])[0]) == alone[0]  # the engine goes on
    assert eng.runner.slots.n_live == 0 and not eng._running and not eng.beams.owns().any()


def test_extreme_length_penalties_score_without_failing_anyone(setup):
    eng, sources, mates, alone = setup
    extreme = [Request(sources[1], SamplingParams(max_new_tokens=MAX_NEW, length_penalty=lp, return_logprobs=True,
                                                  num_beams=beams))
               for lp in (-10.0, 10.0) for beams in (1, 3)]
    mates_now = [Request(s, p) for s, p in zip(sources, mates)]
    eng.generate(mates_now + extreme)
    assert [_result(r) for r in mates_now] == alone
    assert all(r.finish_reason in (FinishReason.EOS, FinishReason.LENGTH) for r in extreme)
    assert all(s.score is not None and s.score == s.score for r in extreme for s in r.sequences)  # never NaN


def test_over_a_real_server_the_failing_call_gets_internal_and_its_mates_are_untouched(make_server, heldout,
                                                                                      monkeypatch):
    s = make_server()
    sources = [src for src, _ in heldout[:6]]
    alone = [s.stub.Generate(request(src, max_new_tokens=MAX_NEW), timeout=30) for src in sources]
    push = detokenizer.TextStream.push
    monkeypatch.setattr(detokenizer.TextStream, "push", _raise_for_poison(push, lambda text, *a: _by_stop(text.stops)))
    gate = s.gate()
    gate.close()  # everyone joins the same steps
    mates = [s.stub.GenerateStream(request(src, max_new_tokens=MAX_NEW), timeout=30) for src in sources[:3]]
    poisoned = s.stub.GenerateStream(request(sources[0], max_new_tokens=MAX_NEW, stop=["never-there"]), timeout=30)
    mates += [s.stub.Generate.future(request(src, max_new_tokens=MAX_NEW), timeout=30) for src in sources[3:]]
    scheduler = s.engine.scheduler
    wait_for(lambda: scheduler.n_waiting + sum(not r.done for r in scheduler.running) == 7, what="the calls queued")
    gate.open()
    with pytest.raises(grpc.RpcError) as err:
        list(poisoned)
    assert err.value.code() == grpc.StatusCode.INTERNAL and err.value.details() == ERROR_MESSAGE
    got = ["".join(m.text for m in mate) for mate in mates[:3]] + [m.result().text for m in mates[3:]]
    assert got == [a.text for a in alone]
    wait_for(lambda: s.metric("seqserve_finished_requests_total", reason="error") == 1, what="the error counted")


class _FailingOnce:
    """Stands in for the engine's step figures (engine/step/stats.py), whose generated-token count raises once, in the
    step where a request with max_new_tokens 3 ended: a bug outside any one request's bookkeeping."""

    def __init__(self, stats, scheduler) -> None:
        vars(self).update(stats=stats, scheduler=scheduler, failed=False)

    def __getattr__(self, name: str):
        return getattr(self.stats, name)

    def __setattr__(self, name: str, value) -> None:
        if name == "generated_tokens" and not self.failed and any(
                r.done and r.params.max_new_tokens == 3 for r in self.scheduler.running):
            vars(self)["failed"] = True
            raise RuntimeError("a bug outside any one request (injected)")
        setattr(self.stats, name, value)


def test_a_failing_step_never_overwrites_a_request_that_already_finished(make_server, heldout, monkeypatch):
    """A bug outside any one request fails the requests still running, never one that finished in that step: its
    result is delivered, and no status carries a repr (it was `internal error: <FinishReason.ERROR: 'error'>`)."""
    s = make_server()
    short = request(heldout[1][0], max_new_tokens=3, min_new_tokens=3)
    want = s.stub.Generate(short, timeout=30)
    failing = _FailingOnce(s.engine.stats, s.engine.scheduler)
    monkeypatch.setattr(s.engine, "stats", failing)
    gate = s.gate()
    gate.close()
    long = s.stub.GenerateStream(request(heldout[0][0], max_new_tokens=30, min_new_tokens=30), timeout=30)
    next(long)
    gate.wait_held()
    finished = s.stub.Generate.future(short, timeout=30)
    wait_for(lambda: s.engine.scheduler.n_waiting == 1, what="the short request queued")
    gate.open()
    got = finished.result()
    assert failing.failed and (got.text, list(got.token_ids), got.finish_reason) == (
        want.text, list(want.token_ids), pb.FINISH_REASON_LENGTH)
    with pytest.raises(grpc.RpcError) as err:
        list(long)
    assert err.value.code() == grpc.StatusCode.INTERNAL and err.value.details() == ERROR_MESSAGE
    wait_for(lambda: s.metric("seqserve_finished_requests_total", reason="length") == 2, what="both shorts counted")
    assert s.metric("seqserve_requests_total", method="Generate", code="INTERNAL") == 0
