"""Binding the caller's memory to a run, and shaping its end: plain functions over a compiled
program (engine_build.Compiled), called per run outside the op loop."""

from __future__ import annotations

import weakref
from collections import namedtuple

import numpy as np

from ..kernel import vectors
from ..planning.flag_rounds import delivers_to_one
from ..planning.program import Mode
from ..refusals import PlanRefusal, Refusal
from . import frames as fr
from .contributions import check_contributions, refuse_nonfinite

_F64 = np.dtype(np.float64)


class Chunk(namedtuple("Chunk", "start stop values")):
    """A reduce-scatter result: this rank's coordinates start..stop-1 (ints) and their values
    (a float64 ndarray). A collections.namedtuple: see convenience.CacheKey for why."""

    __slots__ = ()


def check_leaves(c, contributions, rank: int, layout) -> dict:
    """slot -> C-contiguous aligned float64 vector for exactly this rank's slots, or this
    rank's refusal (contributions.py: a non-contiguous or misaligned payload is copied)."""
    return check_contributions(contributions, c.rp.slots, rank, c.n, layout.key())


class Bound:
    """The caller's memory the C executor's buffer table points at (buffer numbers below
    `first_static`, and the delivery target). `held[b]`: (the array bound to buffer b, the
    pointer made from its buffer or None where C wrote it (kernel/vectors.py), a weak
    reference to it). The strong reference keeps the memory the records point at alive until a
    later call binds another array there; the weak reference pins it: NumPy refuses to resize
    an array that has one (`resize`, even with refcheck=False, would move its data), so a bound
    array's pointer cannot change while it is bound, and a call that passes the very array
    again needs no new pointer. Any other array is bound anew (pointer, pin). What can change
    in place under the same object (its dtype, shape, strides) is checked on every call
    (prepared.py). `held[b]` None: nothing held there, and the next run binds buffer b anew (the
    arrays' blocks and tiles are bound for one run: `blocks`, `tile`). `addr[b]`,
    `deliver_addr`: where the table entry of buffer b and the delivery target live, for
    vectors.bind."""

    __slots__ = ("c", "held", "deliver", "from_buffer", "_null", "addr", "deliver_addr")

    def __init__(self, c) -> None:
        self.c = c
        n = len(c.bases)
        self.held: list = [None] * n
        self.deliver = None
        ffi = c.native.ffi
        self.from_buffer = ffi.from_buffer
        self._null = ffi.NULL
        self.addr = [vectors.address(c.bases, b) for b in range(c.ex.program.first_static)]
        self.deliver_addr = int(ffi.cast("uintptr_t", ffi.addressof(c.ex.run, "deliver_to")))

    def adopt(self, b: int, a) -> None:
        """Hold and pin `a`, whose pointer vectors.bind wrote to buffer b's entry."""
        self.held[b] = (a, None, weakref.ref(a))

    def adopt_delivery(self, out) -> None:
        """Hold and pin `out`, which vectors.bind made the delivery target."""
        self.deliver = (out, None, weakref.ref(out))

    def blocks(self, bx: int, by: int | None, x, y, n: int) -> bool:
        """Bind 1-D blocks x to buffer bx (and y to by: a dot; None: a sum) for ONE run, when each
        is a 1-D, C-contiguous, aligned float64 ndarray of n: True, once one C call has checked
        them and written their pointers (vectors.bind2, on every call: what can change in place
        under the same object is seen). Nothing is held after the call (`held` there cleared:
        the run is the caller's next step, and the caller holds its arrays until it returns).
        Holding the last call's blocks kept a numpy-style solver's arrays alive one iteration
        longer, and with blocks above glibc's mmap threshold that moved its heap's top: the
        allocator gave pages back and faulted them in again every iteration (a 1-D CG of 65,536
        unknowns per rank ran 1.3x its MPI_Allreduce twin, 1.02x without). False, with nothing
        bound, for anything else."""
        held = self.held
        if y is None:
            if vectors.bind(id(x), n, 0, self.addr[bx]):
                return False
            held[bx] = None
            return True
        if vectors.bind2(id(x), id(y), n, self.addr[bx], self.addr[by]):
            return False
        held[bx] = held[by] = None
        return True

    def tile(self, bx: int, by: int | None, x, y, nd: int, shape, strides) -> bool:
        """Bind N-d tiles x to buffer bx (and y to by: a dot; None: a sum) for ONE run, as
        `blocks` does, when each is an aligned float64 ndarray of nd dimensions `shape` and byte
        strides `strides` (cdata: x's nd words, then y's): one C call checks them and writes
        their first elements' addresses (vectors.bind_tile). False, with nothing bound, for
        anything else."""
        addr = self.addr
        if vectors.bind_tile(
            id(x), 0 if y is None else id(y), nd, shape, strides, addr[bx], 0 if by is None else addr[by]
        ):
            return False
        held = self.held
        held[bx] = None
        if by is not None:
            held[by] = None
        return True

    def pin(self, b: int, a, writable: bool = False):
        """Bind array `a` to buffer b (pointer, strong and weak reference); the pointer."""
        ptr = self.from_buffer("double[]", a, writable)
        self.held[b] = (a, ptr, weakref.ref(a))
        self.c.bases[b] = ptr
        return ptr

    def bind(self, leaves: dict, outarr, deliver) -> None:
        """Point the buffer table at this run's leaves, its result array `outarr` and the
        delivery target (or NULL), each anew unless it is the array bound there now."""
        c, held = self.c, self.held
        numbers = c.slot_base
        for s, a in leaves.items():
            b = numbers[s]
            e = held[b]
            if e is None or e[0] is not a:
                self.pin(b, a)
        if outarr is not None:
            e = held[0]
            if e is None or e[0] is not outarr:
                self.pin(0, outarr, True)
        if deliver is None:
            if self.deliver is not None:
                self.no_delivery()
        else:
            self.deliver_to(deliver)

    def deliver_to(self, out) -> None:
        """The C round copies a clean run's result into `out` (bound anew unless it is the
        array bound there now)."""
        d = self.deliver
        if d is None or d[0] is not out:
            ptr = self.from_buffer("double[]", out, True)
            self.deliver = (out, ptr, weakref.ref(out))
            self.c.ex.run.deliver_to = ptr

    def no_delivery(self) -> None:
        self.deliver = None
        self.c.ex.run.deliver_to = self._null

    def clear(self) -> None:
        """Drop every array (the executor was freed): they may be resized again. The table's
        addresses go too (their memory is freed): nothing is written there any more."""
        self.held = []
        self.deliver = None
        self.addr = []
        self.deliver_addr = None


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


