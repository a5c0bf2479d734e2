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

Evaluation orders (Adam, SGD, tree programs) are documented once, in csrc/alpha_kernel.h.
The floating-point environment check and the build identity live in kernel_env.py (re-exported
here); the compiled module is loaded once, by _kernel_lib.py (`ffi`, `lib`).
"""

from __future__ import annotations

import numpy as np

from ._kernel_lib import ffi, lib
from .kernel_env import build_info, fpenv_check, fpenv_state
from .refusals import KernelRefusal

__all__ = [
    "add",
    "tree_eval",
    "fold",
    "check_program",
    "first_nonfinite",
    "adam_step",
    "adam_step_inplace_checked",
    "sgd_step",
    "widen_binary32",
    "round_binary64",
    "fpenv_check",
    "fpenv_state",
    "build_info",
    "OP_ADD",
    "MAX_DEPTH",
]

OP_ADD = -1
MAX_DEPTH = 64

_F64 = np.dtype(np.float64)
_F32 = np.dtype(np.float32)
_I32 = np.dtype(np.int32)
_ND = np.ndarray
try:  # resolved once: from_buffer with a ctype object skips parsing the type string
    _DARR, _FARR, _IARR = ffi.typeof("double[]"), ffi.typeof("float[]"), ffi.typeof("int32_t[]")
except KernelRefusal:  # pragma: no cover - no compiled kernel
    _DARR = _FARR = _IARR = None

_ADAM_SCALARS = ("lr", "b1", "b2", "eps", "b1t", "b2t")
_SGD_SCALARS = ("lr", "momentum")
# AK_W_* -> (input name, output name)
_ADAM_WHICH = {0: ("p", "p_out"), 1: ("m", "m_out"), 2: ("v", "v_out"), 3: ("g", "g")}
_SGD_WHICH = {0: ("p", "p_out"), 3: ("g", "g"), 4: ("buf", "buf_out")}
_ADAM_INPLACE_WHICH = {0: ("p", "p"), 1: ("m", "m"), 2: ("v", "v"), 3: ("g", "g")}
_W_SCALAR = 5
_W_INTERMEDIATE = 6


# ----------------------------------------------------------------------------- checks


def _f64(a, name, fn, writable=False):
    # Hot path: one identity test and one from_buffer (which itself refuses non-C-contiguous
    # and, for outputs, read-only arrays); the explanations are built only on failure.
    try:
        dt = a.dtype
        if dt is _F64 or dt == _F64:
            return ffi.from_buffer(_DARR, a, writable)
    except AttributeError:
        pass
    except (ValueError, BufferError, TypeError):
        if isinstance(a, _ND) and writable and not a.flags.writeable:
            raise KernelRefusal(
                "kernel-bad-argument", f"{fn}: output {name} is read-only", argument=name
            ) from None
        raise KernelRefusal(
            "kernel-bad-argument",
            f"{fn}: {name} must be a C-contiguous array (got strides {getattr(a, 'strides', None)})",
            argument=name,
        ) from None
    if not isinstance(a, _ND):
        raise KernelRefusal(
            "dtype-invalid",
            f"{fn}: {name} must be a numpy float64 array, got {type(a).__name__}",
            argument=name,
        )
    raise KernelRefusal("dtype-invalid", f"{fn}: {name} must be native float64, got {a.dtype}", argument=name)


def _same_size(fn, n, pairs):
    for name, a in pairs:
        if a.size != n:
            raise KernelRefusal(
                "kernel-bad-argument", f"{fn}: {name} has {a.size} elements, expected {n}", argument=name
            )


def _bad_argument(fn, what):
    raise KernelRefusal(
        "kernel-bad-argument",
        f"{fn}: {what} (outputs must be disjoint from inputs, or exactly the same buffer where allowed)",
    )


# ----------------------------------------------------------------------------- combines


def add(out, left, right):
    """out = left + right (binary64, element by element). out may be left or right."""
    o = _f64(out, "out", "add", True)
    l_ = _f64(left, "left", "add")
    r = _f64(right, "right", "add")
    n = out.size
    if left.size != n or right.size != n:
        _same_size("add", n, (("left", left), ("right", right)))
    if lib.ak_add(o, l_, r, n):
        _bad_argument("add", "out partially overlaps left or right")
    return out


def _program(program):
    if type(program) is _ND and program.dtype == _I32 and program.ndim == 1 and program.flags.c_contiguous:
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
    return np.ascontiguousarray(arr, dtype=_I32)


def check_program(program, k):
    """Validate a postfix program over k inputs; return the stack depth it needs."""
    prog = _program(program)
    depth = ffi.new("size_t *")
    st = lib.ak_program_check(ffi.from_buffer(_IARR, prog), prog.size, k, depth)
    if st:
        _program_refusal(prog, k)
    return int(depth[0])


def _program_refusal(prog, k):
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
        buf = _f64(a, f"inputs[{j}]", fn)
        if a.size != n:
            raise KernelRefusal(
                "kernel-bad-argument",
                f"{fn}: inputs[{j}] has {a.size} elements, expected {n}",
                argument=f"inputs[{j}]",
            )
        keep[j] = buf
        ptrs[j] = buf
    return ptrs, keep


def tree_eval(out, inputs, program):
    """Evaluate a postfix tree program over `inputs` into `out` in one sweep.

    `program`: value >= 0 pushes inputs[value]; -1 pops right then left and pushes
    left + right. A ready np.int32 array is used without a copy. out may be an input."""
    o = _f64(out, "out", "tree_eval", True)
    prog = _program(program)
    ptrs, keep = _pointer_array("tree_eval", out, inputs)
    st = lib.ak_tree_eval(o, ptrs, len(inputs), out.size, ffi.from_buffer(_IARR, prog), prog.size)
    if st:
        if st == lib.AK_ERR_BAD_PROGRAM:
            _program_refusal(prog, len(inputs))
        _bad_argument("tree_eval", "out partially overlaps an input")
    return out


def fold(out, inputs):
    """out = ((inputs[0] + inputs[1]) + inputs[2]) + ... (the star chain); out may be an input."""
    o = _f64(out, "out", "fold", True)
    if len(inputs) == 0:
        raise KernelRefusal("kernel-bad-argument", "fold: at least one input is needed")
    ptrs, keep = _pointer_array("fold", out, inputs)
    if lib.ak_fold(o, ptrs, len(inputs), out.size):
        _bad_argument("fold", "out partially overlaps an input")
    return out


def first_nonfinite(x):
    """Index of the first NaN/Inf in the float64 array x, or -1."""
    return int(lib.ak_first_nonfinite(_f64(x, "x", "first_nonfinite"), x.size))


# ----------------------------------------------------------------------------- updates


def _update_refusal(fn, st, idx, which, scalars, which_names, arrays, scalar_names):
    if st == lib.AK_ERR_BAD_ARGUMENT:
        _bad_argument(fn, "an output overlaps an input or another output")
    code = "non-finite-input" if st == lib.AK_ERR_NONFINITE_INPUT else "non-finite-output"
    if which == _W_SCALAR:
        name = scalar_names[idx]
        raise KernelRefusal(
            code,
            f"{fn}: scalar {name} = {scalars[idx]!r} is not finite; expected a finite binary64; "
            "state unchanged",
            array=name,
            index=None,
        )
    if which == _W_INTERMEDIATE:
        name = (
            "intermediate (g*g, mhat, vhat, sqrt(vhat)+eps or lr*mhat)"
            if fn.startswith("adam")
            else "intermediate (lr*step)"
        )
        raise KernelRefusal(
            code,
            f"{fn}: {name} at element {idx} is not finite (bias corrections 1-b1t/1-b2t zero? "
            "gradient too large?); state unchanged",
            array="intermediate",
            index=int(idx),
        )
    names = which_names.get(which, ("?", "?"))
    name = names[0] if code == "non-finite-input" else names[1]
    src = arrays.get(name)
    val = "" if src is None else f" = {float(src.reshape(-1)[idx])!r}"
    what = "input" if code == "non-finite-input" else "output"
    raise KernelRefusal(
        code,
        f"{fn}: {what} {name}[{idx}]{val} is not finite; expected every input and output of the update "
        "finite; the state was left unchanged",
        array=name,
        index=int(idx),
    )


def adam_step(p, m, v, g, p_out, m_out, v_out, *, lr, b1, b2, eps, b1t, b2t, allow_inplace=False):
    """One Adam step (order in csrc/alpha_kernel.h) from (p, m, v) into (p_out, m_out, v_out).

    b1t, b2t are the carried bias-correction powers b1**t, b2**t for this step (multiply
    them by b1, b2 once per step; never pow). FiniteOrRefuse: on any non-finite input,
    intermediate or output the call raises non-finite-input / non-finite-output and
    p, m, v are untouched (the outputs may hold garbage). Outputs must be separate
    buffers; allow_inplace=True permits p_out is p etc. and gives up that guarantee."""
    fn = "adam_step"
    n = p.size
    bp, bm, bv, bg = _f64(p, "p", fn), _f64(m, "m", fn), _f64(v, "v", fn), _f64(g, "g", fn)
    op, om, ov = (
        _f64(p_out, "p_out", fn, True),
        _f64(m_out, "m_out", fn, True),
        _f64(v_out, "v_out", fn, True),
    )
    if not (
        m.size == n
        and v.size == n
        and g.size == n
        and p_out.size == n
        and m_out.size == n
        and v_out.size == n
    ):
        _same_size(
            fn, n, (("m", m), ("v", v), ("g", g), ("p_out", p_out), ("m_out", m_out), ("v_out", v_out))
        )
    idx = ffi.new("int64_t *")
    which = ffi.new("int *")
    st = lib.ak_adam(
        bp, bm, bv, bg, op, om, ov, n, lr, b1, b2, eps, b1t, b2t, 1 if allow_inplace else 0, idx, which
    )
    if st:
        arrays = {"p": p, "m": m, "v": v, "g": g, "p_out": p_out, "m_out": m_out, "v_out": v_out}
        scalars = (lr, b1, b2, eps, b1t, b2t)
        _update_refusal(fn, st, idx[0], which[0], scalars, _ADAM_WHICH, arrays, _ADAM_SCALARS)


def adam_step_inplace_checked(p, m, v, g, *, lr, b1, b2, eps, b1t, b2t):
    """The same Adam step in place, keeping the refusal guarantee with a check pass before
    the commit pass (slower than adam_step into separate buffers; see the C comment)."""
    fn = "adam_step_inplace_checked"
    n = p.size
    bp, bm, bv = _f64(p, "p", fn, True), _f64(m, "m", fn, True), _f64(v, "v", fn, True)
    bg = _f64(g, "g", fn)
    if not (m.size == n and v.size == n and g.size == n):
        _same_size(fn, n, (("m", m), ("v", v), ("g", g)))
    idx = ffi.new("int64_t *")
    which = ffi.new("int *")
    st = lib.ak_adam_inplace_checked(bp, bm, bv, bg, n, lr, b1, b2, eps, b1t, b2t, idx, which)
    if st:
        arrays = {"p": p, "m": m, "v": v, "g": g}
        scalars = (lr, b1, b2, eps, b1t, b2t)
        _update_refusal(fn, st, idx[0], which[0], scalars, _ADAM_INPLACE_WHICH, arrays, _ADAM_SCALARS)


def sgd_step(p, buf, g, p_out, buf_out, *, lr, momentum, allow_inplace=False):
    """One SGD step, PyTorch convention without dampening:
    momentum != 0: buf' = momentum*buf + g; p' = p - lr*buf'
    momentum == 0: p' = p - lr*g (buf, buf_out ignored; may be None).
    FiniteOrRefuse and out-of-place exactly as adam_step."""
    fn = "sgd_step"
    n = p.size
    bp, bg = _f64(p, "p", fn), _f64(g, "g", fn)
    op = _f64(p_out, "p_out", fn, True)
    if g.size != n or p_out.size != n:
        _same_size(fn, n, (("g", g), ("p_out", p_out)))
    bb = ob = ffi.NULL
    if buf is not None:
        bb = _f64(buf, "buf", fn)
        if buf.size != n:
            _same_size(fn, n, (("buf", buf),))
    if buf_out is not None:
        ob = _f64(buf_out, "buf_out", fn, True)
        if buf_out.size != n:
            _same_size(fn, n, (("buf_out", buf_out),))
    idx = ffi.new("int64_t *")
    which = ffi.new("int *")
    st = lib.ak_sgd(bp, bb, bg, op, ob, n, lr, momentum, 1 if allow_inplace else 0, idx, which)
    if st:
        if st == lib.AK_ERR_BAD_ARGUMENT and (buf is None or buf_out is None):
            _bad_argument(fn, f"momentum {momentum!r} != 0 needs both buf and buf_out arrays")
        arrays = {"p": p, "buf": buf, "g": g, "p_out": p_out, "buf_out": buf_out}
        _update_refusal(fn, st, idx[0], which[0], (lr, momentum), _SGD_WHICH, arrays, _SGD_SCALARS)


# ----------------------------------------------------------------------------- conversions


def widen_binary32(out, x32):
    """out (float64) = x32 (float32) exactly (the WidenBinary32 conversion site)."""
    fn = "widen_binary32"
    o = _f64(out, "out", fn, True)
    if not isinstance(x32, _ND) or x32.dtype != _F32:
        raise KernelRefusal(
            "dtype-invalid",
            f"{fn}: x32 must be a native float32 array, got {getattr(x32, 'dtype', type(x32))}",
        )
    if not x32.flags.c_contiguous:
        raise KernelRefusal("kernel-bad-argument", f"{fn}: x32 must be C-contiguous")
    if x32.size != out.size:
        _same_size(fn, out.size, (("x32", x32),))
    if lib.ak_widen_binary32(o, ffi.from_buffer(_FARR, x32), out.size):
        _bad_argument(fn, "out overlaps x32")
    return out


def round_binary64(out32, x64):
    """out32 (float32) = x64 rounded to nearest-even (the RoundBinary64 conversion site).
    A non-finite x64 refuses with non-finite-input; a finite value beyond binary32's range
    refuses with non-finite-output."""
    fn = "round_binary64"
    if not isinstance(out32, _ND) or out32.dtype != _F32:
        raise KernelRefusal(
            "dtype-invalid",
            f"{fn}: out32 must be a native float32 array, got {getattr(out32, 'dtype', type(out32))}",
        )
    if not out32.flags.c_contiguous or not out32.flags.writeable:
        raise KernelRefusal("kernel-bad-argument", f"{fn}: out32 must be C-contiguous and writeable")
    x = _f64(x64, "x64", fn)
    if x64.size != out32.size:
        _same_size(fn, out32.size, (("x64", x64),))
    idx = ffi.new("int64_t *")
    st = lib.ak_round_binary64(ffi.from_buffer(_FARR, out32, True), x, x64.size, idx)
    if st:
        if st == lib.AK_ERR_BAD_ARGUMENT:
            _bad_argument(fn, "out32 overlaps x64")
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
