"""The numpy learner passes each slot its generator: `rng=slot_generator(seed, step, slot)` to
a model whose loss_and_grad_sum takes `rng` (by name or **kwargs), nothing to one that does not
(old models keep working), and check_model's probe gives it the same generator both times."""

import numpy as np
from mpi4py import MPI

from alpha_mpi.learning import DataParallelLearner, check_model, slice_batch, slot_generator
from alpha_mpi.learning.protocol import takes_rng


class Linear:
    """Least squares on one weight vector; records what each call received."""

    n_params = 3

    def __init__(self):
        self.calls = []

    def init(self, seed):
        return np.zeros(self.n_params)

    def _grad(self, params, X, y, grad_out, noise):
        r = X @ params - y + noise
        grad_out[:] = X.T @ r
        return float(0.5 * r @ r)


class WithRng(Linear):
    def loss_and_grad_sum(self, params, X, y, grad_out, rng=None):
        draw = rng.random()
        self.calls.append(draw)
        return self._grad(params, X, y, grad_out, draw)


class WithKwargs(Linear):
    def loss_and_grad_sum(self, params, X, y, grad_out, **kw):
        self.calls.append(kw["rng"].random())
        return self._grad(params, X, y, grad_out, 0.0)


class Old(Linear):
    def loss_and_grad_sum(self, params, X, y, grad_out):
        self.calls.append(None)
        return self._grad(params, X, y, grad_out, 0.0)


def data(n=12):
    rng = np.random.default_rng(0)
    return rng.random((n, 3)), rng.random(n)


def test_each_slot_gets_the_generator_of_seed_step_slot():
    X, y = data()
    for cls in (WithRng, WithKwargs):
        m = cls()
        lr = DataParallelLearner(MPI.COMM_SELF, m, slots=3, seed=7, lr=1e-2)
        for _ in range(2):
            lr.train_step(slice_batch(X, y, 3, lr.my_slots))
        want = [slot_generator(7, t, s).random() for t in range(2) for s in range(3)]
        assert m.calls == want, cls.__name__
        assert len(set(want)) == 6


def test_models_without_rng_are_called_as_before_and_the_probe_repeats_the_generator():
    assert takes_rng(WithRng()) and takes_rng(WithKwargs()) and not takes_rng(Old())
    X, y = data()
    m = Old()
    lr = DataParallelLearner(MPI.COMM_SELF, m, slots=3, lr=1e-2)
    lr.train_step(slice_batch(X, y, 3, lr.my_slots))
    assert m.calls == [None] * 3
    r = WithRng()
    check_model(r, probe=(X[:4], y[:4]))  # two calls, same bits: the same generator both times
    assert len(r.calls) == 2 and r.calls[0] == r.calls[1]
