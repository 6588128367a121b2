"""Training: the tiny preset learns its task, checkpoints are safetensors, the kept checkpoint is the selected
evaluation, --max-minutes stops cleanly, a killed run never looks finished, resume and DDP work."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from seqserve.cli.main import main as cli
from seqserve.contract.tsv import heldout_pairs, write_tsv
from seqserve.model import checkpoint as ck
from seqserve.model.corpus import copy_task_splits
from seqserve.model.data import bucket_batches, collate, tokenize_pairs
from seqserve.model.decoding import greedy_decode
from seqserve.model.evaluate import validation_loss
from seqserve.model.presets import preset
from seqserve.model.tokenizer import train_tokenizer
from seqserve.model.train import MAX_MINUTES, load_splits, lr_at, selection_key, train

SEQSERVE = str(Path(sys.executable).parent / "seqserve")


def test_tiny_preset_learns_the_copy_task(tiny_checkpoint):
    metrics = json.loads((tiny_checkpoint / ck.METRICS).read_text())
    assert metrics["task"] == "copy"
    assert metrics["test"]["exact_match"] >= 0.95
    assert metrics["test"]["n"] == 200
    # The numbers in metrics.json are real: re-decode the held-out split from the saved weights.
    model, tok = ck.load_checkpoint(tiny_checkpoint)
    pairs = heldout_pairs(tiny_checkpoint, 50)
    outs = greedy_decode(model, [tok.encode(s).ids for s, _ in pairs], metrics["max_new_tokens"])
    exact = sum(tok.decode(o, skip_special_tokens=True) == t for o, (_, t) in zip(outs, pairs)) / len(pairs)
    assert exact >= 0.9
    assert set(metrics["test"]) == {"exact_match", "chrf", "bleu", "n"}  # BLEU next to chrF
    assert metrics["select_by"] == "loss" and metrics["stopped_by"] == "max_steps"


def test_checkpoint_files_are_safetensors_json_and_a_curve(tiny_checkpoint):
    names = {p.name for p in tiny_checkpoint.iterdir()}
    assert {ck.WEIGHTS, ck.CONFIG, ck.TOKENIZER, ck.METRICS, ck.TRAIN_CONFIG, "curve.png"} <= names
    assert not [n for n in names if n.endswith((".pt", ".pth", ".pkl", ".bin"))]
    assert (tiny_checkpoint / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_selection_prefers_the_chosen_figure_then_the_lower_loss():
    a = {"loss": 1.0, "chrf": 50.0, "exact_match": 0.2}
    b = {"loss": 0.9, "chrf": 50.0, "exact_match": 0.1}
    c = {"loss": 1.2, "chrf": 60.0, "exact_match": 0.1}

    def best(select_by: str) -> dict:
        return max([a, b, c], key=lambda scores: selection_key(scores, select_by))

    assert best("loss") is b and best("chrf") is c and best("exact_match") is a
    assert selection_key(b, "chrf") > selection_key(a, "chrf")  # a chrF tie goes to the lower loss
    with pytest.raises(ValueError, match="select_by"):
        preset("tiny", select_by="bleu")


def test_the_kept_weights_are_the_selected_evaluation(tmp_path):
    cfg = preset("tiny", n_train=400, n_valid=40, n_test=20, max_steps=40, eval_every=10, eval_samples=20,
                 select_by="chrf")
    metrics = train(cfg, tmp_path, quiet=True)
    evals = metrics["evals"]
    assert [e["step"] for e in evals] == [10, 20, 30, 40]
    assert all({"loss", "exact_match", "chrf", "bleu"} <= set(e) for e in evals)
    chosen = max(evals, key=lambda e: selection_key(e, "chrf"))
    assert metrics["select_by"] == "chrf" and metrics["best_step"] == chosen["step"]
    assert metrics["best_valid"] == {k: chosen[k] for k in ("loss", "exact_match", "chrf", "bleu", "n")}
    assert metrics["best_valid_exact_match"] == chosen["exact_match"]  # still reported
    # model.safetensors holds that evaluation's weights: it scores the validation loss recorded at that step.
    model, tok = ck.load_checkpoint(tmp_path)
    valid = tokenize_pairs(tok, load_splits(cfg)["valid"][: cfg.eval_loss_samples], model.cfg.max_positions)
    assert validation_loss(model, valid) == pytest.approx(chosen["loss"], rel=1e-5)
    assert not (tmp_path / ck.BEST_WEIGHTS).exists()  # renamed to model.safetensors at the end


def test_max_minutes_ends_cleanly_at_the_best_checkpoint_so_far(tmp_path, capsys):
    # A budget that the first step already overruns: the run stops there, evaluates that step and finishes.
    out = tmp_path / "ckpt"
    assert cli(["train", "--preset", "tiny", "--max-minutes", "1e-9", "--select-by", "exact_match",
                "--out", str(out), "--quiet"]) == 0
    metrics = json.loads((out / ck.METRICS).read_text())
    assert metrics["stopped_by"] == MAX_MINUTES and metrics["steps"] == 1
    assert metrics["select_by"] == "exact_match" and metrics["best_step"] == 1
    assert [e["step"] for e in metrics["evals"]] == [1]
    assert (out / ck.WEIGHTS).is_file()
    assert "--max-minutes" in capsys.readouterr().out
    # The stopped run can be resumed: it goes on from step 1.
    metrics = train(preset("tiny", max_steps=3), out, resume=True, quiet=True)
    assert metrics["steps"] == 3 and metrics["stopped_by"] == "max_steps"
    assert [h["step"] for h in json.loads((out / ck.STATE).read_text())["history"]] == [1, 2, 3]


_TRAIN_FOREVER = """import sys
from seqserve.model.presets import preset
from seqserve.model.train import train
train(preset("tiny", n_train=400, n_valid=20, n_test=20, max_steps=10**6, eval_every=5, eval_samples=20,
             threads=1), sys.argv[1], quiet=True)
