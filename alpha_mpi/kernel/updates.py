"""The optimizer updates of the C kernel (layer 3): Adam, AdamW and SGD steps, FiniteOrRefuse.

Apart from api.py because an update is a different kind of call from a combine: it reads
and writes the whole optimizer state, takes hyperparameter scalars, and on a non-finite value
explains which input, scalar, intermediate or output it was (`_update_refusal`). Evaluation
orders are in csrc/kernel/alpha_kernel.h; `alpha_mpi.kernel` re-exports the public names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NoReturn

from ..refusals import KernelRefusal
from .buffers import bad_argument, f64_buffer, same_size
from .compiled import ffi, lib

if TYPE_CHECKING:
    import numpy as np

__all__ = ["adam_step", "adam_step_inplace_checked", "adamw_step", "sgd_step"]

_ADAM_SCALARS = ("lr", "b1", "b2", "eps", "b1t", "b2t")
_ADAMW_SCALARS = (*_ADAM_SCALARS, "wd")  # AK_SCALAR_WD = 6
_SGD_SCALARS = ("lr", "momentum")
# AK_W_* -> (input name, output name)
_ADAM_WHICH = {0: ("p", "p_out"), 1: ("m", "m_out"), 2: ("v", "v_out"), 3: ("g", "g")}
_SGD_WHICH = {0: ("p", "p_out"), 3: ("g", "g"), 4: ("buf", "buf_out")}
_ADAM_INPLACE_WHICH = {0: ("p", "p"), 1: ("m", "m"), 2: ("v", "v"), 3: ("g", "g")}
_W_SCALAR = 5
_W_INTERMEDIATE = 6
# what AK_W_INTERMEDIATE names, per update (csrc/kernel/alpha_kernel.h FiniteOrRefuse)
_ADAM_INTERMEDIATES = "intermediate (g*g, mhat, vhat, sqrt(vhat)+eps or lr*mhat)"
_INTERMEDIATES = {
    "adam_step": _ADAM_INTERMEDIATES,
    "adam_step_inplace_checked": _ADAM_INTERMEDIATES,
    "adamw_step": "intermediate (p*(1-lr*wd), g*g, mhat, vhat, sqrt(vhat)+eps or lr*mhat)",
    "sgd_step": "intermediate (lr*step)",
}


def _update_refusal(
    fn: str,
    st: int,
    idx: int,
    which: int,
    scalars: tuple[float, ...],
    which_names: dict[int, tuple[str, str]],
    arrays: Mapping[str, np.ndarray | None],
    scalar_names: tuple[str, ...],
) -> NoReturn:
    if st == lib.AK_ERR_BAD_ARGUMENT:
        bad_argument(fn, "an output overlaps an input or another output")
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
        name = _INTERMEDIATES[fn]
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


def adam_step(
    p: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    p_out: np.ndarray,
    m_out: np.ndarray,
    v_out: np.ndarray,
    *,
    lr: float,
    b1: float,
    b2: float,
    eps: float,
    b1t: float,
    b2t: float,
    allow_inplace: bool = False,
) -> None:
    """One Adam step (order in csrc/kernel/alpha_kernel.h) from (p, m, v) into (p_out, m_out, v_out).

    b1t, b2t are the carried bias-correction powers b1**t, b2**t for this step (multiply
    them by b1, b2 once per step; never pow). FiniteOrRefuse: on any non-finite input,
    intermediate or output the call raises non-finite-input / non-finite-output and
    p, m, v are untouched (the outputs may hold garbage). Outputs must be separate
    buffers; allow_inplace=True permits p_out is p etc. and gives up that guarantee."""
    fn = "adam_step"
    n = p.size
    bp, bm, bv, bg = (
        f64_buffer(p, "p", fn),
        f64_buffer(m, "m", fn),
        f64_buffer(v, "v", fn),
        f64_buffer(g, "g", fn),
    )
    op, om, ov = (
        f64_buffer(p_out, "p_out", fn, True),
        f64_buffer(m_out, "m_out", fn, True),
        f64_buffer(v_out, "v_out", fn, True),
    )
    if not (
        m.size == n
        and v.size == n
        and g.size == n
        and p_out.size == n
        and m_out.size == n
        and v_out.size == n
    ):
        same_size(fn, n, (("m", m), ("v", v), ("g", g), ("p_out", p_out), ("m_out", m_out), ("v_out", v_out)))
    idx = ffi.new("int64_t *")
    which = ffi.new("int *")
    st = lib.ak_adam(
        bp, bm, bv, bg, op, om, ov, n, lr, b1, b2, eps, b1t, b2t, 1 if allow_inplace else 0, idx, which
    )
    if st:
        arrays = {"p": p, "m": m, "v": v, "g": g, "p_out": p_out, "m_out": m_out, "v_out": v_out}
        scalars = (lr, b1, b2, eps, b1t, b2t)
        _update_refusal(fn, st, idx[0], which[0], scalars, _ADAM_WHICH, arrays, _ADAM_SCALARS)


def adamw_step(
    p: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    p_out: np.ndarray,
    m_out: np.ndarray,
    v_out: np.ndarray,
    *,
    lr: float,
    b1: float,
    b2: float,
    eps: float,
    b1t: float,
    b2t: float,
    wd: float,
    allow_inplace: bool = False,
) -> None:
    """One AdamW step (decoupled weight decay `wd`, torch.optim.AdamW's order, csrc/kernel/
    alpha_kernel.h ADAMW EVALUATION ORDER): p is multiplied by (1 - lr*wd) first, then Adam's
    step runs on it; m and v never see wd. At wd = 0 the bits are adam_step's. Arguments,
    FiniteOrRefuse and the out-of-place rule as adam_step (a non-finite wd is refused as the
    scalar `wd`)."""
    fn = "adamw_step"
    n = p.size
    bufs = [f64_buffer(a, name, fn) for a, name in ((p, "p"), (m, "m"), (v, "v"), (g, "g"))]
    outs = [
        f64_buffer(a, name, fn, True) for a, name in ((p_out, "p_out"), (m_out, "m_out"), (v_out, "v_out"))
    ]
    others = (("m", m), ("v", v), ("g", g), ("p_out", p_out), ("m_out", m_out), ("v_out", v_out))
    if any(a.size != n for _, a in others):
        same_size(fn, n, others)
    idx = ffi.new("int64_t *")
    which = ffi.new("int *")
    st = lib.ak_adamw(*bufs, *outs, n, lr, b1, b2, eps, b1t, b2t, wd, 1 if allow_inplace else 0, idx, which)
    if st:
        arrays = {"p": p, "m": m, "v": v, "g": g, "p_out": p_out, "m_out": m_out, "v_out": v_out}
        scalars = (lr, b1, b2, eps, b1t, b2t, wd)
        _update_refusal(fn, st, idx[0], which[0], scalars, _ADAM_WHICH, arrays, _ADAMW_SCALARS)


def adam_step_inplace_checked(
    p: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    *,
    lr: float,
    b1: float,
    b2: float,
    eps: float,
    b1t: float,
    b2t: float,
) -> None:
    """The same Adam step in place, keeping the refusal guarantee with a check pass before
    the commit pass (slower than adam_step into separate buffers; see the C comment)."""
    fn = "adam_step_inplace_checked"
    n = p.size
    bp, bm, bv = f64_buffer(p, "p", fn, True), f64_buffer(m, "m", fn, True), f64_buffer(v, "v", fn, True)
    bg = f64_buffer(g, "g", fn)
    if not (m.size == n and v.size == n and g.size == n):
        same_size(fn, n, (("m", m), ("v", v), ("g", g)))
    idx = ffi.new("int64_t *")
    which = ffi.new("int *")
    st = lib.ak_adam_inplace_checked(bp, bm, bv, bg, n, lr, b1, b2, eps, b1t, b2t, idx, which)
    if st:
        arrays = {"p": p, "m": m, "v": v, "g": g}
        scalars = (lr, b1, b2, eps, b1t, b2t)
        _update_refusal(fn, st, idx[0], which[0], scalars, _ADAM_INPLACE_WHICH, arrays, _ADAM_SCALARS)


def sgd_step(
    p: np.ndarray,
    buf: np.ndarray | None,
    g: np.ndarray,
    p_out: np.ndarray,
    buf_out: np.ndarray | None,
    *,
    lr: float,
    momentum: float,
    allow_inplace: bool = False,
) -> None:
    """One SGD step, PyTorch convention without dampening:
    momentum != 0: buf' = momentum*buf + g; p' = p - lr*buf'
    momentum == 0: p' = p - lr*g (buf, buf_out ignored; may be None).
    FiniteOrRefuse and out-of-place exactly as adam_step."""
    fn = "sgd_step"
    n = p.size
    bp, bg = f64_buffer(p, "p", fn), f64_buffer(g, "g", fn)
    op = f64_buffer(p_out, "p_out", fn, True)
    if g.size != n or p_out.size != n:
        same_size(fn, n, (("g", g), ("p_out", p_out)))
    bb = ob = ffi.NULL
    if buf is not None:
        bb = f64_buffer(buf, "buf", fn)
        if buf.size != n:
            same_size(fn, n, (("buf", buf),))
    if buf_out is not None:
        ob = f64_buffer(buf_out, "buf_out", fn, True)
        if buf_out.size != n:
            same_size(fn, n, (("buf_out", buf_out),))
    idx = ffi.new("int64_t *")
    which = ffi.new("int *")
    st = lib.ak_sgd(bp, bb, bg, op, ob, n, lr, momentum, 1 if allow_inplace else 0, idx, which)
    if st:
        if st == lib.AK_ERR_BAD_ARGUMENT and (buf is None or buf_out is None):
            bad_argument(fn, f"momentum {momentum!r} != 0 needs both buf and buf_out arrays")
        arrays = {"p": p, "buf": buf, "g": g, "p_out": p_out, "buf_out": buf_out}
        _update_refusal(fn, st, idx[0], which[0], (lr, momentum), _SGD_WHICH, arrays, _SGD_SCALARS)
