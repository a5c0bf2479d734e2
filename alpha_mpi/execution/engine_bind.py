"""Binding the caller's memory to a run, and shaping its end: plain functions over a compiled
program (engine_build.Compiled), called per run outside the op loop."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..refusals import PlanRefusal, Refusal
from . import frames as fr
from .contributions import check_contributions, refuse_nonfinite

_F64 = np.dtype(np.float64)
_MISSING = object()


class Chunk(NamedTuple):
    """A reduce-scatter result: this rank's coordinates start..stop-1 and their values."""

    start: int
    stop: int
    values: np.ndarray


def check_leaves(c, contributions, rank: int, layout, bound: list) -> dict:
    """slot -> contiguous float64 vector for exactly this rank's slots, or this rank's refusal.
    An array object bound to its slot in an earlier run (`bound`, see bind_bases) with the same
    dtype object is not checked again: it passed these checks then, its size and strides cannot
    have changed while the executor holds it and its buffer, and a dtype set in place is another
    dtype object."""
    n = c.n
    # Fast path: exactly this rank's slots, each a contiguous float64 array of n elements.
    if type(contributions) is dict and len(contributions) == len(c.slot_base):
        same = True
        for slot, b in c.slot_base.items():
            v = contributions.get(slot, _MISSING)
            last = bound[b]
            if last is not None and last[0] is v and v.dtype is last[2]:
                continue
            if not (
                type(v) is np.ndarray
                and v.dtype == _F64
                and v.size == n
                and v.flags.c_contiguous
                and v.flags.aligned
            ):
                break
            if v.ndim != 1:
                same = False
        else:
            return contributions if same else {s: v.reshape(-1) for s, v in contributions.items()}
    return check_contributions(contributions, c.rp.slots, rank, n, layout.key())


def zero_leaves(c, zeros: np.ndarray) -> dict:
    """Zeros in place of every leaf, each of its own length (`RankProgram.inputs`)."""
    counts = c.rp.inputs
    return {s: zeros[: counts.get(s, c.n)] for s in c.rp.slots}


def zeros_for(c) -> np.ndarray:
    """One zero vector long enough for every leaf of this rank."""
    return np.zeros(max([c.n, *c.rp.inputs.values()]))


def result_len(c) -> int:
    r = c.rp.result
    return 0 if r is None else r.count


def bind_out(c, out, mode: str, leaves: dict, checked):
    """(the array the `out` buffer is bound to, the caller's array the C round copies the
    result into at the end of a clean run, or None). The caller's `out` is checked here unless
    it is `checked` (the object that passed last time, same dtype object). Small results, and
    results whose `out` aliases a contribution, are computed in the internal buffer and
    delivered (so a refused run leaves `out` as it was; a realization may still send a
    contribution while it writes the result); larger ones land in `out` itself."""
    internal = c.internal_out
    if internal is None and c.rp.result is None:
        return None, None
    if out is None:
        return (np.empty(c.n) if c.is_receiver and not c.small else internal), None
    if checked is None or checked[0] is not out or out.dtype is not checked[1]:
        _check_out(c, out, mode)
    if mode == "reduce-scatter" or not c.is_receiver:
        return internal, None
    if c.small or aliased(out, leaves):
        return internal, out
    return out.reshape(-1), None


def _check_out(c, out, mode: str) -> None:
    if (
        not isinstance(out, np.ndarray)
        or out.dtype != _F64
        or not out.flags.c_contiguous
        or not out.flags.writeable
        or not out.flags.aligned
    ):
        raise Refusal(
            "out-invalid",
            f"out must be a writeable C-contiguous aligned float64 array, got "
            f"{type(out).__name__ if not isinstance(out, np.ndarray) else out.dtype} "
            f"{'' if not isinstance(out, np.ndarray) else ('C-contiguous' if out.flags.c_contiguous else 'not C-contiguous')}"
            f"{'' if not isinstance(out, np.ndarray) or out.flags.writeable else ' read-only'}"
            f"{'' if not isinstance(out, np.ndarray) or out.flags.aligned else ' misaligned'}",
        )
    n = c.n
    if mode == "reduce-scatter":
        if out.size not in (n, result_len(c)):
            raise Refusal(
                "out-invalid",
                f"out has {out.size} elements; give the chunk's {result_len(c)} or the whole payload's {n}",
            )
    elif out.size != n:
        raise Refusal("out-invalid", f"out has {out.size} elements, the result has {n}")


