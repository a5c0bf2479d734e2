"""A float64 vector checked and its data pointer bound in one C call (csrc/kernel/vectors.h).

The prepared runs' steady state (execution/prepared.py, arrays/fast.py) binds each call's
arrays: a call with new arrays of a known geometry costs what that binding costs, and issue 42
gives it 1 µs over a call with the same arrays. In Python a new array costs a buffer export
(`ffi.from_buffer`) and a dozen attribute reads for its checks, about 1 µs per array; here
`bind(id(a), n, writeable, slot)` checks what those checks checked (an ndarray, not a
subclass; dtype float64's; 1-D of n; C-contiguous; aligned; writeable where asked) and writes
its data pointer to the C record entry at address `slot`, on every call, the same array
included: a buffer that moved or a layout set in place is never read through an earlier one.
`bind2(id(x), id(y), n, slot_x, slot_y)` binds a dot's two blocks, and `bind_tile(id(x),
id(y) or 0, nd, shape, strides, slot_x, slot_y)` an N-d tile's (its recorded shape and byte
strides exactly, aligned; a strided view's first element). Anything else returns
`OTHER` and writes nothing: the caller takes its full path, which copies or refuses by name.

It reads the object at CPython's id(); at import, probe arrays (contiguous, strided, read-only,
misaligned, 2-D, a subclass) are read both ways and must agree: elsewhere (another Python, a
NumPy whose layout differs) `READY` is False and the binders always return `OTHER`, so
every call takes the full path (slower, the same results).
"""

from __future__ import annotations

import sys

import numpy as np

from ..refusals import KernelRefusal
from .compiled import ffi, lib

__all__ = ["READY", "OTHER", "bind", "bind2", "bind_tile", "address"]

OTHER = 1  # vectors.h AK_VEC_OTHER (checked below)
_F64 = np.dtype(np.float64)


def address(table, index: int) -> int:
    """The address of entry `index` of a cdata array of pointers (a C record's entry)."""
    return int(ffi.cast("uintptr_t", ffi.addressof(table, index)))


def _probe_agrees() -> bool:
    """What C reads of each probe array is what NumPy says of it."""
    raw = np.zeros(80, dtype=np.uint8)
    frozen = np.arange(6.0)
    frozen.flags.writeable = False

    class Sub(np.ndarray):
        pass

    probes = (
        np.arange(5.0),
        np.arange(12.0)[::3],
        frozen,
        np.frombuffer(raw.data, dtype=np.float64, count=4, offset=1),
        np.zeros((3, 4)),
        np.zeros((3, 4, 5))[:, ::2].T,
        np.arange(4, dtype=np.int64),
        np.arange(3.0).view(Sub),
    )
    words = ffi.new("int64_t[]", lib.AK_VEC_PROBE_WORDS)
    for a in probes:
        lib.ak_vec_probe(id(a), words)
        data = a.__array_interface__["data"][0]
        flags = a.flags
        want_flags = (flags.c_contiguous, flags.aligned, flags.writeable)
        got_flags = tuple(bool(words[4] & lib_flag) for lib_flag in (0x1, 0x100, 0x400))
        if (
            words[0] != id(type(a))
            or words[1] != id(a.dtype)
            or words[2] != data
            or words[3] != a.ndim
            or got_flags != want_flags
            or words[5] != a.shape[0]
            or words[6] != a.strides[0]
            or words[7] != a.shape[-1]
            or words[8] != a.strides[-1]
        ):
            return False
    return True


def _ready() -> bool:
    if sys.implementation.name != "cpython":
        return False
    try:
        if lib.AK_VEC_OTHER != OTHER:
            return False
    except KernelRefusal:  # no compiled kernel: every kernel call refuses by name, not this import
        return False
    lib.ak_vec_kind(id(np.ndarray), id(_F64))
    return _probe_agrees()


def _other(*_args) -> int:
    return OTHER


READY = _ready()
bind = lib.ak_vec_bind if READY else _other
bind2 = lib.ak_vec_bind2 if READY else _other
bind_tile = lib.ak_vec_bind_tile if READY else _other
