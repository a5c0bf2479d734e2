"""Machine-independent numpy arithmetic for models: the bits do not depend on the CPU.

numpy's `@` calls BLAS, whose summation order (and fused multiply-adds) depend on the kernel it
picks for the CPU (`OPENBLAS_CORETYPE`, MKL's code path) and the thread count; `np.exp` and
`np.log` pick SIMD code by CPU too. A model computed with them gives other bits on another node
type, and a data-parallel run whose ranks differ trains to a third result. The functions here
compute the same values with alpha_mpi's fixed-order kernels (csrc/kernel/dense.h): each output's sum
in one declared order (ascending, from +0.0, every product rounded before it is added, no fused
multiply-add), vectorized only across independent outputs, exp and log by one fixed algorithm
of alpha_mpi's. So the bits are the same on AVX-512, AVX2, SSE2, AArch64 and at any thread
count (the kernels run on the calling thread).

    from alpha_mpi import ops

    z = ops.matmul(X, W1, bias=b1)            # X @ W1 + b1: sum over ascending k, then + b1
    a = ops.relu(z)
    logits = ops.matmul(a, W2, bias=b2)
    loss, d = ops.softmax_cross_entropy(logits, y)   # d = probabilities - onehot
    gW2 = ops.matmul_tn(a, d)                 # a.T @ d: the sum over the samples
    gb2 = ops.col_sum(d)                      # d.sum(axis=0), in row order
    dz = ops.relu_backward(ops.matmul_nt(d, W2), z)  # (d @ W2.T) where z > 0

Arrays are float64 (another dtype is refused, `dtype-invalid`: convert explicitly); a
non-contiguous float64 array is copied to C order first. Every function takes an optional `out`
(a C-contiguous float64 array of the result's shape, not overlapping the inputs except where a
function says so). Element-wise numpy (`+`, `*`, `/`, `np.sqrt`, `np.maximum`, comparisons) is
already machine-independent: each element is one correctly rounded operation. Sums and products
over an axis (`np.sum`, `@`, `np.dot`, `np.mean`) and transcendental functions are not: use these.

`alpha_mpi.learning.MLP` is built from the same kernels only (`alpha_mpi.kernel`'s functions,
which take their outputs from the caller) and declares `machine_independent = True`.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from . import kernel
from .refusals import KernelRefusal

__all__ = [
    "matmul",
    "matmul_tn",
    "matmul_nt",
    "col_sum",
    "relu",
    "relu_backward",
    "softmax_cross_entropy",
    "exp",
    "log",
    "isa_path",
]

_F64 = np.dtype(np.float64)


def _f64(x, name: str, fn: str) -> np.ndarray:
    """x as a C-contiguous, aligned float64 ndarray (a copy only when its layout is not); other
    dtypes are refused rather than converted behind the caller's back."""
    a = np.asarray(x)
    if a.dtype != _F64:
        raise KernelRefusal(
            "dtype-invalid",
            f"ops.{fn}: {name} must be float64, got {a.dtype} (convert it explicitly, e.g. x.astype(np.float64))",
            argument=name,
        )
    return np.require(a, requirements=("C", "A"))


def _out(out, shape, fn: str) -> np.ndarray:
    if out is None:
        return np.empty(shape)
    if not isinstance(out, np.ndarray) or out.shape != tuple(shape):
        raise KernelRefusal(
            "kernel-bad-argument",
            f"ops.{fn}: out must be a float64 array of shape {tuple(shape)}, got "
            f"{getattr(out, 'shape', type(out).__name__)}",
            argument="out",
        )
    return out


def _dims(a: np.ndarray, name: str, fn: str) -> tuple:
    if a.ndim != 2:
        raise KernelRefusal(
            "kernel-bad-argument", f"ops.{fn}: {name} must be 2-D, got shape {a.shape}", argument=name
        )
    return a.shape


def _product(fn: str, kernel_fn, a, b, bias, out, a_cols: bool, b_rows: bool) -> np.ndarray:
    """Convert, allocate and call one product; C is (a's rows or columns, b's columns or rows)."""
    a, b = _f64(a, "a", fn), _f64(b, "b", fn)
    bias = None if bias is None else _f64(bias, "bias", fn)
    m = _dims(a, "a", fn)[1 if a_cols else 0]
    n = _dims(b, "b", fn)[0 if b_rows else 1]
    return kernel_fn(_out(out, (m, n), fn), a, b, bias)


