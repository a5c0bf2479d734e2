"""Thin Python API over the C kernel (layer 3): fixed-order binary64 arithmetic on numpy
arrays, without copies.

Every function takes its output buffers from the caller (frame payloads, next-state
buffers), checks dtype / contiguity / writeability / length, wraps the buffers with
`ffi.from_buffer` and calls C. Status codes come back as named refusals
(`alpha_mpi.refusals.KernelRefusal`):

    kernel-bad-argument   wrong lengths, read-only or non-contiguous output, partial overlap
    dtype-invalid         not a native float64 (or float32 at a conversion site) ndarray
    kernel-bad-program    malformed postfix tree program
    non-finite-input      NaN/Inf in an update input (state left unchanged)
    non-finite-output     an update overflowed to Inf/NaN (state left unchanged)
    fp-environment-off-profile  FTZ/DAZ on or rounding not to nearest
    kernel-unavailable    the compiled module is missing

Evaluation orders (Adam, SGD, tree programs) are documented once, in csrc/kernel/alpha_kernel.h.
This module holds the combines (add, tree programs, fold) and the conversion sites; the package
(`alpha_mpi.kernel`) is what a caller imports, and re-exports the rest, split by concern: the
optimizer updates in updates.py, the buffer checks both wrap their C calls with in buffers.py,
the floating-point environment check and the build identity in env.py; the compiled module is
loaded once, by compiled.py (`ffi`, `lib`), and built by build.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

import numpy as np

from ..refusals import KernelRefusal
from .buffers import F32, FARR, I32, IARR, ND, bad_argument, f64_buffer, same_size
from .compiled import ffi, lib
from .env import build_info, fpenv_check, fpenv_state
from .identity import compute_identity
from .updates import adam_step, adam_step_inplace_checked, adamw_step, sgd_step

__all__ = [
    "add",
    "tree_eval",
    "fold",
    "check_program",
    "first_nonfinite",
    "adam_step",
    "adam_step_inplace_checked",
    "adamw_step",
    "sgd_step",
    "widen_binary32",
    "round_binary64",
    "fpenv_check",
    "fpenv_state",
    "build_info",
    "compute_identity",
    "OP_ADD",
    "MAX_DEPTH",
]

OP_ADD = -1
MAX_DEPTH = 64


# ----------------------------------------------------------------------------- combines


def add(out: np.ndarray, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """out = left + right (binary64, element by element). out may be left or right."""
    o = f64_buffer(out, "out", "add", True)
    l_ = f64_buffer(left, "left", "add")
    r = f64_buffer(right, "right", "add")
    n = out.size
    if left.size != n or right.size != n:
        same_size("add", n, (("left", left), ("right", right)))
    if lib.ak_add(o, l_, r, n):
        bad_argument("add", "out partially overlaps left or right")
    return out


def _program(program: np.ndarray | Sequence[int]) -> np.ndarray:
    p = program
    if type(p) is ND and p.dtype == I32 and p.ndim == 1 and p.flags.c_contiguous and p.flags.aligned:
        return program
    try:
        arr = np.asarray(program)
    except (TypeError, ValueError) as exc:
        raise KernelRefusal(
            "kernel-bad-program", f"a tree program is a sequence of int32, got {program!r}"
        ) from exc
    if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu":
        raise KernelRefusal(
            "kernel-bad-program",
            "a tree program is a non-empty 1-D sequence of integers (input index >= 0, -1 = add), "
            f"got {program!r}",
        )
    if int(arr.min()) < OP_ADD or int(arr.max()) > 2**31 - 1:
        raise KernelRefusal(
            "kernel-bad-program", f"tree program values must lie in -1 .. 2**31-1, got {program!r}"
        )
    return np.require(arr, I32, ("C", "A"))  # C reads `int32_t *`


def check_program(program: np.ndarray | Sequence[int], k: int) -> int:
    """Validate a postfix program over k inputs; return the stack depth it needs."""
    prog = _program(program)
    depth = ffi.new("size_t *")
    st = lib.ak_program_check(ffi.from_buffer(IARR, prog), prog.size, k, depth)
    if st:
        _program_refusal(prog, k)
    return int(depth[0])


def _program_refusal(prog: np.ndarray, k: int) -> NoReturn:
    # Re-walk in Python only to say what is wrong (the C check already refused).
    sp = 0
    reason = "it must leave exactly one value on the stack"
    for pc, op in enumerate(prog.tolist()):
        if op >= 0:
            if op >= k:
                reason = f"instruction {pc} pushes input {op}, but only {k} inputs were given"
                break
            sp += 1
            if sp > MAX_DEPTH:
                reason = f"instruction {pc} needs a stack deeper than {MAX_DEPTH}"
                break
        elif op == OP_ADD:
            if sp < 2:
                reason = f"instruction {pc} adds with {sp} value(s) on the stack"
                break
            sp -= 1
        else:
            reason = f"instruction {pc} is {op}, neither an input index nor -1 (add)"
            break
    else:
        reason = f"it leaves {sp} values on the stack, expected exactly 1"
    raise KernelRefusal("kernel-bad-program", f"tree program {prog.tolist()} over {k} inputs: {reason}", k=k)


def _pointer_array(fn, out, inputs):
    k = len(inputs)
    n = out.size
    ptrs = ffi.new("double *[]", k)
    keep = [None] * k
    for j, a in enumerate(inputs):
        buf = f64_buffer(a, f"inputs[{j}]", fn)
        if a.size != n:
            raise KernelRefusal(
                "kernel-bad-argument",
                f"{fn}: inputs[{j}] has {a.size} elements, expected {n}",
                argument=f"inputs[{j}]",
            )
        keep[j] = buf
        ptrs[j] = buf
    return ptrs, keep


def tree_eval(
    out: np.ndarray, inputs: Sequence[np.ndarray], program: np.ndarray | Sequence[int]
) -> np.ndarray:
    """Evaluate a postfix tree program over `inputs` into `out` in one sweep.

    `program`: value >= 0 pushes inputs[value]; -1 pops right then left and pushes
    left + right. A ready np.int32 array is used without a copy. out may be an input."""
    o = f64_buffer(out, "out", "tree_eval", True)
    prog = _program(program)
    ptrs, keep = _pointer_array("tree_eval", out, inputs)
    st = lib.ak_tree_eval(o, ptrs, len(inputs), out.size, ffi.from_buffer(IARR, prog), prog.size)
    if st:
        if st == lib.AK_ERR_BAD_PROGRAM:
            _program_refusal(prog, len(inputs))
        bad_argument("tree_eval", "out partially overlaps an input")
    return out


def fold(out: np.ndarray, inputs: Sequence[np.ndarray]) -> np.ndarray:
    """out = ((inputs[0] + inputs[1]) + inputs[2]) + ... (the star chain); out may be an input."""
    o = f64_buffer(out, "out", "fold", True)
    if len(inputs) == 0:
        raise KernelRefusal("kernel-bad-argument", "fold: at least one input is needed")
    ptrs, keep = _pointer_array("fold", out, inputs)
    if lib.ak_fold(o, ptrs, len(inputs), out.size):
        bad_argument("fold", "out partially overlaps an input")
    return out


def first_nonfinite(x: np.ndarray) -> int:
    """Index of the first NaN/Inf in the float64 array x, or -1."""
    return int(lib.ak_first_nonfinite(f64_buffer(x, "x", "first_nonfinite"), x.size))


# ----------------------------------------------------------------------------- conversions


def widen_binary32(out: np.ndarray, x32: np.ndarray) -> np.ndarray:
    """out (float64) = x32 (float32) exactly (the WidenBinary32 conversion site)."""
    fn = "widen_binary32"
    o = f64_buffer(out, "out", fn, True)
    if not isinstance(x32, ND) or x32.dtype != F32:
        raise KernelRefusal(
            "dtype-invalid",
            f"{fn}: x32 must be a native float32 array, got {getattr(x32, 'dtype', type(x32))}",
        )
    if not x32.flags.c_contiguous:
        raise KernelRefusal("kernel-bad-argument", f"{fn}: x32 must be C-contiguous")
    if not x32.flags.aligned:  # C reads `float *`: a copy on its 4-byte alignment
        x32 = np.array(x32)
    if x32.size != out.size:
        same_size(fn, out.size, (("x32", x32),))
    if lib.ak_widen_binary32(o, ffi.from_buffer(FARR, x32), out.size):
        bad_argument(fn, "out overlaps x32")
    return out


def round_binary64(out32: np.ndarray, x64: np.ndarray) -> np.ndarray:
    """out32 (float32) = x64 rounded to nearest-even (the RoundBinary64 conversion site).
    A non-finite x64 refuses with non-finite-input; a finite value beyond binary32's range
    refuses with non-finite-output."""
    fn = "round_binary64"
    if not isinstance(out32, ND) or out32.dtype != F32:
        raise KernelRefusal(
            "dtype-invalid",
            f"{fn}: out32 must be a native float32 array, got {getattr(out32, 'dtype', type(out32))}",
        )
    if not out32.flags.c_contiguous or not out32.flags.writeable or not out32.flags.aligned:
        raise KernelRefusal("kernel-bad-argument", f"{fn}: out32 must be C-contiguous, aligned and writeable")
    x = f64_buffer(x64, "x64", fn)
    if x64.size != out32.size:
        same_size(fn, out32.size, (("x64", x64),))
    idx = ffi.new("int64_t *")
    st = lib.ak_round_binary64(ffi.from_buffer(FARR, out32, True), x, x64.size, idx)
    if st:
        if st == lib.AK_ERR_BAD_ARGUMENT:
            bad_argument(fn, "out32 overlaps x64")
        i = int(idx[0])
        val = float(x64.reshape(-1)[i])
        if st == lib.AK_ERR_NONFINITE_INPUT:
            raise KernelRefusal(
                "non-finite-input", f"{fn}: x64[{i}] = {val!r} is not finite", array="x64", index=i
            )
        raise KernelRefusal(
            "non-finite-output",
            f"{fn}: x64[{i}] = {val!r} rounds beyond binary32's range (to Inf)",
            array="out32",
            index=i,
        )
    return out32
