"""The server's Runner (IO binding, the KV cache's admit / release / compact / advance) against plain onnxruntime run()
calls of each row alone: rows joining and leaving between steps never change another row's logits."""
from __future__ import annotations

import numpy as np
import pytest
from row_alone import Alone

from seqserve.contract import names
from seqserve.engine.runtime.device import RuntimeConfig
from seqserve.engine.runtime.runner import Runner
from seqserve.engine.runtime.slots import Joining
from seqserve.export.ort_io import cpu_session


@pytest.mark.parametrize("kv_cache", ["concat", "inplace"])
def test_rows_joining_and_leaving_equal_each_row_alone(tiny_bundle, kv_cache):
    """Each row, whatever joins and leaves around it, equals that row decoded alone by the plain graph with plain run():
    for the concat cache (which compacts free slots away) and the in-place one (which never moves a row)."""
    runner = Runner(tiny_bundle, RuntimeConfig(device="cpu"), kv_cache=kv_cache)
    cfg, special = runner.manifest.model, runner.manifest.special_tokens
    encoder = cpu_session(tiny_bundle / names.ENCODER_FILE)
    decoder = cpu_session(tiny_bundle / names.DECODER_FILE)
    rng = np.random.default_rng(5)
    shape = dict(heads=cfg["n_heads"], head_dim=names.head_dim(cfg), layers=cfg["n_decoder_layers"],
                 bos=special["bos_id"])
    rows = {name: Alone(encoder, decoder, [int(x) for x in rng.integers(4, cfg["vocab_size"], n)] + [special["eos_id"]],
                        **shape) for name, n in (("a", 9), ("b", 2), ("c", 14), ("d", 0), ("e", 20))}
    joins = {0: "a", 1: "b", 3: "c", 5: "d", 12: "e"}  # step -> the row admitted before it
    leaves = {5: "a", 7: "c", 12: "b", 14: "d"}  # step -> the row retired before it
    slots, widths = [], []
    for t in range(16):
        if t in leaves:
            runner.retire([rows[leaves[t]].request.id])
        if t in joins:
            r = rows[joins[t]].request
            cross, _ = runner.encode([r.id], [r.input_ids])
            runner.admit(Joining.of([r]), [cross[r.id]])
        logits = runner.step()  # (hi, V), free slots included
        hi = runner.slots.hi
        slots.append([next(n for n in rows if rows[n].request.id == i) if i else None for i in runner.slots.owners[:hi]])
        widths.append(getattr(runner.cache, "past_len", None))
        chosen = np.zeros(hi, np.int64)
        for i, owner in enumerate(runner.slots.owners[:hi]):
            if owner is None:
                continue
            row = next(row for row in rows.values() if row.request.id == owner)
            want = row.step()
            np.testing.assert_allclose(logits[i], want, atol=1e-4, rtol=0)
            chosen[i] = int(want.argmax())
            row.output_ids.append(chosen[i])
        runner.slots.append(chosen, runner.slots.live[:hi])
    assert [len(rows[n].output_ids) for n in "abcde"] == [5, 11, 4, 9, 4]
    assert slots[5] == ["d", "b", "c"]  # d took the slot a left: nothing was copied
    assert slots[7] == ["d", "b"]  # c's slot was the last one: the stepped batch ends before it
    if kv_cache == "concat":
        assert slots[12] == ["d", "e"] and slots[14] == ["e"]  # d's slot, a third of the batch, was compacted away
        # Compacting also drops past columns no live row uses: a's first one at step 7, the 11 only d used at 14.
        assert widths == [1, 2, 3, 4, 5, 6, 7, 7, 8, 9, 10, 11, 12, 13, 3, 4]
    else:
        assert slots[12] == ["d", "e"] and slots[14] == [None, "e"]  # e took b's slot; nobody is ever moved


