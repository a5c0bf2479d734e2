"""The steady-state call of sum, dot, norm2 and dots on 1-D blocks: one C call (csrc/round/native.h
an_array_run) where the call's geometry is that of an earlier call that passed every check.

A solver calls the same few reductions again and again: `dot(comm, r, r, off, n)` and
`dot(comm, p, Ap, off, n)` at the same offset and length every iteration, often with new arrays
(`q = A(p)`, `p = r + beta * p`). The ordinary path (api.py) checks the arguments, finds the
channel and the exchange, evaluates the summary, writes the row, runs the exchange's prepared
run and checks the table and the root, each a Python step. When a call has gone through every
check with its own arrays (none copied), a `Call` remembers what the checks decided, as the C
record of an_array_run: the operation, offset, length, n, the exchange's buffers and the table
that passed. A later call of the same geometry is then one C call through the exchange's
prepared run (PreparedRun.run_array): the summary straight into the round-0 frame, the row,
the exchange (an_run), the comparison of every rank's rows with the table that passed, and the
root's values. Same kernel, same frames, same order: the same bits.

Keyed by geometry, never by identity (issue 42):
- a record is found by the communicator object, the operation, the batch size, offset and n
  (ints) and the blocks' length; the arrays of the call are checked on every call (each a 1-D,
  C-contiguous, aligned float64 ndarray of that length: dtype, shape and strides can be set in
  place under the same object) and bound. The arrays bound now are held (the record keeps the
  last call's arrays alive, no more) and pinned by a weak reference (NumPy refuses to resize an
  array that has one, so its data cannot move while it is bound; once another array is bound in
  its place it may be resized again): a call with the very arrays bound now is checked in
  Python and keeps their pointers; a call with any other array is checked and bound in one C
  call (kernel/vectors.py: the checks and every pointer read from the arrays themselves), then
  its new arrays are held and pinned;
- the channel: a failed run or `reset` marks it broken (a record of a broken channel is never
  used, and the ordinary path then says why); `reset` and the communicator's Free delete its
  attribute, and api.py's delete callback forgets its records;
- what depends on other ranks is never cached: their rows travel on every call, and C falls
  back to Python's checks whenever they differ from the rows that passed.

Whatever is not the clean steady state goes back to Python at the point it happened (see
an_array_run's results): a NaN/Inf in the block (nothing sent: the ordinary path from the
start), a run that must return to Python (a signal slice, the send hook of tests, a bad frame, a
timeout: the prepared run goes on as after an_run), flags, a new table, a non-finite root (the
ordinary checks after the run). So every refusal is the ordinary path's, on every rank.

At most RECORDS geometries are remembered per process (a Krylov loop has two to five), and only
blocks of at most MAX_ELEMENTS elements (beyond, the summary costs far more than the Python
around it).
"""

from __future__ import annotations

import weakref

import numpy as np

from ..kernel import abi, vectors
from . import pairwise

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
MAX_PAIRS = 8  # dots() batches remembered
CHECK, LOCAL = 16, 17  # csrc/kernel/abi.h AN_ARRAY_CHECK, AN_ARRAY_LOCAL (checked at import)

abi.check(
    {
        "AN_ARRAY_CHECK": CHECK,
        "AN_ARRAY_LOCAL": LOCAL,
        "AN_MERGE_OVERFLOW": pairwise.FLAG_OVERFLOW,
        "AN_MERGE_INVALID": pairwise.FLAG_INVALID,
    },
    "alpha_mpi/arrays/fast.py and arrays/pairwise.py",
)

_F64 = np.dtype(np.float64)
_ND = np.ndarray
_bind1, _bind2 = vectors.bind, vectors.bind2
_ref = weakref.ref
_STRIDES = (8,)  # a contiguous float64 block
_PAIR = (tuple, list)

#: the remembered geometries, oldest first (a list: a loop's few calls are found at once)
_CALLS: list = []


