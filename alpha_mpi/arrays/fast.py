"""The steady-state call of sum, dot and norm2 on 1-D blocks: one C call (csrc/native.h
an_array_run) where the arguments are those of an earlier call that passed every check.

A solver calls the same few reductions again and again: `dot(comm, r, r, off, n)` and
`dot(comm, p, Ap, off, n)` with the very same arrays, offset and length every iteration. The
ordinary path (api.py) checks the arguments, finds the channel and the exchange, evaluates the
summary, writes the row, runs the engine and checks the table and the root, each a Python step
(about 5 us in all around a 2 us round at p = 2). When such a call has gone through every
check and ended in the root twice, with the same arrays alive in between, a `Call` remembers
what the checks decided, as the C record of
an_array_run: the arrays' pointers, offset, length, n, the exchange's buffers and the table that
passed. A later call with the same arguments is then one C call: the summary straight into the
round-0 frame, the row, the exchange (an_run), the comparison of every rank's rows with the
table that passed, and the root's value. Same kernel, same frames, same order: the same bits.

What a record is keyed by, and why nothing can change under it silently:
- the communicator object, the arrays objects (the record holds them: the cffi buffer it
  keeps blocks `resize`, and the data of an ndarray cannot be replaced), offset and n (ints);
- what can still change in place is checked on every call: each array's dtype object
  (`a.dtype = ...` reinterprets in place), shape (`a.shape = ...`) and strides;
- the channel: a failed run or `reset` marks it broken, the communicator's Free deletes its
  attribute (api.py's delete callback marks it too): a record of a broken channel is never
  used, and the ordinary path then says why;
- what depends on other ranks is never cached: their rows travel on every call, and C falls
  back to Python's checks whenever they differ from the rows that passed.

Whatever is not the clean steady state goes back to Python at the point it happened (see
an_array_run's results): a NaN/Inf in the block (nothing sent: the ordinary path from the
start), a run that must return to Python (a signal slice, the send hook of tests, a bad frame, a
timeout: the engine goes on as after an_run), flags, a new table, a non-finite root (the
ordinary checks after the run). So every refusal is the ordinary path's, on every rank.

At most RECORDS calls are remembered per process (a Krylov loop has two to five), and only
blocks of at most MAX_ELEMENTS elements (beyond, the summary costs far more than the Python
around it): the records hold their arrays alive, so this bounds what they can keep. A call is
remembered the second time it comes with its arrays alive in between (weak references between
the two), so arrays made anew for every call are never kept, nor is a record made for them.
"""

from __future__ import annotations

import weakref

import numpy as np

__all__ = ["Call", "RECORDS", "MAX_ELEMENTS", "CHECK", "LOCAL", "lookup", "remember", "forget"]

RECORDS = 6
MAX_ELEMENTS = 1 << 17
CHECK, LOCAL = 16, 17  # csrc/native.h AN_ARRAY_CHECK, AN_ARRAY_LOCAL (checked when a record is made)

_F64 = np.dtype(np.float64)
_STRIDES = (8,)  # a contiguous float64 block

#: the remembered calls, oldest first (a list: a loop's few calls are found by identity at once)
_CALLS: list = []
#: calls that passed every check once, oldest first: (op, comm, offset, n, weak references to
#: x and y); the second time, with the same arrays still alive, they are remembered
_SEEN: list = []


