"""A small numpy MLP (one ReLU hidden layer, softmax cross-entropy) over one flat float64 vector.

A slot's gradient must be computed the same way on whichever rank runs it, or the combine's
fixed order would be fixed over different numbers; and on whichever *machine* runs it, or a
cluster that mixes CPU types trains to another result than either type alone. So `MLP` computes
with alpha_mpi's fixed-order kernels only (`alpha_mpi.kernel`'s dense functions, which
`alpha_mpi.ops` offers users: every sum in one declared order, no fused multiply-add, exp/log by
one algorithm of alpha_mpi's), never BLAS or numpy's SIMD exp/log, and declares
`machine_independent = True`: its slot results do not depend on the CPU, the BLAS library or
kernel, or the thread count.

`BlasMLP` is the same model computed with numpy and BLAS (`@`, `np.exp`, `np.log`, `np.sum`),
as alpha_mpi 0.1 computed it: faster on some machines, and machine-dependent (another
OpenBLAS kernel, `OPENBLAS_CORETYPE`, another BLAS or another CPU gives other bits). It is the
reference `alpha-mpi bench train` measures against, and a model whose identity matters.
"""

from __future__ import annotations

import numpy as np

from .. import kernel

__all__ = ["MLP", "BlasMLP"]


class MLP:
    """The built-in `Model`: one ReLU hidden layer and softmax cross-entropy (summed over a slot's
    samples), computed with alpha_mpi's fixed-order kernels (those of `alpha_mpi.ops`), so its
    bits are the same on every machine. `inputs`, `hidden`, `classes`: ints >= 1, at most MAX_PARAMS
    parameters in all (`model-invalid` otherwise)."""

    MAX_PARAMS = 1 << 28  # 2 GiB per float64 vector; a learner holds several (params, moments, one per slot)

    #: True declares that the slot results do not depend on the compute identity (CPU, BLAS
    #: library and kernel, threads): every operation of `loss_and_grad_sum` and `predict` is an
    #: alpha_mpi fixed-order kernel or an element-wise numpy operation (one rounding each).
    machine_independent = True

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
        # Machine independence of these draws: numpy's Generator (PCG64, integer arithmetic)
        # draws standard normals by its ziggurat: 99.3% of draws are an integer times a table
        # entry (one rounding, the same everywhere); the rest accept or reject by comparing a
        # uniform with libm's exp (and log1p in the tail), whose last bit may differ between
        # libm builds (glibc's FMA and non-FMA variants, another libc, AArch64). A draw changes
        # only when the uniform falls within that last bit of the threshold (~2^-53 per draw),
        # so in practice the weights are the same bits on every machine with the same numpy
        # version (numpy does not promise Generator streams across versions); `* np.sqrt(..)` is
        # one correctly rounded multiply per element. The learner compares the initial
        # parameters across ranks at start (same_start.py): a difference would be refused
        # (`initial-params-mismatch`), never trained on.
        # The ISA path the kernels will run on, chosen now (ALPHA_MPI_ISA read): init runs on
        # every rank inside the learner's start agreement, so a path one rank cannot run is
        # refused there on every rank (kernel-isa-unavailable, peer-refused), not mid-step.
        kernel.isa_path()
        rng = np.random.default_rng([seed, 0xA1FA])
        p = np.zeros(self.n_params)
        v = self.views(p)
        v["W1"][...] = rng.standard_normal((self.d, self.h)) * np.sqrt(2.0 / self.d)
        v["W2"][...] = rng.standard_normal((self.h, self.c)) * np.sqrt(1.0 / self.h)
        return p

    def loss_and_grad_sum(
        self, params: np.ndarray, X: np.ndarray, y: np.ndarray, grad_out: np.ndarray
    ) -> float:
        """Write Σ_i ∇loss_i into grad_out (a sum over the slot's samples, not a mean); return Σ loss_i.

        The sums over samples (the weight and bias gradients, the loss) run over the slot's
        rows in ascending order, each product sum over ascending inner index (csrc/kernel/dense.h)."""
        v, g = self.views(params), self.views(grad_out)
        X = np.ascontiguousarray(X, dtype=np.float64)  # exact (float32, integers below 2**53)
        y = np.asarray(y)
        k, h = X.shape[0], self.h
        # alpha_mpi.kernel's functions with this method's buffers (alpha_mpi.ops is the same
        # with allocation and conversions, a microsecond more per call)
        z1 = kernel.matmul(np.empty((k, h)), X, v["W1"], v["b1"])  # (k, h): X W1, then + b1
        a1 = kernel.relu(np.empty((k, h)), z1)
        logits = kernel.matmul(np.empty((k, self.c)), a1, v["W2"], v["b2"])
        loss = kernel.softmax_xent(logits, logits, y)  # logits become probs - onehot
        kernel.matmul_tn(g["W2"], a1, logits)  # a1^T d: the sum over the k samples
        kernel.col_sum(g["b2"], logits)
        da1 = kernel.matmul_nt(a1, logits, v["W2"])  # d W2^T, into a1's buffer (a1 is done)
        kernel.relu_backward(da1, da1, z1)
        kernel.matmul_tn(g["W1"], X, da1)
        kernel.col_sum(g["b1"], da1)
        return loss

    def predict(self, params: np.ndarray, X: np.ndarray) -> np.ndarray:
        """Labels: the first class of largest logit per row (fixed-order kernels; argmax compares only)."""
        v = self.views(params)
        X = np.ascontiguousarray(X, dtype=np.float64)
        z1 = kernel.matmul(np.empty((X.shape[0], self.h)), X, v["W1"], v["b1"])
        a1 = kernel.relu(z1, z1)
        return np.argmax(kernel.matmul(np.empty((X.shape[0], self.c)), a1, v["W2"], v["b2"]), axis=1)


_blas = None  # one threadpoolctl controller: its limit() costs microseconds, threadpool_limits() tens


def _one_blas_thread():
    """A context with one BLAS thread (threadpoolctl), the controller made once."""
    global _blas
    if _blas is None:
        from threadpoolctl import ThreadpoolController

        _blas = ThreadpoolController()
    return _blas.limit(limits=1, user_api="blas")


class BlasMLP(MLP):
    """`MLP`'s model computed with numpy and BLAS (one BLAS thread): the same maths, other bits.

    Machine-dependent: BLAS picks its kernel (summation order, fused multiply-adds) by CPU
    (`OPENBLAS_CORETYPE`, another BLAS library), numpy its exp/log SIMD code, and `np.sum` its
    own order; ranks or resumes on other machine types give other bits. Kept as the reference
    `alpha-mpi bench train` compares the fixed-order kernels with, and as a model that depends
    on the compute identity (`machine_independent = False`)."""

    machine_independent = False

    def loss_and_grad_sum(
        self, params: np.ndarray, X: np.ndarray, y: np.ndarray, grad_out: np.ndarray
    ) -> float:
        """Write Σ_i ∇loss_i into grad_out; return Σ loss_i (numpy/BLAS, machine-dependent bits)."""
        with _one_blas_thread():
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
        """Labels by numpy/BLAS (machine-dependent near ties)."""
        with _one_blas_thread():
            v = self.views(params)
            a1 = np.maximum(X @ v["W1"] + v["b1"], 0.0)
            return np.argmax(a1 @ v["W2"] + v["b2"], axis=1)
