"""`seqserve train`: teacher forcing with label-smoothed cross-entropy, AdamW with warmup, bucketed batches."""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from seqserve.contract.tokenizer import load_tokenizer, special_ids
from seqserve.contract.tsv import HELDOUT, read_tsv, write_tsv
from seqserve.model import checkpoint as ck
from seqserve.model import distributed
from seqserve.model.config import ModelConfig
from seqserve.model.corpus import CorpusConfig, Pair, copy_task_splits, generate_splits, split_pairs
from seqserve.model.data import bucket_batches, collate, tokenize_pairs
from seqserve.model.evaluate import evaluate
from seqserve.model.plots import plot_curve
from seqserve.model.presets import TrainConfig
from seqserve.model.tokenizer import train_tokenizer
from seqserve.model.transformer import Transformer


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


def save_resume_state(out: Path, model: Transformer, opt: torch.optim.Optimizer, state: dict) -> None:
    ck.save_weights(model, out / ck.LAST_WEIGHTS)
    tensors = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for p, s in opt.state.items():
        for key in ("exp_avg", "exp_avg_sq"):
            tensors[f"{names[id(p)]}.{key}"] = s[key].contiguous()
        tensors[f"{names[id(p)]}.step"] = s["step"].reshape(1).float()
    save_file(tensors, str(out / ck.OPTIMIZER))
    (out / ck.STATE).write_text(json.dumps(state, indent=2))


def load_resume_state(out: Path, model: Transformer, opt: torch.optim.Optimizer) -> dict:
    ck.load_weights(model, out / ck.LAST_WEIGHTS)
    tensors = load_file(str(out / ck.OPTIMIZER))
    for name, p in model.named_parameters():
        if f"{name}.exp_avg" in tensors:
            opt.state[p] = {"exp_avg": tensors[f"{name}.exp_avg"], "exp_avg_sq": tensors[f"{name}.exp_avg_sq"],
                            "step": tensors[f"{name}.step"].reshape(())}
    return json.loads((out / ck.STATE).read_text())


def train(cfg: TrainConfig, out: str | Path, resume: bool = False, quiet: bool = False) -> dict:
    """Trains, keeps the best checkpoint by validation exact match, and returns metrics.json's content."""
    out = Path(out)
    world = distributed.init_world()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    splits = load_splits(cfg)
    out.mkdir(parents=True, exist_ok=True)
    tok_path = out / ck.TOKENIZER
    if world.is_main and not (resume and tok_path.is_file()):
        train_tokenizer([t for pair in splits["train"] for t in pair], cfg.vocab_size).save(str(tok_path))
        write_tsv(splits["test"], out / HELDOUT)
        cfg.save(out / ck.TRAIN_CONFIG)
    distributed.barrier(world)
    tok = load_tokenizer(tok_path)
    mcfg = ModelConfig(vocab_size=tok.get_vocab_size(), **asdict(cfg.arch), **special_ids(tok))
    train_set = tokenize_pairs(tok, splits["train"], mcfg.max_positions)
    max_new = max(len(e.tgt) for e in train_set) + 8  # decoding budget for validation
    model = Transformer(mcfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=cfg.weight_decay)
    state = {"step": 0, "epoch": 0, "best_exact_match": -1.0, "history": [], "evals": []}
    if resume and (out / ck.STATE).is_file():
        state = load_resume_state(out, model, opt)
    if world.is_main:
        mcfg.save(out / ck.CONFIG)
    ddp = distributed.wrap(model, world)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=mcfg.pad_id, label_smoothing=cfg.label_smoothing)
    valid = splits["valid"][: cfg.eval_samples]
    bar = tqdm(total=cfg.max_steps, initial=state["step"], disable=quiet or not world.is_main, desc=f"train {cfg.preset}",
               unit="step", dynamic_ncols=True)
    started, tokens_seen = time.perf_counter(), 0
    model.train()
    while state["step"] < cfg.max_steps:
        # Every rank shuffles identically and takes its own slice; all ranks run the same number of steps.
        batches = bucket_batches(train_set, cfg.max_tokens, seed=cfg.seed * 1000 + state["epoch"])[world.rank :: world.size]
        state["epoch"] += 1
        for examples in batches:
            if state["step"] >= cfg.max_steps:
                break
            step = state["step"]
            for group in opt.param_groups:
                group["lr"] = lr_at(step, cfg)
            b = collate(examples, mcfg.pad_id, mcfg.bos_id)
            logits = ddp(b.src, b.src_mask, b.tgt_in, b.tgt_mask)  # (B, T, V)
            loss = loss_fn(logits.reshape(-1, logits.shape[-1]), b.tgt_out.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
            opt.step()
            state["step"] += 1
            tokens_seen += b.n_tokens * world.size
            mean_loss = distributed.mean_across(loss.item(), world)
            state["history"].append({"step": state["step"], "loss": mean_loss, "lr": lr_at(step, cfg)})
            bar.update(1)
            bar.set_postfix(loss=f"{mean_loss:.3f}", lr=f"{lr_at(step, cfg):.2e}",
                            tok_s=f"{tokens_seen / (time.perf_counter() - started):.0f}", refresh=False)
            if state["step"] % cfg.eval_every == 0 or state["step"] == cfg.max_steps:
                _evaluate_and_save(model, opt, tok, valid, max_new, state, out, world, cfg, bar)
    bar.close()
    metrics = _finish(out, tok, splits["test"], max_new, state, world, cfg, time.perf_counter() - started)
    distributed.shutdown(world)
    return metrics


def _evaluate_and_save(model, opt, tok, valid, max_new, state, out, world, cfg, bar) -> None:
    if world.is_main:
        scores = evaluate(model, tok, valid, max_new)
        state["evals"].append({"step": state["step"], **scores})
        bar.write(f"step {state['step']}: valid exact match {scores['exact_match']:.2%}, chrF {scores['chrf']:.1f}")
        if scores["exact_match"] > state["best_exact_match"]:
            state["best_exact_match"] = scores["exact_match"]
            ck.save_weights(model, out / ck.WEIGHTS)
        save_resume_state(out, model, opt, state)
        plot_curve(state["history"], state["evals"], out / "curve.png", f"seqserve train --preset {cfg.preset}")
    distributed.barrier(world)


def _finish(out, tok, test, max_new, state, world, cfg, seconds) -> dict:
    metrics = {}
    if world.is_main:
        best, _ = ck.load_checkpoint(out)
        test_scores = evaluate(best, tok, test, max_new)
        metrics = {"preset": cfg.preset, "task": cfg.task, "steps": state["step"], "world_size": world.size,
                   "train_seconds": round(seconds, 1), "parameters": best.num_parameters(),
                   "best_valid_exact_match": state["best_exact_match"], "test": test_scores,
                   "max_new_tokens": max_new, "final_loss": state["history"][-1]["loss"] if state["history"] else None,
                   "evals": state["evals"], "loss_history": state["history"][:: max(1, len(state["history"]) // 200)]}
        (out / ck.METRICS).write_text(json.dumps(metrics, indent=2) + "\n")
    distributed.barrier(world)
    return metrics
