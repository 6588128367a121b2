"""The fp16 decoder_inplace (the CUDA graph) ends with the token-choice outputs, computed from its float32 logits;
the fp32 and int8 graphs (the CPU's) do not carry them."""
from __future__ import annotations

import numpy as np

from seqserve.contract import names
from seqserve.contract.manifest import load_manifest
from seqserve.export.ort_io import cpu_session


def test_fp16_inplace_step_chooses_as_the_host_would_from_its_own_logits(full_bundle):
    manifest = load_manifest(full_bundle)
    cfg = manifest.model
    session = cpu_session(full_bundle / names.graph_files("fp16")[names.DECODER_INPLACE], threads=1)
    assert manifest.variants["fp16"][names.DECODER_INPLACE]["token_choice"] == list(names.TOKEN_CHOICE_OUTPUTS)
    for variant in ("fp32", "int8"):
        plain = cpu_session(full_bundle / names.graph_files(variant)[names.DECODER_INPLACE])
        assert not {o.name for o in plain.get_outputs()} & set(names.TOKEN_CHOICE_OUTPUTS), variant
    heads, head_dim, n = cfg["n_heads"], cfg["d_model"] // cfg["n_heads"], cfg["n_decoder_layers"]
    rng = np.random.default_rng(0)
    batch, max_len, src = 5, 6, 4
    feeds = {names.DECODER_INPUT_IDS: rng.integers(4, cfg["vocab_size"], (batch, 1)),
             names.PAST_SEQ_LENS: np.array([0, 1, 2, 3, 5], np.int32), names.TOTAL_SEQ_LEN: np.array(6, np.int32),
             names.ENCODER_ATTENTION_MASK: np.ones((batch, src), np.int64)}
    for name in names.past_inputs(n) + names.cross_inputs(n):
        length = max_len if name in names.past_inputs(n) else src
        feeds[name] = rng.standard_normal((batch, heads, length, head_dim)).astype(np.float16)
    wanted = [names.LOGITS, *names.TOKEN_CHOICE_OUTPUTS]
    logits, ids, top, lp = session.run(wanted, feeds)
    assert (ids == logits.argmax(-1)).all()
    assert (top[:, 0] == ids).all() and (np.diff(np.take_along_axis(logits, top, 1), axis=1) <= 0).all()
    ref = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum(-1, keepdims=True))
    np.testing.assert_allclose(lp, np.take_along_axis(ref, top, 1), atol=1e-5)  # float32, not float16
