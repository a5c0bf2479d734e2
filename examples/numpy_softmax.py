"""Your own numpy model through the protocol: softmax regression trained data-parallel.

    mpiexec -n 1 python examples/numpy_softmax.py       # one `digest (...):` line on 1, 2 and 4 ranks
    mpiexec -n 4 python examples/numpy_softmax.py --partition state
    mpiexec -n 4 python examples/numpy_softmax.py --stop-after 30 --checkpoint-dir /tmp/sm
    mpiexec -n 2 python examples/numpy_softmax.py --resume --checkpoint-dir /tmp/sm   # same digest

The model is a plain class with the four members of alpha_mpi.learning.Model; nothing to
inherit. Also a factory for `alpha-mpi train --model numpy_softmax:factory`.
"""

import argparse

import numpy as np
from threadpoolctl import threadpool_limits

from alpha_mpi.learning import DataParallelLearner, SlotStream, stream_batch
from alpha_mpi.learning.data import synthetic


class SoftmaxRegression:
    """logits = X @ W + b; loss = Σ_i cross-entropy_i. Parameters: W (d, c) then b (c,)."""

    def __init__(self, inputs: int, classes: int):
        self.d, self.c = inputs, classes
        self.n_params = inputs * classes + classes

    def _split(self, params):
        return params[: self.d * self.c].reshape(self.d, self.c), params[self.d * self.c :]

    def init(self, seed: int) -> np.ndarray:
        """Small seeded weights, zero bias: a function of the seed alone."""
        p = np.zeros(self.n_params)
        p[: self.d * self.c] = np.random.default_rng([seed, 7]).standard_normal(self.d * self.c) * 0.01
        return p

    def loss_and_grad_sum(self, params, X, y, grad_out) -> float:
        """Σ_i ∇loss_i into grad_out (a sum over the slot, not a mean); returns Σ_i loss_i."""
        with threadpool_limits(limits=1):  # one BLAS thread: the same bits wherever the slot runs
            W, b = self._split(params)
            z = X @ W + b
            z -= z.max(axis=1, keepdims=True)
            e = np.exp(z)
            s = e.sum(axis=1, keepdims=True)
            rows = np.arange(len(y))
            loss = float(np.sum(np.log(s[:, 0]) - z[rows, y]))
            d = e / s
            d[rows, y] -= 1.0
            gW, gb = self._split(grad_out)
            np.matmul(X.T, d, out=gW)
            gb[...] = d.sum(axis=0)
        return loss

    def predict(self, params, X) -> np.ndarray:
        """Labels: argmax of the logits."""
        with threadpool_limits(limits=1):
            W, b = self._split(params)
            return np.argmax(X @ W + b, axis=1)


def factory(inputs: int, classes: int) -> SoftmaxRegression:
    """For `alpha-mpi train --model numpy_softmax:factory`."""
    return SoftmaxRegression(inputs, classes)


def main(argv=None) -> str:
    """Train on the synthetic task; rank 0 prints the loss and the digest."""
    from mpi4py import MPI

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--batch", type=int, default=200)
    p.add_argument("--partition", default="none", choices=("none", "state", "grads", "params"))
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--stop-after", type=int, default=None)
    p.add_argument("--resume", action="store_true")
    a = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    say = print if comm.Get_rank() == 0 else (lambda *x, **k: None)
    data = synthetic(3, n=4096, n_eval=512, inputs=32, classes=5)
    model = SoftmaxRegression(data.inputs, data.classes)
    learner = DataParallelLearner(
        comm, model, slots=a.slots, optimizer="adam", lr=5e-3, partition=a.partition, seed=1
    )
    stream = SlotStream(len(data.y), a.batch, a.slots, seed=1)
    config = {"slots": a.slots, "batch": a.batch, "seed": 1}
    if a.resume and a.checkpoint_dir and learner.restore(a.checkpoint_dir, config, missing_ok=True):
        say(f"# resumed at step {learner.step}")
    loss = float("nan")
    while learner.step < a.steps:
        loss, _ = learner.train_step(stream_batch(stream, learner.step, learner.my_slots, data.X, data.y))
        if learner.step == a.stop_after and a.checkpoint_dir:
            learner.save(a.checkpoint_dir, config)
            say(f"# stopped after step {learner.step} (checkpoint saved)")
            return learner.state_digest()
    params = learner.final_params()
    acc = float(np.mean(model.predict(params, data.X_eval) == data.y_eval))
    say(
        f"# softmax regression, {model.n_params} parameters, {a.slots} slots on {comm.Get_size()} ranks, "
        f"partition {a.partition}"
    )
    say(f"final loss {loss:.6f}  eval accuracy {acc:.4f}")
    d = learner.state_digest()  # the whole state: parameters, Adam's m and v, step, seed
    say(f"digest (params, optimizer, step, rng): {d}")
    return d


if __name__ == "__main__":
    main()
