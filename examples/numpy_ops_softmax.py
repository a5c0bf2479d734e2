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
from numpy_softmax import SoftmaxRegression

from alpha_mpi import ops


class OpsSoftmaxRegression(SoftmaxRegression):
    """numpy_softmax.py's model (parameters, init) with its two computing methods on ops."""

    #: The slot results do not depend on the CPU, BLAS library or thread count.
    machine_independent = True

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
