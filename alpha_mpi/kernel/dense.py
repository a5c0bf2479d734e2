"""The fixed-order dense kernels (csrc/kernel/dense.h) on numpy arrays: products, column sums, ReLU,
softmax cross-entropy, exp and log, with the same bits on every machine (layer 3).

Each output has one declared evaluation order (written down once, in csrc/kernel/dense.h): a product's
sum runs over ascending l from +0.0, a product rounded before it is added (no fused
multiply-add), the bias added once after the whole sum; exp and log are one fixed algorithm of
alpha_mpi's (no libm, no numpy SIMD). The vector paths (AVX-512, AVX2, SSE2, NEON, generic C)
vectorize only across independent outputs, so every path, every CPU and AArch64 give the same
bits. Single-threaded.

Like the rest of `alpha_mpi.kernel`, every function takes its output from the caller (no
allocation) and checks its arguments, refusing by name:

    dtype-invalid           not a native float64 ndarray (labels: not an integer ndarray)
    kernel-bad-argument     a shape that does not fit, not C-contiguous, a read-only output, an
                            output overlapping an input, a label outside [0, classes)
    kernel-isa-unavailable  ALPHA_MPI_ISA (or select_isa_path) names a path this CPU lacks

`alpha_mpi.ops` is the same with allocation, for users' numpy models.

The ISA path: chosen on first use, the fastest this CPU supports, or the one the environment
variable ALPHA_MPI_ISA names (`generic`, `sse2`, `avx2`, `avx512`, `neon`): every path gives the
same bits, so the choice changes speed only. `isa_path()` says which runs.
"""

from __future__ import annotations

import os

import numpy as np

from ..refusals import KernelRefusal
from .buffers import ND, bad_argument, f64_buffer
from .compiled import ffi, lib

__all__ = [
    "ISA_ENV",
    "matmul",
    "matmul_tn",
    "matmul_nt",
    "col_sum",
    "relu",
    "relu_backward",
    "softmax_xent",
    "exp",
    "log",
    "isa_path",
    "isa_paths",
    "select_isa_path",
]

ISA_ENV = "ALPHA_MPI_ISA"
_I64 = np.dtype(np.int64)
_PATHS = ("generic", "sse2", "avx2", "avx512", "neon")  # index = AK_ISA_* of csrc/kernel/dense.h
_env_read = False  # ALPHA_MPI_ISA is read once, on the first product (or isa_path())


def isa_paths() -> list[str]:
    """The ISA paths this build can run on this CPU, e.g. ['generic', 'sse2', 'avx2', 'avx512']."""
    return [name for i, name in enumerate(_PATHS) if lib.ak_isa_available(i)]


def select_isa_path(name: str) -> str:
    """Run the products on path `name` from now on (every path gives the same bits); returns it.
    Refused with `kernel-isa-unavailable` when this CPU or build lacks it."""
    global _env_read
    _env_read = True  # an explicit choice wins over the environment
    i = _PATHS.index(name) if name in _PATHS else -1
    if i < 0 or lib.ak_isa_select(i):
        raise KernelRefusal(
            "kernel-isa-unavailable",
            f"the ISA path {name!r} is not available here; this CPU and build run {isa_paths()}",
            path=name,
            available=isa_paths(),
        )
    return name


def _read_env() -> None:
    global _env_read
    _env_read = True
    name = os.environ.get(ISA_ENV)
    if name:
        try:
            select_isa_path(name)
        except KernelRefusal as e:
            _env_read = False  # refused again at every reading until the setting is fixed
            raise KernelRefusal(
                "kernel-isa-unavailable", f"{ISA_ENV}={name}: {e.message}", **e.context
            ) from None


def isa_path() -> str:
    """The ISA path the products run on: 'avx512', 'avx2', 'sse2', 'neon' or 'generic' (the
    fastest this CPU supports unless ALPHA_MPI_ISA or select_isa_path chose another)."""
    if not _env_read:
        _read_env()
    return ffi.string(lib.ak_isa_name(lib.ak_isa_current())).decode()