class Call:
    """One remembered geometry: (comm, op, k, offset, n, length) on channel `ch`, exchange `ex`
    (rank order, k values), and the C record of an_array_run that runs it, with the arrays it
    points at now (`bound`: x of each pair, then y, held until a later call binds others;
    `pins`: a weak reference to each; `slots`: the address of each one's pointer in the
    record)."""

    __slots__ = (
        "comm",
        "ch",
        "ex",
        "op",
        "k",
        "offset",
        "n",
        "length",
        "rec",
        "px",
        "py",
        "bound",
        "pins",
        "slots",
        "values",
        "_held",
    )

    def __init__(self, ch, ex, op: str, k: int, offset: int, n: int, length: int):
        self.comm, self.ch, self.ex, self.op, self.k = ch.user, ch, ex, op, k
        self.offset, self.n, self.length = offset, n, length
        self.bound: list = [None] * (2 * k)
        self.pins: list = [None] * (2 * k)
        compiled = ex.engine.compiled
        nat = compiled.native
        ffi = nat.ffi
        rec = ffi.new("an_array *")
        self.px = ffi.new("double *[]", k)
        self.py = ffi.NULL if op == "sum" else ffi.new("double *[]", k)
        ys = [0] * k if op == "sum" else [vectors.address(self.py, j) for j in range(k)]
        self.slots = [vectors.address(self.px, j) for j in range(k)] + ys

        def words(a):
            return ffi.from_buffer("int64_t[]", a, True)

        rec.e = compiled.ex
        rec.xs, rec.ys, rec.k = self.px, self.py, k
        rec.offset, rec.length, rec.n, rec.capacity = offset, length, n, ex.capacity
        held = [words(ex.local_words), words(ex.head), words(ex.table), words(ex.length)]
        held += [words(ex.valid_words), words(ex.final), ffi.new("double[]", k)]
        rec.local, rec.head, rec.row, rec.n_word = held[0], held[1], held[2], held[3]
        rec.table, rec.table_words = held[2], ex.table.size
        rec.valid, rec.final, rec.values = held[4], held[5], held[6]
        self.rec, self.values = rec, held[6]
        self._held = held  # the cdata the record points into lives as long as it


def _fits(a, length: int) -> bool:
    """A 1-D, C-contiguous, aligned float64 block of `length` elements (checked every call:
    each can change in place under the same object)."""
    if not (type(a) is _ND and a.dtype is _F64 and a.ndim == 1 and len(a) == length):
        return False
    f = a.flags
    return f.c_contiguous and f.aligned


def _bind(c, j: int, x, y) -> bool:
    """Point the record's j-th block pointers at x and y (y None: sum) once they fit: the
    arrays bound there now (pinned: their pointers hold) are checked here; any other pair is
    checked and bound in C (every pointer read from its array), then held and pinned. False
    (nothing bound) when one does not fit."""
    bound, k, length = c.bound, c.k, c.length
    if bound[j] is x and (y is None or bound[k + j] is y):
        return _fits(x, length) and (y is None or y is x or _fits(y, length))
    slots = c.slots
    if y is None:
        if _bind1(id(x), length, 0, slots[j]):
            return False
    elif _bind2(id(x), id(y), length, slots[j], slots[k + j]):
        return False
    pins = c.pins
    if bound[j] is not x:
        bound[j], pins[j] = x, _ref(x)
    if y is not None and bound[k + j] is not y:
        bound[k + j], pins[k + j] = y, pins[j] if y is x else _ref(y)
    return True


def lookup(comm, op: str, x, y, offset: int, n: int) -> Call | None:
    """The remembered call of this geometry, bound to x and y, when they fit it and its
    channel is usable; else None (the ordinary path). offset and n: ints."""
    for c in _CALLS:
        if c.k == 1 and c.op == op and c.comm is comm and c.offset == offset and c.n == n:
            if c.ch.broken is not None or (y is None) != (op == "sum"):
                return None
            return c if _bind(c, 0, x, y) else None
    return None


def lookup_pairs(comm, pairs: list, offset: int, n: int) -> Call | None:
    """The same for dots(comm, pairs, offset, n): k pairs (a tuple or list of two) of arrays
    that fit a remembered call of k values."""
    k = len(pairs)
    for c in _CALLS:
        if c.k == k and c.op == "dot" and c.comm is comm and c.offset == offset and c.n == n:
            if c.ch.broken is not None:
                return None
            for pair in pairs:
                if type(pair) not in _PAIR or len(pair) != 2:
                    return None
            for j, (x, y) in enumerate(pairs):
                if not _bind(c, j, x, y):
                    return None  # (pairs bound before it stay bound: each is pinned and held)
            return c
    return None


def remember(ch, ex, op: str, xs: tuple, ys: tuple | None, offset: int, n: int) -> None:
    """Remember the geometry of a call that just passed every check with its own arrays
    (api.py: xs, and ys or None for sum), unless a record of it exists."""
    length = xs[0].shape[0]
    if length > MAX_ELEMENTS or ex.valid_order is not None or len(xs) > MAX_PAIRS:
        return
    comm, k = ch.user, len(xs)
    for i, c in enumerate(_CALLS):
        if (
            c.op == op
            and c.k == k
            and c.comm is comm
            and c.offset == offset
            and c.n == n
            and c.length == length
        ):
            if c.ch is ch and c.ex is ex:
                return  # known (this call took the ordinary path for a reason of its own)
            del _CALLS[i]  # of an earlier channel (before a reset)
            break
    if len(_CALLS) >= RECORDS:
        del _CALLS[0]
    _CALLS.append(Call(ch, ex, op, k, offset, n, length))


def forget(ch) -> None:
    """Drop the records of channel `ch` (its reset, its communicator's Free)."""
    _CALLS[:] = [c for c in _CALLS if c.ch is not ch]
