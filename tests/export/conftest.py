"""Export fixtures: a small random model exported once (parity grids); the tiny model's full bundle is in
tests/conftest.py."""
from __future__ import annotations

from pathlib import Path

import pytest

SMALL = dict(vocab_size=50, d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=64, dropout=0.0,
             max_positions=32)


@pytest.fixture(scope="session")
def small_model():
    """A randomly initialised model in eval mode; max_positions 32 makes "near max" cheap (past_len 30)."""
    import torch

    from seqserve.model.config import ModelConfig
    from seqserve.model.transformer import Transformer

    torch.manual_seed(0)
    return Transformer(ModelConfig(**SMALL)).eval()


@pytest.fixture(scope="session")
def small_graphs(small_model, tmp_path_factory) -> Path:
    """encoder.onnx and decoder.onnx of small_model (dynamo exporter, example sizes 3 / 7 / 5)."""
    from seqserve.contract.names import DECODER_FILE, ENCODER_FILE
    from seqserve.export.onnx_export import export_decoder, export_encoder

    out = tmp_path_factory.mktemp("small_graphs")
    export_encoder(small_model, out / ENCODER_FILE)
    export_decoder(small_model, out / DECODER_FILE)
    return out


@pytest.fixture(scope="session")
def small_sessions(small_graphs):
    """(encoder, decoder) onnxruntime sessions on the CPU provider."""
    from seqserve.contract.names import DECODER_FILE, ENCODER_FILE
    from seqserve.export.ort_io import cpu_session

    return cpu_session(small_graphs / ENCODER_FILE), cpu_session(small_graphs / DECODER_FILE)
