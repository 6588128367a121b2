"""engine/constraints.py: generation_config's token rules as Hugging Face's logits processors apply them."""
from __future__ import annotations

import numpy as np

from seqserve.engine.constraints import Constraints


def test_bad_words_forced_bos_and_forced_eos_per_row():
    rules = Constraints.from_generation({"bad_words_ids": [4], "forced_bos_token_id": 1, "forced_eos_token_id": 2})
    scores = np.zeros((3, 6))
    scores[:, 4] = 9.0  # the banned token is everyone's best
    rules.apply(scores, length=np.array([0, 3, 4]), max_new=np.array([5, 5, 5]))
    assert scores[0].argmax() == 1 and np.isinf(scores[0, [0, 2, 3, 4, 5]]).all()  # first token: forced BOS
    assert scores[1, 4] == -np.inf and np.isfinite(scores[1, [0, 1, 2, 3, 5]]).all()  # only the ban
    assert scores[2].argmax() == 2 and scores[2, 2] == 0 and np.isinf(scores[2, [0, 1, 3, 4, 5]]).all()  # the last


def test_never_sampled_keeps_the_end_token_and_a_forced_first_token():
    special = {"pad_id": 1, "bos_id": 0, "eos_id": 2, "unk_id": 3, "decoder_start_id": 2}  # BART's
    assert Constraints.from_generation({"forced_bos_token_id": 0}).never_sampled(special).tolist() == [1, 3]
    marian = {"pad_id": 9, "bos_id": 9, "eos_id": 0, "unk_id": 1, "decoder_start_id": 9}
    assert Constraints.from_generation({"bad_words_ids": [9]}).never_sampled(marian).tolist() == [1, 9]
    seeds = {"pad_id": 0, "bos_id": 1, "eos_id": 2, "unk_id": 3}
    assert Constraints().never_sampled(seeds).tolist() == [0, 1, 3] and not Constraints().active


def test_a_rows_own_first_token_replaces_the_models_forced_bos_for_that_row_alone():
    """A multilingual batch: each row forces its own target language; -1 keeps the model's rule."""
    rules = Constraints.from_generation({"forced_bos_token_id": 1}, per_row_first=True)
    assert rules.active and not Constraints.from_generation({}).per_row_first
    scores = np.zeros((4, 6))
    rules.apply(scores, length=np.array([0, 0, 0, 2]), max_new=np.array([5, 5, 5, 5]),
                first=np.array([4, 5, -1, 3]))
    assert [int(scores[r].argmax()) for r in range(3)] == [4, 5, 1]  # own, own, the model's
    assert all(np.isinf(np.delete(scores[r], t)).all() for r, t in ((0, 4), (1, 5), (2, 1)))
    assert np.isfinite(scores[3]).all()  # past its first token, a row's own token forces nothing
