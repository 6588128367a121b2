"""One row decoded by itself with plain onnxruntime run() calls: the reference a batched runner's rows must equal
(tests/engine/runtime/test_runner.py, tests/server/test_t5_serving.py)."""
from __future__ import annotations

import numpy as np

from seqserve.engine.request import Request, SamplingParams
from seqserve.export.ort_io import decoder_feeds, encoder_feeds


class Alone:
    """One row decoded by itself with plain run(): numpy past, its own source, its own positions."""

    def __init__(self, encoder, decoder, source: list[int], heads: int, head_dim: int, layers: int, bos: int):
        self.decoder, self.bos = decoder, bos
        ids = np.array([source], np.int64)  # (1, S)
        self.src_mask = np.ones_like(ids)
        self.cross = encoder.run(None, encoder_feeds(ids, self.src_mask))
        self.past = [np.zeros((1, heads, 0, head_dim), np.float32) for _ in range(2 * layers)]
        self.request = Request(input_ids=source, params=SamplingParams())
        self.output_ids: list[int] = []

    def step(self) -> np.ndarray:
        out = self.output_ids
        t = len(out)
        feeds = decoder_feeds(np.array([[out[-1] if out else self.bos]]), np.array([[t]]), np.ones((1, t + 1)),
                              self.src_mask, self.past, self.cross)
        logits, *self.past = self.decoder.run(None, feeds)
        return logits[0]  # (V,)
