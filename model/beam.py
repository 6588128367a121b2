"""Reference beam search in PyTorch, with Hugging Face transformers' semantics: the ground truth for the server's beams.

Pinned against transformers' vectorised `GenerationMixin._beam_search` (src/transformers/generation/utils.py, the
refactor of PR #35802, read at commit 000034a4). Older releases' `BeamHypotheses.add` (generation/beam_search.py)
divided by other lengths: first hyp.shape[-1] (the start token plus the tokens before the end token: the same n
for a hypothesis that ends with the end token, n + 1 for one stopped by the length), later generated_len =
cur_len - decoder_prompt_len (the end token not counted). Per source, each step:

  * candidates = every live beam x every token, scored by cumulative log-probability (sum of the model's
    log_softmax of each chosen token; min_new_tokens sets the end token's log-probability to -inf first, without
    renormalising, as MinNewTokensLengthLogitsProcessor does after log_softmax); the best K = 2 * num_beams are kept
    (`beams_to_keep`), ranked best first.
  * a candidate "hits a stopping criterion" when its token is the end token or its length reaches max_new_tokens.
    Only such candidates of rank < num_beams may become finished hypotheses (`top_num_beam_mask`); the rest are
    dropped. The next live beams are the num_beams best candidates that did not stop (`_get_running_beams_...`).
  * a finished hypothesis scores cumulative_logprob / len ** length_penalty, len = the tokens it generated, the end
    token included (`topk_log_probs / ((cur_len + 1 - decoder_prompt_len) ** length_penalty)` in
    `_update_finished_beams`); the num_beams best are kept.
  * the source is done when no live beam is left (max_new_tokens reached), or when num_beams hypotheses are
    finished and either early_stopping is True or no live beam can beat the worst of them by HF's heuristic:
    best live cumulative_logprob / current_len ** length_penalty <= worst finished score, current_len = the tokens
    the live beams have generated so far (`_check_early_stop_heuristic` with early_stopping=False, whose docstring
    calls this inexact when length_penalty > 0: a longer continuation is never considered).

Where this deliberately differs from HF (neither changes a result of a real model): HF starts with num_beams copies
of the start token, all but one at -1e9; here only the one real beam exists, so no -1e9 placeholder ever becomes a
hypothesis (HF can return one when the vocabulary is smaller than 2 * num_beams). Ties are broken by the lower
(beam, token) index (a stable sort) where torch.topk leaves them unspecified; sums are float64.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from seqserve.contract.decoding import beam_problem, lengths_problem
from seqserve.contract.scoring import score
from seqserve.model.decoding import pad_batch
from seqserve.model.transformer import Transformer

EOS, LENGTH = "eos", "length"  # finish reasons, named as the server names them
CANDIDATES_PER_BEAM = 2  # HF keeps max(2, 1 + number of end tokens) * num_beams candidates; one end token here


@dataclass(frozen=True)
class BeamOptions:
    """The beam search options, with the proto's names and defaults (num_beams 1 = greedy)."""

    max_new_tokens: int
    min_new_tokens: int = 0
    num_beams: int = 1
    num_return_sequences: int = 1
    length_penalty: float = 1.0
    early_stopping: bool = False
    top_logprobs: int = 0  # alternatives recorded per generated token; 0 = none

    def __post_init__(self) -> None:  # the server's rules (contract/decoding.py), not its search
        problem = (beam_problem(self.num_beams, self.num_return_sequences, self.length_penalty)
                   or lengths_problem(self.max_new_tokens, self.min_new_tokens))
        if problem:
            raise ValueError(problem)


@dataclass(frozen=True)
class Hypothesis:
    """One returned sequence."""

    token_ids: list[int]  # generated ids, without BOS and the end token
    finish_reason: str  # EOS or LENGTH
    cumulative_logprob: float  # sum(token_logprobs)
    score: float  # cumulative_logprob / len(token_logprobs) ** length_penalty
    token_logprobs: list[float]  # one per generated token, the end token's last when finish_reason is EOS
    top_logprobs: list[list[tuple[int, float]]]  # per generated token, the most likely (id, logprob) first


@dataclass(frozen=True)
class _Beam:
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    tops: tuple[tuple[tuple[int, float], ...], ...]
    cum: float


