"""`seqserve train`: teacher forcing with label-smoothed cross-entropy, AdamW with warmup, bucketed batches.

Files in the checkpoint directory: tokenizer.json, config.json, train_config.json and heldout.tsv at the start;
best.safetensors (the best evaluation so far), last.safetensors, optimizer.safetensors and state.json (for --resume)
at every evaluation; model.safetensors (best.safetensors renamed) and then metrics.json at the very end. Every file
is written atomically, so a crash never leaves a checkpoint that looks finished (metrics.json is what says so).
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_file
from tqdm import tqdm

from seqserve.contract.tokenizer import load_tokenizer, special_ids
from seqserve.contract.tsv import HELDOUT, read_tsv, write_tsv
from seqserve.model import checkpoint as ck
from seqserve.model import distributed
from seqserve.model.config import ModelConfig
from seqserve.model.corpus import CorpusConfig, Pair, copy_task_splits, generate_splits, split_pairs
from seqserve.model.data import Batch, Example, bucket_batches, collate, tokenize_pairs
from seqserve.model.evaluate import evaluate, validation_loss
from seqserve.model.plots import plot_curve
from seqserve.model.presets import TrainConfig
from seqserve.model.tokenizer import train_tokenizer
from seqserve.model.transformer import Transformer

MAX_STEPS, MAX_MINUTES = "max_steps", "max_minutes"  # what ended the training loop (metrics.json "stopped_by")
_REPORTED = ("loss", "exact_match", "chrf", "bleu", "n")  # an evaluation's figures kept in metrics.json
_HISTORY_POINTS = 200  # loss history points kept in metrics.json


def load_splits(cfg: TrainConfig) -> dict[str, list[Pair]]:
    if cfg.task == "copy":
        return copy_task_splits(cfg.n_train, cfg.n_valid, cfg.n_test, seed=cfg.seed)
    if cfg.task == "verbalise":
        return generate_splits(CorpusConfig(n_train=cfg.n_train, n_valid=cfg.n_valid, n_test=cfg.n_test, seed=cfg.seed))
    if cfg.task == "tsv":
        if not cfg.data:
            raise ValueError("task 'tsv' needs --data PATH")
        return split_pairs(read_tsv(cfg.data), seed=cfg.seed)
    raise ValueError(f"unknown task {cfg.task!r}")


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup (as in the paper, 5.3), then cosine decay to 10% of the peak over max_steps."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def selection_key(scores: dict, select_by: str) -> tuple[float, ...]:
    """Larger is better: the chosen figure, then (the decoded scores tie often) the lower validation loss."""
    if select_by == "loss":
        return (-scores["loss"],)
    return (scores[select_by], -scores["loss"])


def save_resume_state(out: Path, model: Transformer, opt: torch.optim.Optimizer, state: dict) -> None:
    ck.save_weights(model, out / ck.LAST_WEIGHTS)
    tensors = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for p, s in opt.state.items():
        for key in ("exp_avg", "exp_avg_sq"):
            tensors[f"{names[id(p)]}.{key}"] = s[key].contiguous()
        tensors[f"{names[id(p)]}.step"] = s["step"].reshape(1).float()
    ck.save_tensors_atomic(tensors, out / ck.OPTIMIZER)
    ck.write_json_atomic(out / ck.STATE, state)


def load_resume_state(out: Path, model: Transformer, opt: torch.optim.Optimizer) -> dict:
    ck.load_weights(model, out / ck.LAST_WEIGHTS)
    tensors = load_file(str(out / ck.OPTIMIZER))
    for name, p in model.named_parameters():
        if f"{name}.exp_avg" in tensors:
            opt.state[p] = {"exp_avg": tensors[f"{name}.exp_avg"], "exp_avg_sq": tensors[f"{name}.exp_avg_sq"],
                            "step": tensors[f"{name}.step"].reshape(())}
    state = json.loads((out / ck.STATE).read_text())
    state.setdefault("best", None)  # state.json of a run older than select_by: its best is re-chosen
    return state


def mark_unfinished(out: Path, resume: bool) -> None:
    """Takes away what says "finished" before any training: a fresh run's new tokenizer would not match old
    weights, and a resumed run keeps its best weights under BEST_WEIGHTS until it ends again."""
    (out / ck.METRICS).unlink(missing_ok=True)
    if resume and (out / ck.WEIGHTS).is_file() and not (out / ck.BEST_WEIGHTS).is_file():
        os.replace(out / ck.WEIGHTS, out / ck.BEST_WEIGHTS)
    (out / ck.WEIGHTS).unlink(missing_ok=True)
    if not resume:
        (out / ck.BEST_WEIGHTS).unlink(missing_ok=True)


def train(cfg: TrainConfig, out: str | Path, resume: bool = False, quiet: bool = False) -> dict:
    """Trains, keeps the best evaluation's weights (cfg.select_by) and returns metrics.json's content."""
    trainer = Trainer(cfg, Path(out), resume, quiet)
    try:
        return trainer.run()
    finally:
        distributed.shutdown(trainer.world)


class Trainer:
    """One training run: the setup, then steps with evaluations, then the test evaluation of the kept weights."""

    def __init__(self, cfg: TrainConfig, out: Path, resume: bool, quiet: bool) -> None:
        self.cfg, self.out, self.quiet = cfg, out, quiet
        self.world = distributed.init_world()
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.splits = load_splits(cfg)
        self._prepare_directory(resume)
        self.tok = load_tokenizer(out / ck.TOKENIZER)
        self.mcfg = ModelConfig(vocab_size=self.tok.get_vocab_size(), **asdict(cfg.arch), **special_ids(self.tok))
        self.train_set = tokenize_pairs(self.tok, self.splits["train"], self.mcfg.max_positions)
        self.max_new = max(len(e.tgt) for e in self.train_set) + 8  # decoding budget for validation and test
        self.valid = self.splits["valid"][: cfg.eval_samples]
        self.valid_loss_set: list[Example] = tokenize_pairs(self.tok, self.splits["valid"][: cfg.eval_loss_samples],
                                                            self.mcfg.max_positions)
        self.model = Transformer(self.mcfg)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9,
                                     weight_decay=cfg.weight_decay)
        self.state = {"step": 0, "epoch": 0, "best": None, "history": [], "evals": []}
        if resume and (out / ck.STATE).is_file():
            self.state = load_resume_state(out, self.model, self.opt)
        if self.world.is_main:
            self.mcfg.save(out / ck.CONFIG)
        self.ddp = distributed.wrap(self.model, self.world)
        self.loss_fn = torch.nn.CrossEntropyLoss(ignore_index=self.mcfg.pad_id, label_smoothing=cfg.label_smoothing)
        self.tokens_seen = 0

    def _prepare_directory(self, resume: bool) -> None:
        tok_path = self.out / ck.TOKENIZER
        if self.world.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            mark_unfinished(self.out, resume)
            if not (resume and tok_path.is_file()):
                train_tokenizer([t for pair in self.splits["train"] for t in pair], self.cfg.vocab_size).save(
                    str(ck.temporary(tok_path)))
                os.replace(ck.temporary(tok_path), tok_path)
                write_tsv(self.splits["test"], self.out / HELDOUT)
                self.cfg.save(self.out / ck.TRAIN_CONFIG)
        distributed.barrier(self.world)

    def run(self) -> dict:
        cfg, state = self.cfg, self.state
        started = time.perf_counter()
        deadline = started + 60 * cfg.max_minutes if cfg.max_minutes else None
        bar = tqdm(total=cfg.max_steps, initial=state["step"], disable=self.quiet or not self.world.is_main,
                   desc=f"train {cfg.preset}", unit="step", dynamic_ncols=True)
        stopped_by = MAX_STEPS
        self.model.train()
        while state["step"] < cfg.max_steps and stopped_by == MAX_STEPS:
            # Every rank shuffles identically and takes its own slice; all ranks run the same number of steps.
            batches = bucket_batches(self.train_set, cfg.max_tokens, seed=cfg.seed * 1000 + state["epoch"])
            state["epoch"] += 1
            for examples in batches[self.world.rank :: self.world.size]:
                if state["step"] >= cfg.max_steps:
                    break
                self._step(collate(examples, self.mcfg.pad_id, self.mcfg.bos_id), bar, started)
                if state["step"] % cfg.eval_every == 0:
                    self._evaluate_and_save(bar)
                if state["step"] < cfg.max_steps and self._out_of_time(deadline):
                    stopped_by = MAX_MINUTES
                    break
        if state["best"] is None or state["evals"][-1]["step"] != state["step"]:
            self._evaluate_and_save(bar)  # the last step counts too
        bar.close()
        if stopped_by == MAX_MINUTES and self.world.is_main:
            tqdm.write(f"--max-minutes {cfg.max_minutes:g}: stopped at step {state['step']} of {cfg.max_steps}; "
                       f"keeping step {state['best']['step']} (best validation {cfg.select_by})")
        return self._finish(time.perf_counter() - started, stopped_by)

    def _step(self, b: Batch, bar: tqdm, started: float) -> None:
        step = self.state["step"]
        lr = lr_at(step, self.cfg)
        for group in self.opt.param_groups:
            group["lr"] = lr
        logits = self.ddp(b.src, b.src_mask, b.tgt_in, b.tgt_mask)  # (B, T, V)
        loss = self.loss_fn(logits.reshape(-1, logits.shape[-1]), b.tgt_out.reshape(-1))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_norm)
        self.opt.step()
        self.state["step"] += 1
        self.tokens_seen += b.n_tokens * self.world.size
        mean_loss = distributed.mean_across(loss.item(), self.world)
        self.state["history"].append({"step": self.state["step"], "loss": mean_loss, "lr": lr})
        bar.update(1)
        bar.set_postfix(loss=f"{mean_loss:.3f}", lr=f"{lr:.2e}",
                        tok_s=f"{self.tokens_seen / (time.perf_counter() - started):.0f}", refresh=False)

    def _out_of_time(self, deadline: float | None) -> bool:
        if deadline is None:
            return False
        # All ranks must stop at the same step: one rank past the deadline stops them all.
        return distributed.mean_across(float(time.perf_counter() > deadline), self.world) > 0

    def _evaluate_and_save(self, bar: tqdm) -> None:
        state, select_by = self.state, self.cfg.select_by
        if self.world.is_main:
            scores = {"step": state["step"], "loss": validation_loss(self.model, self.valid_loss_set),
                      **evaluate(self.model, self.tok, self.valid, self.max_new, progress=self._bar_label("valid"))}
            state["evals"].append(scores)
            improved = state["best"] is None or selection_key(scores, select_by) > selection_key(state["best"],
                                                                                                 select_by)
            if improved:
                state["best"] = scores
                ck.save_weights(self.model, self.out / ck.BEST_WEIGHTS)
            bar.write(f"step {state['step']}: valid loss {scores['loss']:.3f}, chrF {scores['chrf']:.1f}, "
                      f"BLEU {scores['bleu']:.1f}, exact match {scores['exact_match']:.2%}"
                      + (f" (best {select_by} so far)" if improved else ""))
            save_resume_state(self.out, self.model, self.opt, state)
            plot_curve(state["history"], state["evals"], self.out / "curve.png",
                       f"seqserve train --preset {self.cfg.preset}", best_step=state["best"]["step"])
        distributed.barrier(self.world)

    def _bar_label(self, what: str) -> str | None:
        return None if self.quiet else what

    def _finish(self, seconds: float, stopped_by: str) -> dict:
        metrics = {}
        if self.world.is_main:
            state, best = self.state, self.state["best"]
            kept = ck.load_model(self.out, ck.BEST_WEIGHTS)
            test = evaluate(kept, self.tok, self.splits["test"], self.max_new, progress=self._bar_label("test"),
                            leave=True)
            history = state["history"]
            metrics = {"preset": self.cfg.preset, "task": self.cfg.task, "steps": state["step"],
                       "stopped_by": stopped_by, "world_size": self.world.size, "train_seconds": round(seconds, 1),
                       "parameters": kept.num_parameters(), "select_by": self.cfg.select_by,
                       "best_step": best["step"], "best_valid": {k: best[k] for k in _REPORTED},
                       "best_valid_exact_match": best["exact_match"], "test": test, "max_new_tokens": self.max_new,
                       "final_loss": history[-1]["loss"] if history else None, "evals": state["evals"],
                       "loss_history": history[:: max(1, len(history) // _HISTORY_POINTS)]}
            os.replace(self.out / ck.BEST_WEIGHTS, self.out / ck.WEIGHTS)
            ck.write_json_atomic(self.out / ck.METRICS, metrics)  # last: the checkpoint is finished
        distributed.barrier(self.world)
        return metrics