def test_trim_drops_leading_columns_once_half_of_the_past_is_unused():
    from seqserve.engine.runtime.device import Device
    from seqserve.engine.runtime.kv_cache import ConcatCache

    device = Device(RuntimeConfig(device="cpu"))
    cache = ConcatCache(device, n_layers=1, heads=1, head_dim=2)

    def steps(n: int) -> None:
        for _ in range(n):
            p = cache.past_len
            present = [device.put(np.concatenate([device.get(v), np.full((cache.batch, 1, 1, 2), p, np.float32)],
                                                 axis=2)) for v in cache.past]
            cache.advance(present, cache.step_mask())

    source = [np.ones((1, 3, 2), np.float32)] * 2  # (H, S, Dh) K and V of one layer
    cache.admit([source], into=[0])  # row 0
    steps(9)
    cache.admit([source], into=[1])  # row 1 joins with 9 holes
    steps(1)
    cache.trim()
    assert cache.past_len == 10  # row 0 still uses every column
    cache.release([0])
    cache.trim()  # row 1 uses only the last column: 9 >= MIN_TRIM unused columns, more than half
    assert cache.past_len == 1 and cache.self_mask.tolist() == [[0], [1]]
    assert device.get(cache.past[0])[1, 0, :, 0].tolist() == [9.0]  # the column kept is row 1's own


@pytest.mark.parametrize("variant", ["int8", "fp32"])
def test_an_int8_beam_reorder_copies_only_the_columns_after_the_prefix_two_beams_share(full_bundle, variant):
    """int8: the reorder skips the columns of the prefix a beam and its new parent share. That rests on those columns
    being bit-equal already (same tokens, same steps, integer GEMMs), asserted first with the beams placed behind
    three other rows; the skipped columns are then poisoned to prove nothing was written there, and every other column
    must equal the parent's. fp32 (a float GEMM rounds a row by its place in the batch): every column is copied."""
    from seqserve.engine.request import Request, SamplingParams

    runner = Runner(full_bundle, RuntimeConfig(device="cpu"), capacity=8, kv_cache="inplace", variant=variant)
    eos = runner.manifest.special_tokens["eos_id"]
    ahead = Request(input_ids=[6, 8, eos], params=SamplingParams(num_beams=3))  # slots 0-2
    r = Request(input_ids=[5, 7, 9, eos], params=SamplingParams(num_beams=4))  # slots 3-6
    cross, _ = runner.encode([ahead.id, r.id], [ahead.input_ids, r.input_ids])
    runner.admit(Joining.of([ahead, r]), [cross[ahead.id]] * 3 + [cross[r.id]] * 4)
    slots, live = runner.slots, np.ones(7, bool)
    for tokens in ([12, 13, 14, 10, 10, 11, 12], [15, 15, 15, 20, 21, 20, 20]):  # 3, 4 share [start, 10]; 5, 6 [start]
        runner.step()
        slots.append(np.array(tokens), live)
    runner.step()  # writes column 2; the reorder comes right after a step, before the chosen tokens are appended
    kv = runner.cache.self_kv
    if variant == "int8":
        for buf in kv:
            assert buf[4, :, :2].tobytes() == buf[3, :, :2].tobytes()  # the premise: a shared prefix's columns
            assert buf[6, :, :1].tobytes() == buf[5, :, :1].tobytes()
            assert buf[6, :, 1].tobytes() != buf[5, :, 1].tobytes()  # tokens 12 and 11 differ
    parents = [buf[[3, 5], :, :3].copy() for buf in kv]
    for buf in kv:  # test-only poison: any write into a shared column replaces it
        buf[4, :, :2], buf[6, :, :1] = np.nan, np.nan
    runner.reorder(np.array([4, 6]), np.array([3, 5]))  # row 4 continues row 3, row 6 continues row 5
    first = (2, 1) if variant == "int8" else (0, 0)  # the first column each pair copies
    for buf, parent in zip(kv, parents):
        assert np.isnan(buf[4, :, : first[0]]).all() and np.isnan(buf[6, :, : first[1]]).all()  # skipped
        assert buf[4, :, first[0] : 3].tobytes() == parent[0, :, first[0] : 3].tobytes()
        assert buf[6, :, first[1] : 3].tobytes() == parent[1, :, first[1] : 3].tobytes()
    assert slots.ids[[4, 6], :3].tolist() == slots.ids[[3, 5], :3].tolist()  # the tokens moved with the K/V