def internal_result(c):
    """The buffer a run whose `out` was refused computes its result into."""
    if c.internal_out is not None:
        return c.internal_out
    return np.empty(c.n) if c.rp.result is not None else None


def bind_out(c, out, mode: Mode, leaves: dict, checked: bool):
    """(the array the `out` buffer is bound to, the caller's array the C round copies the
    result into at the end of a clean run, or None). The caller's `out` is checked here unless
    it is `checked` (the object that passed last time, same dtype object). Small results, and
    results whose `out` aliases a contribution, are computed in the internal buffer and
    delivered (so a refused run leaves `out` as it was; a realization may still send a
    contribution while it writes the result); larger ones land in `out` itself. `checked`:
    the caller found `out` a 1-D, C-contiguous, aligned, writeable float64 array of n."""
    internal = c.internal_out
    if internal is None and c.rp.result is None:
        return None, None
    if out is None:
        return (np.empty(c.n) if c.is_receiver and not c.small else internal), None
    if not checked:
        _check_out(c, out, mode)
    if mode.scatters or not c.is_receiver:
        return internal, None
    if c.small or aliased(out, leaves):
        return internal, out
    return out.reshape(-1), None


def _check_out(c, out, mode: Mode) -> None:
    if (
        not isinstance(out, np.ndarray)
        or out.dtype != _F64
        or not out.flags.c_contiguous
        or not out.flags.writeable
        or not out.flags.aligned
    ):
        raise Refusal(
            "out-invalid",
            f"out must be a writeable, aligned, C-contiguous float64 array, got "
            f"{type(out).__name__ if not isinstance(out, np.ndarray) else out.dtype} "
            f"{'' if not isinstance(out, np.ndarray) else ('C-contiguous' if out.flags.c_contiguous else 'not C-contiguous')}"
            f"{'' if not isinstance(out, np.ndarray) or out.flags.writeable else ' read-only'}"
            f"{'' if not isinstance(out, np.ndarray) or out.flags.aligned else ' misaligned'}",
        )
    n = c.n
    if mode.scatters:
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
    # a rank off a delivery's path learns of a non-finite sum from the flag rounds alone
    if flags & fr.FLAG_NONFINITE and (rp.result is not None or rp.checks or delivers_to_one(program)):
        refuse_nonfinite(leaves, step)
    res = rp.result
    if res is None:
        return None
    if program.mode.scatters:
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
    if outarr is c.internal_out and not c.ex.run.delivered:  # (the payload check: after its flag round)
        np.copyto(out.reshape(-1), outarr)
    return out


__all__ = [
    "Chunk",
    "check_leaves",
    "Bound",
    "internal_result",
    "zero_leaves",
    "zeros_for",
    "bind_out",
    "aliased",
    "finish",
]
