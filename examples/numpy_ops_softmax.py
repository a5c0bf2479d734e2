"""Your own numpy model with the same bits on every machine: softmax regression on alpha_mpi.ops.

    cd examples && mpiexec -n 2 alpha-mpi train --model numpy_ops_softmax:factory --steps 50
    # the same state digest under OPENBLAS_CORETYPE=Haswell, =Sandybridge, on AArch64, mixed

numpy_softmax.py computes the same model with `@`, `np.exp`, `np.log` and `.sum()`: BLAS and
numpy choose their summation order, fused multiply-adds and SIMD code by CPU, so its digest
changes with the machine (and ranks on different CPU types train to a third result). Here every
sum over an axis and every exp/log is one of alpha_mpi's fixed-order kernels (`alpha_mpi.ops`);
what remains is element-wise numpy, one correctly rounded operation per element. The class says
so with `machine_independent = True`.
"""

import numpy as np

from alpha_mpi import ops


class OpsSoftmaxRegression:
    """logits = X @ W + b; loss = Σ_i cross-entropy_i. Parameters: W (d, c) then b (c,)."""

    #: The slot results do not depend on the CPU, BLAS library or thread count.
    machine_independent = True

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
        W, b = self._split(params)
        gW, gb = self._split(grad_out)
        logits = ops.matmul(X, W, bias=b)  # each output: Σ over ascending k, then + b
        loss, d = ops.softmax_cross_entropy(logits, y, grad_out=logits)  # d = probabilities - onehot
        ops.matmul_tn(X, d, out=gW)  # X.T @ d: the sum over the slot's samples, in order
        ops.col_sum(d, out=gb)
        return loss

    def predict(self, params, X) -> np.ndarray:
        """Labels: argmax of the logits."""
        W, b = self._split(params)
        return np.argmax(ops.matmul(X, W, bias=b), axis=1)


def factory(inputs: int, classes: int) -> OpsSoftmaxRegression:
    """For `alpha-mpi train --model numpy_ops_softmax:factory`."""
    return OpsSoftmaxRegression(inputs, classes)