# ----------------------------------------------------------------------------- argument checks


def _matrix(a, name: str, fn: str, writable: bool = False):
    """(cffi buffer, rows, cols) of a 2-D float64 C-contiguous array."""
    buf = f64_buffer(a, name, fn, writable)
    shape = a.shape
    if len(shape) != 2:
        raise KernelRefusal(
            "kernel-bad-argument", f"{fn}: {name} must be 2-D, got shape {shape}", argument=name
        )
    return buf, shape[0], shape[1]


def _shape_refusal(fn: str, what: str, **shapes) -> KernelRefusal:
    said = ", ".join(f"{k} {v.shape}" for k, v in shapes.items() if v is not None)
    return KernelRefusal("kernel-bad-argument", f"{fn}: {what} ({said})")


def _bias(bias, n: int, fn: str):
    if bias is None:
        return ffi.NULL
    buf = f64_buffer(bias, "bias", fn)
    if bias.ndim != 1 or bias.shape[0] != n:
        raise KernelRefusal(
            "kernel-bad-argument",
            f"{fn}: bias must have shape ({n},) (one value per output column), got {bias.shape}",
            argument="bias",
        )
    return buf


def _product(fn: str, c_fn, out, a, b, bias, a_t: bool, b_t: bool) -> np.ndarray:
    """Check and call one product: a_t / b_t say that a / b are stored transposed ((k, m) /
    (n, k)). The checks cost a few microseconds, which the small products feel."""
    if not _env_read:
        _read_env()
    pc, m, n = _matrix(out, "out", fn, True)
    pa, ar, ac = _matrix(a, "a", fn)
    pb, br, bc = _matrix(b, "b", fn)
    am, ak = (ac, ar) if a_t else (ar, ac)
    bk, bn = (bc, br) if b_t else (br, bc)
    if ak != bk or am != m or bn != n:
        raise _shape_refusal(fn, "the shapes do not fit", out=out, a=a, b=b)
    if c_fn(pc, pa, pb, ffi.NULL if bias is None else _bias(bias, n, fn), m, ak, n):
        bad_argument(fn, "out overlaps a, b or bias")
    return out