def aliased(out, leaves) -> bool:
    """`out` shares memory with a contribution: run into the internal buffer, copy at the end
    (a realization may still send a contribution while it writes the result)."""
    return out is not None and any(np.shares_memory(out, v) for v in leaves.values())


def bind_bases(c, bound: list, leaves: dict, outarr, deliver) -> None:
    """Write the base pointers of the caller's arrays into the C executor's buffer table for
    this run (and the delivery target, or NULL), making a pointer only when another array
    object comes (the learner and most loops pass the same buffers every step). `bound[b]`:
    (array, pointer, its dtype object) last bound to buffer number b (the last entry: the
    delivery target); holding the array and its buffer keeps its memory, size and strides."""
    ffi, bases, numbers = c.native.ffi, c.bases, c.slot_base
    for s, a in leaves.items():
        b = numbers[s]
        last = bound[b]
        if last is None or last[0] is not a:
            ptr = ffi.from_buffer("double[]", a)
            bound[b] = (a, ptr, a.dtype)
            bases[b] = ptr
    if outarr is not None:
        last = bound[0]
        if last is None or last[0] is not outarr:
            ptr = ffi.from_buffer("double[]", outarr, True)
            bound[0] = (outarr, ptr, outarr.dtype)
            bases[0] = ptr
    last = bound[-1]
    if deliver is None:
        if last is not None:
            bound[-1] = None
            c.ex.deliver_to = ffi.NULL
    elif last is None or last[0] is not deliver:
        bound[-1] = (deliver, ffi.from_buffer("double[]", deliver, True), deliver.dtype)
        c.ex.deliver_to = bound[-1][1]


def finish(c, program, rank: int, step: int, st, local, leaves, outarr, out):
    """Raise what the run ended with (this rank's refusal, a bad frame, a peer's, non-finite
    values), else the result as the caller asked for it."""
    if local is not None:
        raise local
    if st.bad is not None:
        raise st.bad
    flags = st.flags
    if flags & fr.FLAG_REFUSED:
        peer, code = st.who
        raise Refusal(
            "peer-refused",
            f"rank {peer} refused step {step} [{code}] before its arithmetic; "
            "every rank completed the round and nothing was applied",
            peer=peer,
            peer_code=code,
        )
    rp = c.rp
    if flags & fr.FLAG_NONFINITE and (rp.result is not None or rp.checks):
        refuse_nonfinite(leaves, step)
    res = rp.result
    if res is None:
        return None
    if program.mode == "reduce-scatter":
        chunk = (
            c.bufs[res.buf][res.offset : res.offset + res.count]
            if res.buf != "out"
            else outarr[res.offset : res.offset + res.count]
        )
        lo, hi = program.chunks[rank]
        if out is not None:
            target = out.reshape(-1)[lo:hi] if out.size == c.n and out.size != hi - lo else out.reshape(-1)
            np.copyto(target, chunk)
            chunk = target
        return chunk
    if res.buf != "out":  # pragma: no cover - allreduce results always land in `out`
        raise PlanRefusal("internal-error", "an allreduce result outside `out`")
    if out is None:
        return outarr.copy() if outarr is c.internal_out else outarr
    if outarr is c.internal_out and not c.ex.delivered:  # (the payload check: after its flag round)
        np.copyto(out.reshape(-1), outarr)
    return out


__all__ = [
    "Chunk",
    "check_leaves",
    "zero_leaves",
    "zeros_for",
    "bind_out",
    "aliased",
    "bind_bases",
    "finish",
]
