"""The CTranslate2 converter: CTranslate2 decodes our checkpoints exactly as PyTorch does (an independent oracle)."""
from __future__ import annotations

import json
import shutil

import pytest

ctranslate2 = pytest.importorskip("ctranslate2")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from seqserve.export.ctranslate2 import convert  # noqa: E402
from seqserve.export.ctranslate2_greedy import greedy, load_translator  # noqa: E402
from seqserve.model.checkpoint import CONFIG, TOKENIZER, WEIGHTS, load_checkpoint, save_weights  # noqa: E402
from seqserve.model.config import ModelConfig  # noqa: E402
from seqserve.model.decoding import greedy_decode  # noqa: E402
from seqserve.model.transformer import Transformer  # noqa: E402


def _heldout_sources(checkpoint, tok, n: int = 200) -> list[list[int]]:
    lines = (checkpoint / "heldout.tsv").read_text(encoding="utf-8").splitlines()
    return [tok.encode(line.split("\t", 1)[0]).ids for line in lines if line.strip()][:n]


@pytest.fixture(scope="module")
def tiny_ct2(tiny_checkpoint, tmp_path_factory):
    return convert(tiny_checkpoint, tmp_path_factory.mktemp("tiny_ct2"))


@pytest.mark.parametrize("max_new_tokens", [64, 6])  # 6: most rows are cut by the length limit
def test_tiny_model_greedy_is_identical_to_pytorch(tiny_checkpoint, tiny_ct2, max_new_tokens):
    model, tok = load_checkpoint(tiny_checkpoint)
    # Held-out sources only: a source of only </s> is where CTranslate2 differs by design (the test below).
    sources = _heldout_sources(tiny_checkpoint, tok)
    reference = greedy_decode(model, sources, max_new_tokens)
    got = greedy(load_translator(tiny_ct2, "fp32", threads=1), tok, sources, max_new_tokens, batch_size=8)
    assert sum(map(len, reference)) > len(reference)  # the model really generates
    assert got == reference


def test_a_source_of_only_eos_is_not_decoded_by_ctranslate2(tiny_checkpoint, tmp_path):
    """The documented difference: "" encodes to [</s>], and CTranslate2 returns an empty output for that source
    without running the model, while PyTorch (and the engine) decode it. Shown on a model that never emits </s>, so
    the difference cannot depend on what a training run learned."""
    _, tok = load_checkpoint(tiny_checkpoint)  # only its tokenizer
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), d_model=32, n_heads=4, n_encoder_layers=1,
                      n_decoder_layers=1, d_ff=48, dropout=0.0, max_positions=40, norm_first=True,
                      tie_embeddings=False)
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    word = tok.token_to_id("a")
    with torch.no_grad():  # the final LayerNorm outputs a constant vector, and only `word` scores on it
        model.dec_norm.weight.zero_()
        model.dec_norm.bias.fill_(1.0)
        model.out_proj.weight.zero_()
        model.out_proj.weight[word].fill_(1.0)
    save_weights(model, tmp_path / WEIGHTS)
    cfg.save(tmp_path / CONFIG)
    shutil.copyfile(tiny_checkpoint / TOKENIZER, tmp_path / TOKENIZER)
    eos_only = tok.encode("").ids
    assert eos_only == [cfg.eos_id]
    sources = [eos_only, tok.encode("a b").ids]
    assert greedy_decode(model, sources, 6) == [[word] * 6, [word] * 6]
    translator = load_translator(convert(tmp_path, tmp_path / "ct2"), "fp32", threads=1)
    assert greedy(translator, tok, sources, 6, batch_size=8) == [[], [word] * 6]


def test_batch_size_does_not_change_outputs(tiny_checkpoint, tiny_ct2):
    _, tok = load_checkpoint(tiny_checkpoint)
    sources = _heldout_sources(tiny_checkpoint, tok, 40)
    translator = load_translator(tiny_ct2, "fp32", threads=1)
    assert greedy(translator, tok, sources, 64, batch_size=1) == greedy(translator, tok, sources, 64, batch_size=32)


@pytest.fixture(scope="module")
def pre_ln_checkpoint(tiny_checkpoint, tmp_path_factory):
    """A random pre-LN model with untied embeddings: the other branch of every architectural switch."""
    _, tok = load_checkpoint(tiny_checkpoint)
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), d_model=32, n_heads=4, n_encoder_layers=2,
                      n_decoder_layers=3, d_ff=48, dropout=0.0, max_positions=40, norm_first=True,
                      tie_embeddings=False)
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    with torch.no_grad():  # non-trivial norms and biases, so a mis-mapped one changes the scores
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    out = tmp_path_factory.mktemp("pre_ln")
    save_weights(model, out / WEIGHTS)
    cfg.save(out / CONFIG)
    shutil.copyfile(tiny_checkpoint / TOKENIZER, out / TOKENIZER)
    return out


def test_pre_ln_untied_scores_and_greedy_match_pytorch(pre_ln_checkpoint, tiny_checkpoint, tmp_path):
    model, tok = load_checkpoint(pre_ln_checkpoint)
    sources = _heldout_sources(tiny_checkpoint, tok, 32)
    reference = greedy_decode(model, sources, 12)
    converted = convert(pre_ln_checkpoint, tmp_path / "ct2")
    # LayerNorm epsilon moves scores by ~1e-6, below what the comparisons below can see: check it is ours.
    assert json.loads((converted / "config.json").read_text())["layer_norm_epsilon"] == model.dec_norm.eps
    translator = load_translator(converted, "fp32", threads=1)
    assert greedy(translator, tok, sources, 12, batch_size=8) == reference
    # Per-token log-probabilities of the reference outputs (with </s> when the row ended with one).
    targets = [r + [model.cfg.eos_id] if len(r) < 12 else r for r in reference]
    scored = translator.score_batch([[tok.id_to_token(i) for i in s] for s in sources],
                                    [[tok.id_to_token(i) for i in t] for t in targets])
    for source, target, result in zip(sources, targets, scored):
        want = _torch_log_probs(model, source, target)
        got = np.array(result.log_probs[: len(target)])
        np.testing.assert_allclose(got, want, atol=1e-4)


@torch.no_grad()
def _torch_log_probs(model: Transformer, source: list[int], target: list[int]) -> np.ndarray:
    src = torch.tensor([source])  # (1, S)
    tgt_in = torch.tensor([[model.cfg.bos_id] + target[:-1]])  # (1, T) teacher forcing
    logits = model(src, torch.ones_like(src), tgt_in, torch.ones_like(tgt_in))  # (1, T, V)
    log_probs = torch.log_softmax(logits, -1)[0]  # (T, V)
    return log_probs[torch.arange(len(target)), torch.tensor(target)].numpy()


def test_export_cli_writes_a_ctranslate2_model_that_decodes_like_pytorch(tiny_checkpoint, tmp_path, capsys):
    from seqserve.cli.main import main

    out = tmp_path / "ct2"
    assert main(["export", str(tiny_checkpoint), "--out", str(tmp_path / "bundle"), "--ctranslate2", str(out),
                 "--quality-n", "0", "--quiet"]) == 0
    assert f"CTranslate2 model -> {out}" in capsys.readouterr().out
    assert {"model.bin", "config.json", "shared_vocabulary.json"} <= {p.name for p in out.iterdir()}
    model, tok = load_checkpoint(tiny_checkpoint)
    sources = _heldout_sources(tiny_checkpoint, tok, 16)
    assert greedy(load_translator(out, "fp32", threads=1), tok, sources, 64, 16) == greedy_decode(model, sources, 64)
