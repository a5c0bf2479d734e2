"""A small numpy MLP (one ReLU hidden layer, softmax cross-entropy) over one flat float64 vector.

A slot's gradient must be computed the same way on whichever rank runs it, or the combine's
fixed order would be fixed over different numbers. So: float64 throughout, one BLAS thread while
computing (threadpoolctl), the same shapes for the same slot, no transcendental in the hidden
layer. `exp`/`log` in the softmax use numpy's implementation of this machine: across nodes with
different CPU features (e.g. AVX-512 vs AVX2) numpy may pick other code paths, so a job that
must be bit-identical across heterogeneous nodes should keep its nodes homogeneous.
"""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_limits


class MLP:
    """The built-in `Model`: one ReLU hidden layer and softmax cross-entropy (summed over a slot's
    samples), in numpy with one BLAS thread. `inputs`, `hidden`, `classes`: ints >= 1, at most
    MAX_PARAMS parameters in all (`model-invalid` otherwise)."""

    MAX_PARAMS = 1 << 28  # 2 GiB per float64 vector; a learner holds several (params, moments, one per slot)

    def __init__(self, inputs: int, hidden: int, classes: int) -> None:
        from ..refusals import Refusal

        for name, v in (("inputs", inputs), ("hidden", hidden), ("classes", classes)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise Refusal("model-invalid", f"MLP {name} must be an integer >= 1, got {v!r}")
        inputs, hidden, classes = int(inputs), int(hidden), int(classes)
        total = inputs * hidden + hidden + hidden * classes + classes
        if total > self.MAX_PARAMS:
            raise Refusal(
                "model-invalid",
                f"an MLP of {inputs} inputs, {hidden} hidden units and {classes} classes has "
                f"{total} parameters ({total * 8 / 2**30:.1f} GiB per float64 vector), more "
                f"than the {self.MAX_PARAMS} allowed",
            )
        self.d, self.h, self.c = inputs, hidden, classes
        shapes = [("W1", (inputs, hidden)), ("b1", (hidden,)), ("W2", (hidden, classes)), ("b2", (classes,))]
        self.slices = {}
        off = 0
        for name, shape in shapes:
            size = int(np.prod(shape))
            self.slices[name] = (off, off + size, shape)
            off += size
        self.n_params = off

    def views(self, params: np.ndarray) -> dict:
        return {k: params[a:b].reshape(shape) for k, (a, b, shape) in self.slices.items()}

    def init(self, seed: int) -> np.ndarray:
        """He-style initial weights from a seed; identical on every rank and rank count."""
        rng = np.random.default_rng([seed, 0xA1FA])
        p = np.zeros(self.n_params)
        v = self.views(p)
        v["W1"][...] = rng.standard_normal((self.d, self.h)) * np.sqrt(2.0 / self.d)
        v["W2"][...] = rng.standard_normal((self.h, self.c)) * np.sqrt(1.0 / self.h)
        return p

    def loss_and_grad_sum(
        self, params: np.ndarray, X: np.ndarray, y: np.ndarray, grad_out: np.ndarray
    ) -> float:
        """Write Σ_i ∇loss_i into grad_out (a sum over the slot's samples, not a mean); return Σ loss_i."""
        with threadpool_limits(limits=1):
            v = self.views(params)
            z1 = X @ v["W1"] + v["b1"]
            a1 = np.maximum(z1, 0.0)
            logits = a1 @ v["W2"] + v["b2"]
            logits -= logits.max(axis=1, keepdims=True)
            e = np.exp(logits)
            s = e.sum(axis=1, keepdims=True)
            probs = e / s
            rows = np.arange(len(y))
            loss = float(np.sum(np.log(s[:, 0]) - logits[rows, y]))
            d = probs
            d[rows, y] -= 1.0
            g = self.views(grad_out)
            np.matmul(a1.T, d, out=g["W2"])
            g["b2"][...] = d.sum(axis=0)
            da1 = d @ v["W2"].T
            da1 *= z1 > 0
            np.matmul(X.T, da1, out=g["W1"])
            g["b1"][...] = da1.sum(axis=0)
        return loss

    def predict(self, params: np.ndarray, X: np.ndarray) -> np.ndarray:
        with threadpool_limits(limits=1):
            v = self.views(params)
            a1 = np.maximum(X @ v["W1"] + v["b1"], 0.0)
            return np.argmax(a1 @ v["W2"] + v["b2"], axis=1)
