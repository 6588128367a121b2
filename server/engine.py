"""The engine: one background thread runs step() = schedule -> run -> update -> emit, forever.

Requests join and leave the running batch between any two steps. onnxruntime runs in this thread (it releases the
GIL), so the gRPC event loop is never blocked by inference. A failure is isolated to the rows that cause it: the step
is probed by halves to find them, they end with ERROR, and everyone else's step is retried.
"""
from __future__ import annotations

import collections
import logging
import threading
import time

import numpy as np
from tokenizers import Tokenizer

from seqserve.server import finish
from seqserve.server.beam import Beam, BeamSearch, top_alternatives
from seqserve.server.constraints import Constraints
from seqserve.server.detokenizer import TextStream
from seqserve.server.metrics import Metrics
from seqserve.server.request import FinishReason, Request, RequestStatus, Sequence, TokenLogprob
from seqserve.server.runner import Runner
from seqserve.server.sampling import choose, log_softmax
from seqserve.server.scheduler import Plan, Scheduler

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, runner: Runner, tokenizer: Tokenizer, scheduler: Scheduler, metrics: Metrics | None = None,
                 stream_interval: int = 1):
        self.runner, self.tokenizer, self.scheduler = runner, tokenizer, scheduler
        self.stream_interval = stream_interval  # a stream's message carries this many tokens (the last one fewer)
        self.metrics = metrics or Metrics()
        special = runner.manifest.special_tokens
        self.eos_id = special["eos_id"]
        self.constraints = Constraints.from_generation(  # the model's token rules; a target language per row
            runner.manifest.generation, per_row_first=bool(runner.manifest.languages))
        self.banned = self.constraints.never_sampled(special)  # never sampled
        self._text: dict[Request, TextStream] = {}  # text of each running request that streams or has stop strings
        self._unsent: dict[Request, tuple[list[int], list[str]]] = {}  # a stream's ids and text not yet emitted
        self._sampled: set[Request] = set()  # running requests whose token is not a plain argmax
        self._beams: dict[Request, BeamSearch] = {}  # running beam requests (their rows are chosen by the search)
        self._logprobs: dict[Request, list[TokenLogprob]] = {}  # running requests that return log-probabilities
        self._sinks: set = set()  # sinks that got events this step: flushed once at its end
        self._ended_waiting: list[Request] = []  # waiting requests this engine ended (their encoder failed)
        self._ended: list[Request] = []  # running requests ended this step: the next schedule retires them
        self._fresh: list[Request] = []  # requests admitted this step: their first token comes from this step
        self._gauges = (None, None, None)  # the last values set: a gauge is set only when it changes
        self._last_step_at: float | None = None
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def submit(self, request: Request) -> None:
        """Queues a request (raises QueueFull when the waiting queue is at its limit) and wakes the loop."""
        self.scheduler.add(request)
        self.metrics.input_tokens.inc(request.n_input_tokens)
        with self._wake:
            self._wake.notify()

    def generate(self, requests: list[Request]) -> list[Request]:
        """Offline: runs every request to its end in the calling thread (warm-up, verify, quality, bench)."""
        pending = collections.deque(requests)
        while pending or self.scheduler.has_work():
            while pending and self.scheduler.n_waiting < self.scheduler.cfg.max_waiting:
                self.submit(pending.popleft())
            self.step()
        return requests

    def step(self) -> None:
        plan = self.scheduler.schedule(time.monotonic(), self._ended)
        self._ended = []
        self._prepare(plan)
        if self.runner.slots.n_live:
            logits = self._run()
            if logits is not None:
                self._update(logits)
        self._emit(plan)

    def _prepare(self, plan: Plan) -> None:
        """Frees the rows that left, runs the encoder (admitted rows without K/V, and some ahead), places rows."""
        self.runner.retire(plan.retired)
        for r in plan.retired:
            self._forget(r)
        if plan.encode:
            self._encode(plan.encode)
        admitted = [r for r in plan.admitted if not r.done]
        self.runner.admit(admitted)
        self._fresh = admitted
        for r in admitted:
            if r.n_rows > 1:
                self._beams[r] = BeamSearch(r.params, self.eos_id)
                continue
            if r.stream or r.params.stop:
                self._text[r] = TextStream(self.tokenizer, r.params.stop)
            if not r.params.greedy:
                self._sampled.add(r)
            if r.params.return_logprobs:
                self._logprobs[r] = []

    def _encode(self, requests: list[Request]) -> None:
        try:
            self.metrics.encoder_duration.observe(self.runner.encode(requests))
        except Exception:
            log.exception("encoder failed for %d sources; isolating the cause", len(requests))
            for r in requests:
                try:
                    self.runner.encode([r])
                except Exception:
                    self.scheduler.unencode([r])
                    # both are counted this step; a running one is also retired by the next schedule
                    (self._ended if r.status is RequestStatus.RUNNING else self._ended_waiting).append(r)
                    r.end(FinishReason.ERROR, time.monotonic(), finish.ERROR_MESSAGE)
                    self._sinks.add(r.sink)

    def _run(self) -> np.ndarray | None:
        start = time.perf_counter()
        try:
            logits = self.runner.step()
        except Exception:
            log.exception("decoder step failed for %d rows; isolating the cause", self.runner.slots.n_live)
            self._fail(self._culprits(self._live()))
            if not self.runner.slots.n_live:
                return None
            try:
                logits = self.runner.step()
            except Exception:  # not caused by any one row (out of memory, a broken session): fail everyone
                log.exception("decoder step failed again without the failing rows")
                self._fail(self._live())
                return None
        self.metrics.decoder_step_duration.observe(time.perf_counter() - start)
        self.metrics.batch_rows.observe(self.runner.slots.n_live)
        return logits

    def _culprits(self, rows: list[int]) -> list[int]:
        """The rows whose step fails on their own, found by halving (a handful of probes for one bad row)."""
        try:
            self.runner.probe(rows)
            return []
        except Exception:
            if len(rows) == 1:
                return rows
            return self._culprits(rows[: len(rows) // 2]) + self._culprits(rows[len(rows) // 2 :])

    def _live(self) -> list[int]:
        return np.flatnonzero(self.runner.slots.live).tolist()

    def _fail(self, rows: list[int]) -> None:
        """These rows end with ERROR and leave now (they are counted when the scheduler retires them)."""
        slots, now = self.runner.slots, time.monotonic()
        failed = list(dict.fromkeys(slots.requests[i] for i in rows))  # a beam request holds several rows
        for r in failed:
            r.end(FinishReason.ERROR, now, finish.ERROR_MESSAGE)
            self._sinks.add(r.sink)
            self._forget(r)
            self._ended.append(r)
        self.runner.retire(failed)

    def _forget(self, r: Request) -> None:
        self._text.pop(r, None)
        self._unsent.pop(r, None)
        self._sampled.discard(r)
        self._beams.pop(r, None)
        self._logprobs.pop(r, None)

    def _update(self, logits: np.ndarray) -> None:
        """Chooses every row's token, appends it, and ends the rows a finish rule says are done."""
        slots, now = self.runner.slots, time.monotonic()
        per_row = {s: (r, slots.ids[s, 1 : 1 + slots.length[s]]) for r in self._sampled
                   if (s := slots.slot_of(r)) is not None}
        hi = slots.hi
        single = slots.live[:hi] & ~slots.beam[:hi]  # (hi,) rows whose token is chosen here (beams: below)
        lps = {r: log_softmax(logits[slots.slot_of(r)]) for r in self._logprobs}  # the model's, before any mask
        beam_logprobs = self._beam_logprobs(logits)  # likewise: min_new_tokens is the search's own business
        if self.constraints.active:
            self.constraints.apply(logits, slots.length[:hi], slots.max_new[:hi], slots.first[:hi])
        no_eos = single & (slots.length[:hi] < slots.min_new[:hi])  # (hi,)
        chosen = choose(logits, per_row, self.eos_id, self.banned, no_eos)  # (hi,)
        codes = np.where(single, finish.after_token(chosen, slots.length[:hi], slots.max_new[:hi], self.eos_id), 0)
        appended = single & (codes != finish.EOS)  # (hi,) EOS ends a row without being returned
        for r, track in self._logprobs.items():
            token = int(chosen[slots.slot_of(r)])
            track.append(TokenLogprob(token, float(lps[r][token]), top_alternatives(lps[r], r.params.top_logprobs)))
        slots.append(chosen, appended)
        for r in self._fresh:  # requests admitted this step produce their first token now
            self._first_token(r, now)
        self._fresh = []
        for r, text in self._text.items():
            s = slots.slot_of(r)
            if appended[s]:
                piece = text.push(int(chosen[s]))
                if text.stopped:
                    codes[s] = finish.STOP
                self._stream(r, (int(chosen[s]),), piece)
        for s in np.flatnonzero(codes).tolist():
            self._end(slots.requests[s], s, finish.REASONS[int(codes[s])], now)
        generated = int(appended.sum()) + self._advance_beams(beam_logprobs, now)
        self.metrics.generated_tokens.inc(generated)  # EOS is not returned, so not counted: equals usage
        if self._last_step_at is not None:
            self.metrics.inter_token_latency.observe(now - self._last_step_at)  # once per step: rows share it
        self._last_step_at = now

    def _beam_logprobs(self, logits: np.ndarray) -> dict[Request, np.ndarray]:
        """Each beam request's live beams' log-probabilities (n_live, V), with the model's token rules applied as HF
        applies its processors (on log-probabilities), before the step masks anything else."""
        slots, out = self.runner.slots, {}
        for r, s in self._beams.items():
            rows = slots.slots_of(r)[: len(s.live)]
            out[r] = log_softmax(logits[rows])  # (n_live, V)
            if self.constraints.active:  # HF applies its processors to the log-probabilities of beams
                self.constraints.apply(out[r], slots.length[rows], slots.max_new[rows], slots.first[rows])
                if self.constraints.renormalize:
                    out[r] = log_softmax(out[r])
        return out

    def _advance_beams(self, logprobs: dict[Request, np.ndarray], now: float) -> int:
        """Each beam request's search takes a step: its rows are reordered by parent and extended, or it ends.
        Returns the tokens of the requests that ended (a beam request's usage is its best sequence)."""
        slots, generated = self.runner.slots, 0
        for r, search in list(self._beams.items()):
            rows = slots.slots_of(r)
            live = rows[: len(search.live)]
            parents, tokens = search.advance(logprobs[r])
            if search.done:
                generated += self._end_beams(r, search, now)
                continue
            dst = rows[: len(parents)]
            self.runner.reorder(dst, [live[p] for p in parents])  # each new beam continues its parent's cache
            chosen = np.zeros(slots.hi, np.int64)
            chosen[dst] = tokens
            mask = np.zeros(slots.hi, bool)
            mask[dst] = True
            slots.append(chosen, mask)
        return generated

    def _end_beams(self, r: Request, search: BeamSearch, now: float) -> int:
        r.sequences = [Sequence(h.token_ids, self.tokenizer.decode(h.token_ids, skip_special_tokens=True),
                                h.finish_reason, h.cumulative_logprob, h.score,
                                _logprobs(h.beam) if r.params.return_logprobs else ())
                       for h in search.results()]
        best = r.sequences[0]
        r.output_ids, r.text = best.token_ids, best.text
        if r.stream:  # beams stream nothing until the end, then the whole best text (the proto documents this)
            r.emit(tuple(best.token_ids), best.text)
        r.end(best.finish_reason, now)
        self._sinks.add(r.sink)
        self._ended.append(r)
        self._beams.pop(r)
        return len(best.token_ids)

    def _first_token(self, r: Request, now: float) -> None:
        r.first_token_at = now
        self.metrics.queue_duration.observe(r.scheduled_at - r.arrival)
        self.metrics.time_to_first_token.observe(now - r.arrival)

    def _stream(self, r: Request, ids: tuple[int, ...], piece: str, last: bool = False) -> None:
        """Hands a stream its new ids and text every stream_interval tokens, and the rest at its end."""
        if not r.stream:
            return
        unsent_ids, unsent_text = self._unsent.setdefault(r, ([], []))
        unsent_ids += ids
        unsent_text.append(piece)
        if last or len(unsent_ids) >= self.stream_interval:
            r.emit(tuple(unsent_ids), "".join(unsent_text))
            self._sinks.add(r.sink)
            del self._unsent[r]

    def _end(self, r: Request, slot: int, reason: FinishReason, now: float) -> None:
        r.output_ids = self.runner.slots.output(slot)
        text = self._text.get(r)
        if text is None:
            r.text = self.tokenizer.decode(r.output_ids, skip_special_tokens=True)
        else:
            self._stream(r, (), text.close(r.output_ids), last=True)
            r.text = text.text
        track = self._logprobs.get(r)
        if track is None:
            r.sequences = [Sequence(r.output_ids, r.text, reason)]
        else:  # the scored tokens: the returned ones, plus the end token on EOS (a stop string cuts no score)
            track = track[: len(r.output_ids) + (reason is FinishReason.EOS)]
            cum = sum(t.logprob for t in track)
            r.sequences = [Sequence(r.output_ids, r.text, reason, cum, cum / max(1, len(track)) **
                                    r.params.length_penalty, tuple(track))]
        r.end(reason, now)
        self._sinks.add(r.sink)
        self._ended.append(r)

    def _emit(self, plan: Plan) -> None:
        """Once per step: finishes are counted (each once, in the step it ended), gauges are set, then every touched
        sink hands its events on (so a client that has its answer finds it counted)."""
        for r in [*self._ended, *plan.abandoned, *plan.dropped, *self._ended_waiting]:
            self.metrics.finished.labels(r.finish_reason.value).inc()
            self._sinks.add(r.sink)
        self._ended_waiting.clear()
        gauges = (self.runner.slots.n_live, self.scheduler.n_waiting, self.runner.nbytes)
        if gauges != self._gauges:
            for gauge, value in zip((self.metrics.running, self.metrics.waiting, self.metrics.kv_cache_bytes), gauges):
                gauge.set(value)
            self._gauges = gauges
        if not self.runner.slots.n_live:
            self._last_step_at = None  # an idle gap is not an inter-token latency
        for sink in self._sinks:
            sink.flush()
        self._sinks.clear()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="seqserve-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Ends the loop; anything still queued or running finishes as CANCELLED (the service drained first)."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)
        ended = [r for r in [*self.scheduler.waiting, *self.scheduler.running] if not r.done]
        self.scheduler.drain(FinishReason.CANCELLED, time.monotonic())
        for r in ended:
            self.metrics.finished.labels(r.finish_reason.value).inc()
            r.sink.flush()

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self.scheduler.has_work():
                    self._wake.wait()
                if self._stopping:
                    return
            try:
                self.step()
            except Exception:  # a bug outside inference: never lose a request, fail what is in flight
                log.exception("engine step failed")
                self._fail(self._live())
                self._emit(Plan([], [], [], []))


def _logprobs(beam: Beam) -> tuple[TokenLogprob, ...]:
    return tuple(TokenLogprob(t, lp, top) for t, lp, top in zip(beam.tokens, beam.logprobs, beam.tops))