def matmul(out: np.ndarray, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """out (m, n) = a (m, k) @ b (k, n), plus bias (n,) once after each output's whole sum.

    Each out[i, j] is +0.0 + a[i,0]*b[0,j] + a[i,1]*b[1,j] + ... in ascending l, each product
    rounded, then + bias[j] (csrc/kernel/dense.h PRODUCTS). out must not overlap an input."""
    return _product("matmul", lib.ak_matmul, out, a, b, bias, False, False)


def matmul_tn(out: np.ndarray, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """out (m, n) = a.T @ b for a (k, m), b (k, n) (a layer's weight gradient X^T G: the sum over
    the k samples in ascending order), plus bias (n,) after the sum."""
    return _product("matmul_tn", lib.ak_matmul_tn, out, a, b, bias, True, False)


def matmul_nt(out: np.ndarray, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """out (m, n) = a @ b.T for a (m, k), b (n, k) (the gradient passed back, G W^T), plus bias
    (n,) after the sum."""
    return _product("matmul_nt", lib.ak_matmul_nt, out, a, b, bias, False, True)


def col_sum(out: np.ndarray, a: np.ndarray) -> np.ndarray:
    """out (n,) = the column sums of a (m, n): out[j] = +0.0 + a[0,j] + a[1,j] + ... (ascending
    rows; a bias gradient, the sum over samples). out must not overlap a."""
    fn = "col_sum"
    po = f64_buffer(out, "out", fn, True)
    pa, m, n = _matrix(a, "a", fn)
    if out.shape != (n,):
        raise _shape_refusal(fn, f"out must have shape ({n},)", out=out, a=a)
    if lib.ak_col_sum(po, pa, m, n):
        bad_argument(fn, "out overlaps a")
    return out


def _elementwise(fn: str, out, inputs) -> tuple:
    po = f64_buffer(out, "out", fn, True)
    bufs = []
    for name, x in inputs:
        bufs.append(f64_buffer(x, name, fn))
        if x.shape != out.shape:
            raise _shape_refusal(fn, f"{name} and out must have the same shape", out=out, **{name: x})
    return po, bufs


def relu(out: np.ndarray, z: np.ndarray) -> np.ndarray:
    """out = z where z > 0 (or z is NaN), else +0.0, element by element; out may be z."""
    po, (pz,) = _elementwise("relu", out, (("z", z),))
    if lib.ak_relu(po, pz, out.size):
        bad_argument("relu", "out partially overlaps z")
    return out


def relu_backward(out: np.ndarray, g: np.ndarray, z: np.ndarray) -> np.ndarray:
    """out = g where z > 0, else +0.0 (ReLU's backward mask; z: the layer's input before the
    ReLU); out may be g or z."""
    po, (pg, pz) = _elementwise("relu_backward", out, (("g", g), ("z", z)))
    if lib.ak_relu_backward(po, pg, pz, out.size):
        bad_argument("relu_backward", "out partially overlaps g or z")
    return out


def exp(out: np.ndarray, x: np.ndarray) -> np.ndarray:
    """out = exp(x) by alpha_mpi's one algorithm (fdlibm's reduction and polynomial, below 1 ulp;
    csrc/kernel/dense.h EXP); out may be x."""
    po, (px,) = _elementwise("exp", out, (("x", x),))
    if lib.ak_exp(po, px, out.size):
        bad_argument("exp", "out partially overlaps x")
    return out


def log(out: np.ndarray, x: np.ndarray) -> np.ndarray:
    """out = log(x) by alpha_mpi's one algorithm (csrc/kernel/dense.h LOG): NaN for x < 0, -Inf at 0;
    out may be x."""
    po, (px,) = _elementwise("log", out, (("x", x),))
    if lib.ak_log(po, px, out.size):
        bad_argument("log", "out partially overlaps x")
    return out


def softmax_xent(grad_out: np.ndarray, logits: np.ndarray, labels: np.ndarray) -> float:
    """Softmax cross-entropy of m rows of logits (m, c) against integer labels (m,) in [0, c):
    writes the gradient probabilities - onehot into grad_out (m, c) and returns the sum of the
    rows' losses log(sum_j exp(z_j - max)) - (z_y - max), in the order of csrc/kernel/dense.h SOFTMAX
    CROSS-ENTROPY. grad_out may be logits. A label outside [0, c) is refused before anything is
    written."""
    fn = "softmax_xent"
    pg, m, c = _matrix(grad_out, "grad_out", fn, True)
    pz = f64_buffer(logits, "logits", fn)
    if logits.shape != (m, c):
        raise _shape_refusal(
            fn, "grad_out and logits must have the same shape", grad_out=grad_out, logits=logits
        )
    if not isinstance(labels, ND) or labels.dtype != _I64:
        if isinstance(labels, ND) and labels.dtype.kind in "iu":
            labels = labels.astype(_I64)  # exact: the kernel checks the range
        else:
            raise KernelRefusal(
                "dtype-invalid",
                f"{fn}: labels must be an integer ndarray, got {getattr(labels, 'dtype', type(labels).__name__)}",
                argument="labels",
            )
    if labels.shape != (m,):
        raise _shape_refusal(fn, f"labels must have shape ({m},), one per row", logits=logits, labels=labels)
    if not (labels.flags.c_contiguous and labels.flags.aligned):
        labels = np.array(labels, order="C")
    loss = ffi.new("double *")
    bad = ffi.new("int64_t *", -1)
    st = lib.ak_softmax_xent(pg, loss, pz, ffi.from_buffer("int64_t[]", labels), m, c, bad)
    if st:
        i = int(bad[0])
        if i >= 0:
            raise KernelRefusal(
                "kernel-bad-argument",
                f"{fn}: labels[{i}] = {int(labels[i])} is not a class in 0..{c - 1}",
                argument="labels",
                index=i,
            )
        bad_argument(fn, "grad_out partially overlaps logits, or overlaps labels")
    return float(loss[0])
