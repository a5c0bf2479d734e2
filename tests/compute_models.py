"""Test models for the compute identity (issue 32): one that calls BLAS and numpy's exp/log, so
its bits depend on the BLAS kernel and threads, and one built from elementwise binary64 ops only,
which declares `machine_independent = True` (its bits depend on no kernel).

`BlasModel`'s gradient also folds in one long BLAS dot over fixed vectors (`np.dot`, 400k words of
order-sensitive values): OpenBLAS splits that sum across its threads, so the slot's bits change
with the BLAS thread count as well as with the kernel (OPENBLAS_CORETYPE) — what lets a test on
one host make two ranks compute differently. Importable as a `--model` factory
(`compute_models:blas`, `compute_models:liar`, `compute_models:fixed`) with tests/ on the path.
"""

import math

import numpy as np

DOT = 400_000


class BlasModel:
    """Softmax regression computed with BLAS (X @ W, X.T @ P) and numpy's exp/log."""

    def __init__(self, inputs, classes, machine_independent=None):
        self.d, self.c = inputs, classes
        self.n_params = inputs * classes + classes
        if machine_independent is not None:
            self.machine_independent = machine_independent
        rng = np.random.default_rng(11)
        self.u = rng.standard_normal(DOT) * np.exp2(rng.integers(-30, 30, DOT))
        self.v = rng.standard_normal(DOT)

    def init(self, seed):
        return np.random.default_rng([seed, 7]).standard_normal(self.n_params) * 0.1

    def loss_and_grad_sum(self, params, X, y, grad_out):
        d, c = self.d, self.c
        W, b = params[: d * c].reshape(d, c), params[d * c :]
        z = X @ W + b
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        rows = np.arange(len(y))
        loss = -np.log(p[rows, y]).sum()
        p[rows, y] -= 1.0
        grad_out[: d * c] = (X.T @ p).ravel()
        grad_out[d * c :] = p.sum(axis=0)
        s = np.dot(self.u, self.v)  # a sum OpenBLAS splits across its threads
        grad_out[-1] += 1e-3 * (s - np.floor(s))
        return float(loss)

    def predict(self, params, X):
        d, c = self.d, self.c
        return np.argmax(X @ params[: d * c].reshape(d, c) + params[d * c :], axis=1)


class FixedModel:
    """Least squares of a linear model in elementwise binary64 operations and correctly rounded
    sums (math.fsum) only, each sample's contribution added in order: no BLAS, no SIMD reduction,
    so machine-independent, and it says so."""

    machine_independent = True

    def __init__(self, inputs, classes):
        self.d = inputs
        self.n_params = inputs + 1

    def init(self, seed):
        return np.random.default_rng([seed, 5]).standard_normal(self.n_params) * 0.1

    def loss_and_grad_sum(self, params, X, y, grad_out):
        w, b = params[:-1], params[-1]
        grad_out[:] = 0.0
        loss = 0.0
        for i in range(len(y)):
            r = math.fsum((w * X[i]).tolist()) + b - float(y[i])
            loss += r * r
            grad_out[:-1] += 2.0 * r * X[i]
            grad_out[-1] += 2.0 * r
        return loss


def blas(inputs, classes):
    """`--model compute_models:blas`: a model that calls BLAS (machine-dependent, undeclared)."""
    return BlasModel(inputs, classes)


def liar(inputs, classes):
    """`--model compute_models:liar`: a BLAS model that declares machine independence falsely."""
    return BlasModel(inputs, classes, machine_independent=True)


def fixed(inputs, classes):
    """`--model compute_models:fixed`: the machine-independent model."""
    return FixedModel(inputs, classes)
