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


def check_leaves(c, contributions, rank: int, layout) -> dict:
    """slot -> contiguous float64 vector for exactly this rank's slots, or this rank's refusal."""
    slots, n = c.rp.slots, c.n
    # Fast path: exactly this rank's slots, each a contiguous float64 array of n elements.
    if type(contributions) is dict and len(contributions) == len(slots):
        out = {}
        for slot in slots:
            v = contributions.get(slot, _MISSING)
            if type(v) is np.ndarray and v.dtype == _F64 and v.size == n and v.flags.c_contiguous:
                out[slot] = v if v.ndim == 1 else v.reshape(-1)
            else:
                break
        else:
            return out
    return check_contributions(contributions, slots, rank, n, layout.key())


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


def bind_out(c, out, mode: str):
    """The array the `out` buffer is bound to: the caller's when given (checked), else new."""
    if c.internal_out is None and c.rp.result is None:
        return None
    n = c.n
    if out is None:
        return np.empty(n) if c.is_receiver and not c.small else c.internal_out
    if (
        not isinstance(out, np.ndarray)
        or out.dtype != _F64
        or not out.flags.c_contiguous
        or not out.flags.writeable
    ):
        raise Refusal(
            "out-invalid",
            f"out must be a writeable C-contiguous float64 array, got "
            f"{type(out).__name__ if not isinstance(out, np.ndarray) else out.dtype} "
            f"{'' if not isinstance(out, np.ndarray) else ('C-contiguous' if out.flags.c_contiguous else 'not C-contiguous')}"
            f"{'' if not isinstance(out, np.ndarray) or out.flags.writeable else ' read-only'}",
        )
    if mode == "allreduce" and out.size != n:
        raise Refusal("out-invalid", f"out has {out.size} elements, the result has {n}")
    if mode == "reduce-scatter":
        if out.size not in (n, result_len(c)):
            raise Refusal(
                "out-invalid",
                f"out has {out.size} elements; give the chunk's {result_len(c)} or the whole payload's {n}",
            )
        return c.internal_out
    return out.reshape(-1) if c.is_receiver else c.internal_out


def aliased(out, leaves) -> bool:
    """`out` shares memory with a contribution: run into the internal buffer, copy at the end
    (a realization may still send a contribution while it writes the result)."""
    return out is not None and any(np.shares_memory(out, v) for v in leaves.values())


def bind_pointers(st, names: dict, bound: dict, darr, leaves: dict, outarr) -> None:
    """Pointers into the caller's arrays for this run, rebuilt only when another array object
    comes (the learner and most loops pass the same buffers every step)."""
    ffi, bases, arrays = st.ffi, st.bases, st.arrays
    for s, a in leaves.items():
        name = names[s]
        if bound.get(name) is not a:
            bound[name] = a
            bases[name] = ffi.from_buffer(darr, a)
        arrays[name] = a
    if outarr is not None:
        if bound.get("out") is not outarr:
            bound["out"] = outarr
            bases["out"] = ffi.from_buffer(darr, outarr, True)
        arrays["out"] = outarr


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
        raise PlanRefusal("plan-simulation-failed", "an allreduce result outside `out`")
    if out is None:
        return outarr.copy() if outarr is c.internal_out else outarr
    if outarr is c.internal_out:  # small, or `out` aliased a contribution
        np.copyto(out.reshape(-1), outarr)
    return out


__all__ = [
    "Chunk",
    "check_leaves",
    "zero_leaves",
    "zeros_for",
    "bind_out",
    "aliased",
    "bind_pointers",
    "finish",
]