def matmul(
    a: ArrayLike, b: ArrayLike, bias: ArrayLike | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """a (m, k) @ b (k, n) [+ bias (n,)]: each output +0.0 + a[i,0]*b[0,j] + ... in ascending
    k, then + bias[j] once after the whole sum."""
    return _product("matmul", kernel.matmul, a, b, bias, out, False, False)


def matmul_tn(
    a: ArrayLike, b: ArrayLike, bias: ArrayLike | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """a.T @ b for a (k, m), b (k, n) [+ bias (n,)]: the sum over the k rows (samples) in
    ascending order, e.g. a dense layer's weight gradient X.T @ dZ."""
    return _product("matmul_tn", kernel.matmul_tn, a, b, bias, out, True, False)


def matmul_nt(
    a: ArrayLike, b: ArrayLike, bias: ArrayLike | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """a @ b.T for a (m, k), b (n, k) [+ bias (n,)], e.g. the gradient a dense layer passes
    back, dZ @ W.T (W stored (n, k))."""
    return _product("matmul_nt", kernel.matmul_nt, a, b, bias, out, False, True)


def col_sum(a: ArrayLike, out: np.ndarray | None = None) -> np.ndarray:
    """The column sums of a (m, n), each +0.0 + a[0,j] + a[1,j] + ... in row order (what
    `a.sum(axis=0)` computes in an order of its own): a bias gradient."""
    a = _f64(a, "a", "col_sum")
    n = _dims(a, "a", "col_sum")[1]
    return kernel.col_sum(_out(out, (n,), "col_sum"), a)


def relu(z: ArrayLike, out: np.ndarray | None = None) -> np.ndarray:
    """z where z > 0 (NaN stays NaN), else +0.0; out may be z."""
    z = _f64(z, "z", "relu")
    return kernel.relu(_out(out, z.shape, "relu"), z)


def relu_backward(g: ArrayLike, z: ArrayLike, out: np.ndarray | None = None) -> np.ndarray:
    """g where z > 0, else +0.0: the gradient through a ReLU whose input was z; out may be g."""
    g, z = _f64(g, "g", "relu_backward"), _f64(z, "z", "relu_backward")
    return kernel.relu_backward(_out(out, g.shape, "relu_backward"), g, z)


def softmax_cross_entropy(
    logits: ArrayLike, labels: ArrayLike, grad_out: np.ndarray | None = None
) -> tuple[float, np.ndarray]:
    """(loss, grad) of a softmax cross-entropy summed over the rows: `logits` (m, c), integer
    `labels` (m,) in [0, c). loss = the sum over rows (ascending) of
    log(sum_j exp(z_j - max_j z)) - (z_y - max_j z); grad = softmax probabilities - onehot
    (the gradient of that sum with respect to the logits). grad_out may be logits."""
    logits = _f64(logits, "logits", "softmax_cross_entropy")
    _dims(logits, "logits", "softmax_cross_entropy")
    grad = _out(grad_out, logits.shape, "softmax_cross_entropy")
    labels = np.asarray(labels)
    loss = kernel.softmax_xent(grad, logits, labels)
    return loss, grad


def exp(x: ArrayLike, out: np.ndarray | None = None) -> np.ndarray:
    """exp(x), element by element, by alpha_mpi's one algorithm (below 1 ulp; subnormal results
    rounded once; +Inf above 709.78, +0 below -745.13); out may be x."""
    x = _f64(x, "x", "exp")
    return kernel.exp(_out(out, x.shape, "exp"), x)


def log(x: ArrayLike, out: np.ndarray | None = None) -> np.ndarray:
    """log(x), element by element, by alpha_mpi's one algorithm (below 1 ulp; -Inf at 0, NaN
    below 0); out may be x."""
    x = _f64(x, "x", "log")
    return kernel.log(_out(out, x.shape, "log"), x)


def isa_path() -> str:
    """Which vector path runs the products here ('avx512', 'avx2', 'sse2', 'neon', 'generic'):
    speed only, never bits. The environment variable ALPHA_MPI_ISA chooses another."""
    return kernel.isa_path()
