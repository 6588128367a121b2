"""The server's Runner (IO binding, the KV cache's filter / concatenate / advance) against plain onnxruntime run()
calls of each row alone: rows joining and leaving between steps never change another row's logits."""
from __future__ import annotations

import numpy as np

from export import names
from export.ort_io import cpu_session, decoder_feeds, encoder_feeds
from server.device import RuntimeConfig
from server.request import Request, SamplingParams
from server.runner import Runner


class Alone:
    """One row decoded by itself with plain run(): numpy past, its own source, its own positions."""

    def __init__(self, encoder, decoder, source: list[int], heads: int, head_dim: int, layers: int, bos: int):
        self.decoder, self.bos = decoder, bos
        ids = np.array([source], np.int64)  # (1, S)
        self.src_mask = np.ones_like(ids)
        self.cross = encoder.run(None, encoder_feeds(ids, self.src_mask))
        self.past = [np.zeros((1, heads, 0, head_dim), np.float32) for _ in range(2 * layers)]
        self.request = Request(input_ids=source, params=SamplingParams())

    def step(self) -> np.ndarray:
        out = self.request.output_ids
        t = len(out)
        feeds = decoder_feeds(np.array([[out[-1] if out else self.bos]]), np.array([[t]]), np.ones((1, t + 1)),
                              self.src_mask, self.past, self.cross)
        logits, *self.past = self.decoder.run(None, feeds)
        return logits[0]  # (V,)


def test_rows_joining_and_leaving_equal_each_row_alone(tiny_bundle):
    runner = Runner(tiny_bundle, RuntimeConfig(device="cpu"))
    cfg, special = runner.manifest.model, runner.manifest.special_tokens
    encoder = cpu_session(tiny_bundle / names.ENCODER_FILE)
    decoder = cpu_session(tiny_bundle / names.DECODER_FILE)
    rng = np.random.default_rng(5)
    shape = dict(heads=cfg["n_heads"], head_dim=cfg["d_model"] // cfg["n_heads"], layers=cfg["n_decoder_layers"],
                 bos=special["bos_id"])
    rows = {name: Alone(encoder, decoder, [int(x) for x in rng.integers(4, cfg["vocab_size"], n)] + [special["eos_id"]],
                        **shape) for name, n in (("a", 9), ("b", 2), ("c", 14), ("d", 0))}
    joins = {0: ["a"], 1: ["b"], 3: ["c"], 5: ["d"]}  # step -> rows admitted before it
    leaves = {5: ["a"], 7: ["c"]}  # step -> rows retired before it
    widths = []
    for t in range(10):
        runner.update([rows[n].request for n in leaves.get(t, [])], [rows[n].request for n in joins.get(t, [])])
        batch = runner.rows
        last = np.array([r.output_ids[-1] if r.output_ids else special["bos_id"] for r in batch], np.int64)
        positions = np.array([len(r.output_ids) for r in batch], np.int64)
        logits = runner.step(last, positions)  # (B, V)
        widths.append(runner.cache.past_len)
        alone = {id(rows[n].request): rows[n] for n in rows}
        for i, request in enumerate(batch):
            want = alone[id(request)].step()
            np.testing.assert_allclose(logits[i], want, atol=1e-4, rtol=0)
            request.output_ids.append(int(want.argmax()))
    assert [len(rows[n].request.output_ids) for n in "abcd"] == [5, 9, 4, 5]
    assert widths[:5] == [1, 2, 3, 4, 5] and widths[5] == 5  # a's leaving trimmed the column only it used