"""


def test_a_killed_run_never_looks_finished_and_resume_finishes_it(tmp_path):
    out = tmp_path / "ckpt"
    small = dict(n_train=400, n_valid=20, n_test=20, eval_every=5, eval_samples=20, threads=1)
    train(preset("tiny", max_steps=5, **small), out, quiet=True)
    assert (out / ck.METRICS).is_file() and (out / ck.WEIGHTS).is_file()
    # Training again into the finished checkpoint, killed (SIGKILL: no clean-up) after its first evaluation.
    run = subprocess.Popen([sys.executable, "-c", _TRAIN_FOREVER, str(out)])
    try:
        deadline = time.monotonic() + 300
        while not ((out / ck.STATE).is_file() and (out / ck.BEST_WEIGHTS).is_file()):
            assert run.poll() is None and time.monotonic() < deadline, "the run never saved an evaluation"
            time.sleep(0.05)
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
    # What make and load_checkpoint look for is gone: the old weights no longer match the new tokenizer.
    assert not (out / ck.METRICS).exists() and not (out / ck.WEIGHTS).exists()
    with pytest.raises(FileNotFoundError, match="training has not finished"):
        ck.load_checkpoint(out)
    step = json.loads((out / ck.STATE).read_text())["step"]
    metrics = train(preset("tiny", max_steps=step + 5, **small), out, resume=True, quiet=True)
    assert metrics["steps"] == step + 5
    assert (out / ck.METRICS).is_file() and (out / ck.WEIGHTS).is_file() and not (out / ck.BEST_WEIGHTS).exists()
    ck.load_checkpoint(out)


def test_the_final_test_evaluation_shows_progress(tmp_path, capsys):
    train(preset("tiny", n_train=200, n_valid=10, n_test=30, max_steps=2, eval_samples=10), tmp_path)
    err = capsys.readouterr().err
    assert "test: 100%" in err and "30/30" in err


def test_lr_schedule_warms_up_then_decays():
    cfg = preset("tiny", warmup_steps=10, max_steps=100, lr=1.0)
    lrs = [lr_at(s, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(lrs[:9], lrs[1:10]))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[-1] == pytest.approx(0.1, abs=0.01)


def test_batches_are_bucketed_within_the_token_budget():
    pairs = copy_task_splits(400, 1, 1, seed=3)["train"]
    tok = train_tokenizer([s for p in pairs for s in p], vocab_size=60)
    examples = tokenize_pairs(tok, pairs, max_len=64)
    batches = bucket_batches(examples, max_tokens=300, seed=0)
    assert sorted(id(e) for b in batches for e in b) == sorted(id(e) for e in examples)  # each example once
    for b in batches:
        widths = [len(e.src) + len(e.tgt) for e in b]
        assert max(widths) * len(b) <= 300 or len(b) == 1
    batch = collate(batches[0], pad_id=0, bos_id=1)
    assert torch.equal(batch.tgt_in[:, 1:][batch.tgt_mask[:, 1:].bool()],
                       batch.tgt_out[:, :-1][batch.tgt_mask[:, 1:].bool()])  # teacher forcing shifts by one
    assert (batch.tgt_in[:, 0] == 1).all()


def test_resume_continues_from_the_last_step(tmp_path):
    cfg = preset("tiny", n_train=400, n_valid=20, n_test=20, max_steps=30, eval_every=30, eval_samples=20)
    train(cfg, tmp_path, quiet=True)
    first = json.loads((tmp_path / ck.STATE).read_text())
    assert first["step"] == 30
    metrics = train(preset("tiny", n_train=400, n_valid=20, n_test=20, max_steps=50, eval_every=25,
                           eval_samples=20), tmp_path, resume=True, quiet=True)
    state = json.loads((tmp_path / ck.STATE).read_text())
    assert metrics["steps"] == 50 and state["step"] == 50
    assert [h["step"] for h in state["history"]] == list(range(1, 51))
    assert state["history"][:30] == first["history"]  # the first 30 steps were kept, not redone


def test_bring_your_own_tsv_trains_and_malformed_lines_are_reported(tmp_path, capsys):
    pairs = copy_task_splits(300, 1, 1, seed=5)["train"]
    write_tsv(pairs, tmp_path / "good.tsv")
    rc = cli(["train", "--preset", "tiny", "--data", str(tmp_path / "good.tsv"), "--max-steps", "5",
              "--out", str(tmp_path / "ckpt"), "--quiet"])
    assert rc == 0
    assert json.loads((tmp_path / "ckpt" / ck.METRICS).read_text())["task"] == "tsv"
    (tmp_path / "bad.tsv").write_text("a b\ta b\nno tab here\nc\tc\n\tempty source\nd\td\n")
    rc = cli(["train", "--preset", "tiny", "--data", str(tmp_path / "bad.tsv"), "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "bad.tsv" in err and "2" in err and "4" in err


def _loss_curve(out: Path) -> list[float]:
    return [h["loss"] for h in json.loads((out / ck.STATE).read_text())["history"]]


def test_ddp_two_processes_match_one_process_trend(tmp_path):
    args = ["train", "--preset", "tiny", "--max-steps", "80", "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([SEQSERVE, *args, "--out", str(tmp_path / "one"), "--threads", "1"], check=True, env=env,
                   timeout=300)
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          SEQSERVE, *args, "--out", str(tmp_path / "two"), "--threads", "1"],
                         env=env, timeout=300, capture_output=True, text=True)
    assert ddp.returncode == 0, ddp.stderr[-2000:]
    metrics = json.loads((tmp_path / "two" / ck.METRICS).read_text())
    assert metrics["world_size"] == 2 and metrics["steps"] == 80
    one, two = _loss_curve(tmp_path / "one"), _loss_curve(tmp_path / "two")
    assert len(one) == len(two) == 80
    for curve in (one, two):
        assert sum(curve[-10:]) / 10 < 0.6 * sum(curve[:10]) / 10  # both learn
    # Same model, data and schedule: the averaged 2-process loss follows the 1-process curve.
    assert abs(sum(two[-10:]) - sum(one[-10:])) / sum(one[-10:]) < 0.25
