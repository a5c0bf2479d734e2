"""learning/same_start.py in one process: the start every rank must share is checked locally
(float64, the model's length, finite) and its digest words are exact binary64 integers."""

import numpy as np
import pytest

from alpha_mpi.learning import MLP, DataParallelLearner
from alpha_mpi.learning.same_start import ITEM_WORDS, Item, _hex, _shown, _words, agree, start_params
from alpha_mpi.refusals import Refusal


def comm_self():
    from mpi4py import MPI

    return MPI.COMM_SELF


class BadInit(MLP):
    def __init__(self, value):
        super().__init__(4, 3, 2)
        self.value = value

    def init(self, seed):
        return self.value(super().init(seed))


@pytest.mark.parametrize(
    "broken",
    [
        lambda p: p.astype(np.float32),
        lambda p: p[:-1],
        lambda p: list(p),
        lambda p: np.where(p > 0, np.nan, p),
    ],
    ids=["float32", "short", "list", "nan"],
)
def test_an_init_that_breaks_the_protocol_is_refused_by_the_learner(broken):
    with pytest.raises(Refusal) as e:
        DataParallelLearner(comm_self(), BadInit(broken), slots=2)
    assert e.value.code == "model-protocol" and "init(0)" in e.value.message


@pytest.mark.parametrize("bad", [np.zeros(3), [[0.0]], "x", np.full(MLP(4, 3, 2).n_params, np.inf)])
def test_init_params_of_the_wrong_shape_or_not_finite_are_a_usage_error(bad):
    with pytest.raises(Refusal) as e:
        start_params(comm_self(), MLP(4, 3, 2), seed=0, init_params=bad)
    assert e.value.code == "usage" and "init_params" in e.value.message


def test_the_digest_words_are_64_bit_integers_and_name_the_bits():
    p = MLP(4, 3, 2).init(1)
    w = _words(Item("x", p, None, shown="SkylakeX ü"))
    assert len(w) == ITEM_WORDS and w[0] == p.size
    assert all(type(x) is int and 0 <= x < 2**64 for x in w)
    import hashlib

    assert _hex(w) == hashlib.sha256(p.astype("<f8").tobytes()).hexdigest()
    assert _shown(w) == "SkylakeX ü" and _shown(_words(Item("x", p, None))) == ""
    q = p.copy()
    q[0] = np.nextafter(q[0], 1.0)
    assert _words(Item("x", q, None, shown="SkylakeX ü")) != w


def test_alone_a_local_failure_is_raised_and_agreement_passes():
    p = MLP(4, 3, 2).init(0)
    agree(comm_self(), [Item("x", p, "initial-params-mismatch")], what="testing")
    with pytest.raises(ValueError):
        agree(
            comm_self(), [Item("x", None, "initial-params-mismatch")], what="testing", local=ValueError("own")
        )
