"""The steady-state call of sum, dot, norm2 and dots on 1-D blocks: one C call (csrc/round/native.h
an_array_run) where the arguments are those of an earlier call that passed every check.

A solver calls the same few reductions again and again: `dot(comm, r, r, off, n)` and
`dot(comm, p, Ap, off, n)` with the very same arrays, offset and length every iteration. The
ordinary path (api.py) checks the arguments, finds the channel and the exchange, evaluates the
summary, writes the row, runs the engine and checks the table and the root, each a Python step
(about 5 us in all around a 2 us round at p = 2). When such a call has gone through every
check and ended in the root twice, with the same arrays alive in between, a `Call` remembers
what the checks decided, as the C record of an_array_run: the arrays' pointers, offset, length,
n, the exchange's buffers and the table that passed. A later call with the same arguments is
then one C call: the summary straight into the round-0 frame, the row, the exchange (an_run),
the comparison of every rank's rows with the table that passed, and the root's values. Same
kernel, same frames, same order: the same bits.

What a record is keyed by, and why nothing can change under it silently:
- the communicator object, the arrays objects (the record holds them: the cffi buffer it
  keeps blocks `resize`, and the data of an ndarray cannot be replaced), offset and n (ints);
- what can still change in place is checked on every call: each array's dtype object
  (`a.dtype = ...` reinterprets in place), shape (`a.shape = ...`) and strides;
- the channel: a failed run or `reset` marks it broken (a record of a broken channel is never
  used, and the ordinary path then says why); `reset` and the communicator's Free delete its
  attribute, and api.py's delete callback forgets its records;
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

__all__ = [
    "Call",
    "RECORDS",
    "MAX_ELEMENTS",
    "MAX_PAIRS",
    "CHECK",
    "LOCAL",
    "lookup",
    "lookup_pairs",
    "remember",
    "forget",
]

RECORDS = 6
MAX_ELEMENTS = 1 << 17
MAX_PAIRS = 8  # dots() batches remembered (each pair's arrays are held)
CHECK, LOCAL = 16, 17  # csrc/round/native.h AN_ARRAY_CHECK, AN_ARRAY_LOCAL (checked when a record is made)

_F64 = np.dtype(np.float64)
_STRIDES = (8,)  # a contiguous float64 block
_PAIR = (tuple, list)

#: the remembered calls, oldest first (a list: a loop's few calls are found by identity at once)
_CALLS: list = []
#: calls that passed every check once, oldest first: (op, comm, offset, n, weak references to
#: x and y); the second time, with the same arrays still alive, they are remembered
_SEEN: list = []


class Call:
    """One remembered call: (comm, op, xs, ys, offset, n) on channel `ch`, exchange `ex` (rank
    order, k = len(xs) values), and the C record of an_array_run that runs it. `x` and `y` are
    the arrays of a one-value call (sum, dot, norm2: y None for sum, x for norm2), what its
    lookup compares first."""

    __slots__ = (
        "comm",
        "ch",
        "ex",
        "engine",
        "op",
        "k",
        "xs",
        "ys",
        "x",
        "y",
        "arrays",
        "offset",
        "n",
        "shape",
        "rec",
        "run",
        "values",
        "_held",
    )

    def __init__(self, ch, ex, op: str, xs: tuple, ys: tuple | None, offset: int, n: int):
        self.comm, self.ch, self.ex, self.engine, self.op, self.k = ch.user, ch, ex, ex.engine, op, len(xs)
        self.xs, self.ys, self.offset, self.n, self.shape = xs, ys, offset, n, xs[0].shape
        # a batch is never looked up by `x` (a tuple is no array)
        self.x, self.y = (xs[0], None if ys is None else ys[0]) if self.k == 1 else (xs, ys)
        self.arrays = tuple({id(a): a for a in xs + (ys or ())}.values())  # each array once
        nat = ex.engine.compiled.native
        if (nat.lib.AN_ARRAY_CHECK, nat.lib.AN_ARRAY_LOCAL) != (CHECK, LOCAL):  # pragma: no cover - stale
            raise ImportError("alpha_mpi's C round is older than alpha_mpi/arrays/fast.py (delete its cache)")
        ffi = nat.ffi
        rec = ffi.new("an_array *")
        px = ffi.new("double *[]", [ffi.from_buffer("double[]", a) for a in xs])
        py = ffi.NULL
        if ys is not None:
            py = px if ys is xs else ffi.new("double *[]", [ffi.from_buffer("double[]", a) for a in ys])

        def words(a):
            return ffi.from_buffer("int64_t[]", a, True)

        rec.e = ex.engine.compiled.ex
        rec.xs, rec.ys, rec.k = px, py, self.k
        rec.offset, rec.length, rec.n, rec.capacity = offset, self.shape[0], n, ex.capacity
        held = [px, py, words(ex.local_words), words(ex.head), words(ex.table), words(ex.length)]
        held += [words(ex.valid_words), words(ex.final), ffi.new("double[]", self.k)]
        rec.local, rec.head, rec.row, rec.n_word = held[2], held[3], held[4], held[5]
        rec.table, rec.table_words = held[4], ex.table.size
        rec.valid, rec.final, rec.values = held[6], held[7], held[8]
        self.rec, self.run, self.values = rec, nat.lib.an_array_run, held[8]
        # the pointer arrays hold the arrays' buffers: the cdata the record points into must
        # live as long as it
        self._held = held


def lookup(comm, op: str, x, y, offset: int, n: int) -> Call | None:
    """The remembered one-value call these arguments make (offset and n: ints), if they still
    are what its checks decided and its channel is usable; else None (the ordinary path)."""
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


def lookup_pairs(comm, pairs: list, offset: int, n: int) -> Call | None:
    """The same for dots(comm, pairs, offset, n): every pair (a tuple or list of two) holds
    the very arrays of a remembered call, in order."""
    k = len(pairs)
    for c in _CALLS:
        if c.k == k and c.op == "dot" and c.comm is comm and c.offset == offset and c.n == n:
            xs, ys = c.xs, c.ys
            for j, pair in enumerate(pairs):
                if type(pair) not in _PAIR or len(pair) != 2 or pair[0] is not xs[j] or pair[1] is not ys[j]:
                    break
            else:
                shape = c.shape
                for a in c.arrays:
                    if a.dtype is not _F64 or a.shape != shape or a.strides != _STRIDES:
                        return None
                return c if c.ch.broken is None and not c.engine._busy else None
    return None


def _same(a: tuple | None, b: tuple | None) -> bool:
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(u is v for u, v in zip(a, b))


def _alive(refs: tuple | None, arrays_: tuple | None) -> bool:
    if refs is None or arrays_ is None:
        return refs is None and arrays_ is None
    return len(refs) == len(arrays_) and all(r() is a for r, a in zip(refs, arrays_))


def remember(ch, ex, op: str, xs: tuple, ys: tuple | None, offset: int, n: int) -> None:
    """Remember a call that just passed every check with these very arrays (api.py: xs, and ys
    or None for sum), the second time they come while the arrays stay alive in between. A loop
    that makes new arrays every iteration (`dot(comm, b - A @ x, ...)`) is never remembered:
    making a record costs more than the ordinary path, and would keep the temporaries alive."""
    if xs[0].shape[0] > MAX_ELEMENTS or ex.valid_order is not None or len(xs) > MAX_PAIRS:
        return
    comm = ch.user
    for i, c in enumerate(_CALLS):
        if c.op == op and c.comm is comm and c.offset == offset and c.n == n and _same(c.xs, xs):
            if _same(c.ys, ys):
                if c.ch is ch and c.ex is ex:
                    return  # known (this call took the ordinary path for a reason of its own)
                del _CALLS[i]  # of an earlier channel (before a reset)
                break
    for i, (sop, scomm, soffset, sn, wxs, wys) in enumerate(_SEEN):
        if (
            sop == op
            and scomm is comm
            and soffset == offset
            and sn == n
            and _alive(wxs, xs)
            and _alive(wys, ys)
        ):
            del _SEEN[i]
            break
    else:  # the first time (a dead weak reference never matches: a new array at an old address)
        if len(_SEEN) >= RECORDS:
            del _SEEN[0]
        refs = tuple(weakref.ref(a) for a in xs), None if ys is None else tuple(weakref.ref(a) for a in ys)
        _SEEN.append((op, comm, offset, n, *refs))
        return
    if len(_CALLS) >= RECORDS:
        del _CALLS[0]
    _CALLS.append(Call(ch, ex, op, xs, ys, offset, n))


def forget(ch) -> None:
    """Drop the records of channel `ch` (its reset, its communicator's Free)."""
    _CALLS[:] = [c for c in _CALLS if c.ch is not ch]
    _SEEN[:] = [s for s in _SEEN if s[1] is not ch.user]
