"""The argument checks every kernel wrapper shares (layer 3): buffers in, named refusals out.

Apart from api.py and updates.py because both wrap their C calls with them: a float64
buffer is checked (dtype, contiguity, writeability) and wrapped with `ffi.from_buffer` in one
step, sizes are compared, and a C status of bad argument becomes `kernel-bad-argument`. Not
user API: `alpha_mpi.kernel` is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, NoReturn

import numpy as np

from ..refusals import KernelRefusal
from .compiled import ffi

if TYPE_CHECKING:
    from cffi import FFI

__all__ = ["F64", "F32", "I32", "ND", "DARR", "FARR", "IARR", "f64_buffer", "same_size", "bad_argument"]

F64 = np.dtype(np.float64)
F32 = np.dtype(np.float32)
I32 = np.dtype(np.int32)
ND = np.ndarray
try:  # resolved once: from_buffer with a ctype object skips parsing the type string
    DARR, FARR, IARR = ffi.typeof("double[]"), ffi.typeof("float[]"), ffi.typeof("int32_t[]")
except KernelRefusal:  # pragma: no cover - no compiled kernel
    DARR = FARR = IARR = None


def f64_buffer(a: np.ndarray, name: str, fn: str, writable: bool = False) -> FFI.CData:
    """`a` (a native float64 C-contiguous ndarray; writeable when `writable`) as a cffi buffer.

    Refused: `dtype-invalid` (not an ndarray, not float64), `kernel-bad-argument`
    (not C-contiguous, or a read-only output); `name` and `fn` say which argument of which call.
    """
    # Hot path: one identity test and one from_buffer (which itself refuses non-C-contiguous
    # and, for outputs, read-only arrays); the explanations are built only on failure.
    try:
        dt = a.dtype
        if dt is F64 or dt == F64:
            if a.flags.aligned:
                return ffi.from_buffer(DARR, a, writable)
            return _misaligned(a, name, fn, writable)
    except AttributeError:
        pass
    except (ValueError, BufferError, TypeError):
        if isinstance(a, ND) and writable and not a.flags.writeable:
            raise KernelRefusal(
                "kernel-bad-argument", f"{fn}: output {name} is read-only", argument=name
            ) from None
        raise KernelRefusal(
            "kernel-bad-argument",
            f"{fn}: {name} must be a C-contiguous array (got strides {getattr(a, 'strides', None)})",
            argument=name,
        ) from None
    if not isinstance(a, ND):
        raise KernelRefusal(
            "dtype-invalid",
            f"{fn}: {name} must be a numpy float64 array, got {type(a).__name__}",
            argument=name,
        )
    raise KernelRefusal("dtype-invalid", f"{fn}: {name} must be native float64, got {a.dtype}", argument=name)


def _misaligned(a: np.ndarray, name: str, fn: str, writable: bool) -> FFI.CData:
    """A float64 array off its 8-byte alignment (np.frombuffer(b, offset=1)): C reading it as
    `double *` is undefined behaviour (a fault on strict-alignment CPUs). An input is copied
    (the cdata holds the copy); an output cannot be, and is refused."""
    if writable:
        raise KernelRefusal(
            "kernel-bad-argument",
            f"{fn}: output {name} is not 8-byte aligned (a float64 view at an odd byte offset); "
            "pass an aligned array (np.empty, or a copy)",
            argument=name,
        )
    if not a.flags.c_contiguous:
        raise KernelRefusal(
            "kernel-bad-argument",
            f"{fn}: {name} must be a C-contiguous array (got strides {a.strides})",
            argument=name,
        )
    return ffi.from_buffer(DARR, np.array(a, order="C"))


def same_size(fn: str, n: int, pairs: Iterable[tuple[str, np.ndarray]]) -> None:
    """Refuse (`kernel-bad-argument`) the first (name, array) in `pairs` without `n` elements."""
    for name, a in pairs:
        if a.size != n:
            raise KernelRefusal(
                "kernel-bad-argument", f"{fn}: {name} has {a.size} elements, expected {n}", argument=name
            )


def bad_argument(fn: str, what: str) -> NoReturn:
    """Raise `kernel-bad-argument` for a C call that refused its buffers (`what` says how)."""
    raise KernelRefusal(
        "kernel-bad-argument",
        f"{fn}: {what} (outputs must be disjoint from inputs, or exactly the same buffer where allowed)",
    )