class Call:
    """One remembered call: (comm, x, y, offset, n) on channel `ch`, exchange `ex` (rank order,
    one value), and the C record of an_array_run that runs it."""

    __slots__ = (
        "comm",
        "ch",
        "ex",
        "engine",
        "op",
        "x",
        "y",
        "offset",
        "n",
        "shape",
        "rec",
        "run",
        "values",
        "_held",
    )

    def __init__(self, ch, ex, op: str, x: np.ndarray, y: np.ndarray | None, offset: int, n: int):
        self.comm, self.ch, self.ex, self.engine, self.op = ch.user, ch, ex, ex.engine, op
        self.x, self.y, self.offset, self.n, self.shape = x, y, offset, n, x.shape
        nat = ex.engine.compiled.native
        if (nat.lib.AN_ARRAY_CHECK, nat.lib.AN_ARRAY_LOCAL) != (CHECK, LOCAL):  # pragma: no cover - stale
            raise ImportError("alpha_mpi's C round is older than alpha_mpi/arrays/fast.py (delete its cache)")
        ffi = nat.ffi
        rec = ffi.new("an_array *")
        hx = ffi.from_buffer("double[]", x)
        xs = ffi.new("double *[]", [hx])
        ys = ffi.NULL
        if y is not None:
            ys = xs if y is x else ffi.new("double *[]", [ffi.from_buffer("double[]", y)])

        def words(a):
            return ffi.from_buffer("int64_t[]", a, True)

        rec.e = ex.engine.compiled.ex
        rec.xs, rec.ys, rec.k = xs, ys, 1
        rec.offset, rec.length, rec.n, rec.capacity = offset, x.shape[0], n, ex.capacity
        held = [xs, ys, words(ex.local_words), words(ex.head), words(ex.table), words(ex.length)]
        held += [words(ex.valid_words), words(ex.final), ffi.new("double[]", 1)]
        rec.local, rec.head, rec.row, rec.n_word = held[2], held[3], held[4], held[5]
        rec.table, rec.table_words = held[4], ex.table.size
        rec.valid, rec.final, rec.values = held[6], held[7], held[8]
        self.rec, self.run, self.values = rec, nat.lib.an_array_run, held[8]
        self._held = held  # the cdata the record points into must live as long as it


def lookup(comm, op: str, x, y, offset: int, n: int) -> Call | None:
    """The remembered call these arguments make (offset and n: ints), if they still are what
    its checks decided and its channel is usable; else None (the ordinary path)."""
    for c in _CALLS:
        if c.x is x and c.y is y and c.op == op and c.comm is comm and c.offset == offset and c.n == n:
            if (
                x.dtype is _F64
                and x.shape == c.shape
                and x.strides == _STRIDES
                and (
                    y is None or y is x or (y.dtype is _F64 and y.shape == c.shape and y.strides == _STRIDES)
                )
                and c.ch.broken is None
                and not c.engine._busy
            ):
                return c
            return None
    return None


def remember(ch, ex, op: str, x, y, offset: int, n: int) -> None:
    """Remember a call that just passed every check with these very arguments (api.py), the
    second time they come while the arrays stay alive in between. A loop that makes new
    arrays every iteration (`dot(comm, b - A @ x, ...)`) is never remembered: making a record
    costs more than the ordinary path, and would keep the temporaries alive."""
    if x.shape[0] > MAX_ELEMENTS or ex.valid_order is not None or ex.k != 1:
        return
    comm = ch.user
    for i, c in enumerate(_CALLS):
        if c.x is x and c.y is y and c.op == op and c.comm is comm and c.offset == offset and c.n == n:
            if c.ch is ch and c.ex is ex:
                return  # known (this call took the ordinary path for a reason of its own)
            del _CALLS[i]  # of an earlier channel (before a reset)
            break
    for i, (sop, scomm, soffset, sn, wx, wy) in enumerate(_SEEN):
        if sop == op and scomm is comm and soffset == offset and sn == n and wx() is x:
            if (y is None and wy is None) or (wy is not None and wy() is y):
                del _SEEN[i]
                break
    else:  # the first time (a dead weak reference never matches: a new array at an old address)
        if len(_SEEN) >= RECORDS:
            del _SEEN[0]
        _SEEN.append((op, comm, offset, n, weakref.ref(x), None if y is None else weakref.ref(y)))
        return
    if len(_CALLS) >= RECORDS:
        del _CALLS[0]
    _CALLS.append(Call(ch, ex, op, x, y, offset, n))


def forget(ch) -> None:
    """Drop the records of channel `ch` (its reset, its communicator's Free)."""
    _CALLS[:] = [c for c in _CALLS if c.ch is not ch]
    _SEEN[:] = [s for s in _SEEN if s[1] is not ch.user]
