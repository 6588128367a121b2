"""torch.onnx.export of the two graphs with the dynamo exporter and dynamic batch, src_len and past_len."""
from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

import torch

from seqserve.contract import names
from seqserve.export.graphs import DecoderStepGraph, EncoderGraph
from seqserve.model.transformer import Transformer

OPSET = 18
# Example sizes are deliberately not 0 or 1, so the exporter cannot specialise a dynamic dimension to them.
EXAMPLE_BATCH, EXAMPLE_SRC, EXAMPLE_PAST = 3, 7, 5


def _dims(cfg):
    top = cfg.max_positions
    batch = torch.export.Dim(names.BATCH, min=1, max=4096)
    src = torch.export.Dim(names.SRC_LEN, min=1, max=top)
    past = torch.export.Dim(names.PAST_LEN, min=0, max=top)
    return batch, src, past


def _quiet_export(module, args, path: Path, input_names, output_names, dynamic_shapes) -> None:
    # The exporter prints progress lines and warnings for every graph; the caller's progress bar says enough.
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), input_names=input_names, output_names=output_names,
                          dynamic_shapes=dynamic_shapes, opset_version=OPSET, dynamo=True, external_data=False)


@torch.no_grad()
def export_encoder(model: Transformer, path: Path) -> None:
    cfg = model.cfg
    batch, src, _ = _dims(cfg)
    ids = torch.randint(4, cfg.vocab_size, (EXAMPLE_BATCH, EXAMPLE_SRC))  # (batch, src_len)
    mask = torch.ones_like(ids)
    mask[0, -2:] = 0  # a padded row, so masking is traced with real values
    shapes = {"input_ids": {0: batch, 1: src}, "attention_mask": {0: batch, 1: src}}
    _quiet_export(EncoderGraph(model).eval(), (ids, mask), path, names.encoder_inputs(),
                  names.encoder_outputs(cfg.n_decoder_layers), shapes)


@torch.no_grad()
def export_decoder(model: Transformer, path: Path) -> None:
    cfg = model.cfg
    batch, src, past = _dims(cfg)
    b, s, p, n = EXAMPLE_BATCH, EXAMPLE_SRC, EXAMPLE_PAST, cfg.n_decoder_layers
    kv_past = tuple(torch.randn(b, cfg.n_heads, p, cfg.head_dim) for _ in range(2 * n))  # (batch, heads, past, Dh)
    kv_cross = tuple(torch.randn(b, cfg.n_heads, s, cfg.head_dim) for _ in range(2 * n))  # (batch, heads, src, Dh)
    args = (torch.randint(4, cfg.vocab_size, (b, 1)), torch.full((b, 1), p), torch.ones(b, p + 1, dtype=torch.int64),
            torch.ones(b, s, dtype=torch.int64), *kv_past, *kv_cross)
    shapes = ({0: batch}, {0: batch}, {0: batch, 1: past + 1}, {0: batch, 1: src},
              tuple([{0: batch, 2: past}] * (2 * n) + [{0: batch, 2: src}] * (2 * n)))
    _quiet_export(DecoderStepGraph(model).eval(), args, path, names.decoder_inputs(n), names.decoder_outputs(n), shapes)