class SourceBeams:
    """One source's search: its live beams and its kept finished hypotheses, advanced one step at a time.

    Model-free, so the HF rules above can be pinned on hand-built log-probability tables.
    """

    def __init__(self, opts: BeamOptions, eos_id: int) -> None:
        self.opts, self.eos_id = opts, eos_id
        self.live = [_Beam((), (), (), 0.0)]
        self.finished: list[Hypothesis] = []  # best first, at most num_beams
        self.done = False

    def advance(self, logprobs: torch.Tensor) -> list[int]:
        """logprobs (n_live, V): each live beam's log_softmax -> the parent row of each new live beam."""
        o, length = self.opts, len(self.live[0].tokens) + 1  # the candidates' length
        logprobs = logprobs.to(torch.float64)  # (N, V)
        masked = logprobs.clone()
        if length - 1 < o.min_new_tokens:
            masked[:, self.eos_id] = -math.inf
        cum = torch.tensor([b.cum for b in self.live], dtype=torch.float64)  # (N,)
        total = (cum[:, None] + masked).flatten()  # (N * V,)
        order = torch.sort(total, descending=True, stable=True).indices  # ties: the lower (beam, token) first
        keep = min(CANDIDATES_PER_BEAM * o.num_beams, int(torch.isfinite(total).sum()))
        vocab, parents, running, new = logprobs.shape[1], [], [], []
        for rank, flat in enumerate(order[:keep].tolist()):
            row, token = divmod(flat, vocab)
            beam = self._extend(self.live[row], token, logprobs[row], float(total[flat]))
            if token == self.eos_id or length >= o.max_new_tokens:
                if rank < o.num_beams:  # HF: a stop outside the top num_beams is dropped
                    new.append(self._hypothesis(beam))
            elif len(running) < o.num_beams:
                running.append(beam)
                parents.append(row)
        self.finished = sorted(self.finished + new, key=lambda h: -h.score)[: o.num_beams]  # stable: older first
        self.live = running
        self.done = not running or (len(self.finished) == o.num_beams and (
            o.early_stopping or score(running[0].cum, length, o.length_penalty) <= self.finished[-1].score))
        return parents

    def results(self) -> list[Hypothesis]:
        return self.finished[: self.opts.num_return_sequences]

    def _extend(self, beam: _Beam, token: int, logprobs: torch.Tensor, cum: float) -> _Beam:
        top = ()
        if self.opts.top_logprobs:
            best = torch.sort(logprobs, descending=True, stable=True)  # the model's distribution, before min_new
            top = tuple(zip(best.indices[: self.opts.top_logprobs].tolist(),
                            best.values[: self.opts.top_logprobs].tolist()))
        return _Beam(beam.tokens + (token,), beam.logprobs + (float(logprobs[token]),), beam.tops + (top,), cum)

    def _hypothesis(self, beam: _Beam) -> Hypothesis:
        eos = beam.tokens[-1] == self.eos_id
        return Hypothesis(token_ids=list(beam.tokens[:-1] if eos else beam.tokens),
                          finish_reason=EOS if eos else LENGTH, cumulative_logprob=beam.cum,
                          score=score(beam.cum, len(beam.tokens), self.opts.length_penalty),  # n counts the end token
                          token_logprobs=list(beam.logprobs), top_logprobs=[list(t) for t in beam.tops])


@torch.no_grad()
def beam_search(model: Transformer, sources: list[list[int]], opts: BeamOptions) -> list[list[Hypothesis]]:
    """Batched beam search over encode/decode with the KV cache; per source, up to num_return_sequences, best first.

    All live beams of all sources share each decoder step; after it the cache rows are gathered by parent.
    """
    cfg = model.cfg
    dev = next(model.parameters()).device
    src_ids, src_mask = pad_batch(sources, cfg.pad_id, dev)
    cross = model.cross_kv(model.encode(src_ids, src_mask))  # per layer (B, H, S, Dh) x2
    searches = [SourceBeams(opts, cfg.eos_id) for _ in sources]
    rows = torch.arange(len(sources), device=dev)  # (R,) the source of each row
    tokens = torch.full((len(sources), 1), cfg.decoder_start_id, dtype=torch.int64, device=dev)  # (R, 1)
    past = None
    for step in range(opts.max_new_tokens):
        r = rows.shape[0]
        cross_rows = [(k[rows], v[rows]) for k, v in cross]  # (R, H, S, Dh) x2
        positions = torch.full((r, 1), step, dtype=torch.int64, device=dev)  # (R, 1)
        self_mask = torch.ones((r, step + 1), dtype=torch.int64, device=dev)  # (R, P+1)
        logits, past = model.decode(tokens, positions, self_mask, src_mask[rows], cross_rows, past, causal=False)
        logprobs = torch.log_softmax(logits[:, -1].float(), dim=-1).cpu()  # (R, V)
        parents, start = [], 0
        for search in [s for s in searches if not s.done]:  # the rows of this step, in order
            n = len(search.live)
            chosen = search.advance(logprobs[start: start + n])
            parents += [] if search.done else [start + p for p in chosen]
            start += n
        if not parents:
            break
        index = torch.tensor(parents, dtype=torch.int64, device=dev)  # (R',) each new row's parent row
        past = [(k[index], v[index]) for k, v in past]  # (R', H, P+1, Dh) x2: each beam takes its parent's cache
        rows = rows[index]
        tokens = torch.tensor([[b.tokens[-1]] for s in searches if not s.done for b in s.live], device=dev)  # (R', 1)
    return [s.results() for s in searches]


def greedy_logprobs(model: Transformer, sources: list[list[int]], max_new_tokens: int, min_new_tokens: int = 0,
                    top_logprobs: int = 0) -> list[Hypothesis]:
    """Greedy output with its per-token log-probabilities (log_softmax of the logits at each chosen token).

    Greedy is beam search with one beam (HF's rules reduce to argmax), so this is that call's best hypothesis.
    """
    opts = BeamOptions(max_new_tokens, min_new_tokens, top_logprobs=top_logprobs)
    return [hyps[0] for hyps in beam_search(model, sources, opts)]


@torch.no_grad()
def teacher_forced_logprobs(model: Transformer, sources: list[list[int]],
                            targets: list[list[int]]) -> list[list[float]]:
    """The log-probability of each target token given the source and the target's prefix, from one full forward.

    targets are generated ids as scored (the end token included where a hypothesis ended with it).
    """
    cfg = model.cfg
    dev = next(model.parameters()).device
    src_ids, src_mask = pad_batch(sources, cfg.pad_id, dev)
    shifted = [[cfg.decoder_start_id] + t[:-1] for t in targets]
    tgt_in, tgt_mask = pad_batch(shifted, cfg.pad_id, dev)  # (B, T) shifted right
    logprobs = torch.log_softmax(model(src_ids, src_mask, tgt_in, tgt_mask).float(), dim=-1)  # (B, T, V)
    gold, _ = pad_batch(targets, cfg.pad_id, dev)  # (B, T)
    picked = logprobs.gather(-1, gold[..., None])[..., 0].double().cpu()  # (B, T)
    return [picked[i, : len(t)].tolist() for i, t in enumerate(targets)]
