"""The steady-state call of sum, dot, norm2 and dots, on 1-D blocks and on N-d tiles: an ordinary
prepared run of the exchange, bound to the call's arrays and geometry, where the call's
geometry is that of an earlier call that passed every check.

A solver calls the same few reductions again and again: `dot(comm, r, r, off, n)` and
`dot(comm, p, Ap, off, n)` at the same offset and length every iteration, often with new arrays
(`q = A(p)`, `p = r + beta * p`); a stencil code the same with its tiles. The ordinary path
(block_call.py, tile_call.py) checks the arguments, finds the channel and the exchange, evaluates the
summary, writes the row, runs the exchange's prepared run and checks the table and the root,
each a Python step. When a call has gone through every check with its own arrays (none
copied), a `Call` remembers its geometry as the words the exchange program's summary op reads
(planning/array_program.py, csrc/round/native.h an_summary): offset, length and n of a block;
shape, offset, extent, strides and the row of a tile. A later call of the same geometry binds
its arrays and those words to the exchange's prepared run (PreparedRun.bind_blocks, bind_tile, bind) and runs it
(PreparedRun.run_bound): ONE C call, an_run, as for every front end. The program's first op
(A) writes the summary straight into the round-0 frame, the row and the length word, the
exchange runs, and its last op (R) compares every rank's rows with the table that passed and
takes the root's values. Same kernel, same frames, same order: the same bits.

Keyed by geometry, never by identity (issue 42):
- a record is found by the communicator object, the operation, the batch size and the
  geometry (ints, or tuples of ints and the arrays' strides); the arrays of the call are checked
  on every call (float64 ndarrays of that shape, strides and alignment: dtype, shape and
  strides can be set in place under the same object) and bound for that run only: one C call
  checks each array and writes its pointer (PreparedRun.bind_blocks, bind_tile); nothing holds
  the arrays after the call (engine_bind.Bound.blocks says why);
- the channel: a failed run or `reset` marks it broken (a record of a broken channel is never
  used, and the ordinary path then says why); `reset` and the communicator's Free delete its
  attribute, and api.py's delete callback forgets its records;
- what depends on other ranks is never cached: their rows travel on every call, and the root
  check hands the call back to Python whenever they differ from the rows that passed.

Whatever is not the clean steady state goes back to Python at the point it happened: a NaN/Inf
in the block or a tile whose frames are too small (the summary op stops the run before anything
is sent, abi.STOP: the ordinary path from the start), a run that must return to Python (a signal
slice, the send hook of tests, a bad frame, a timeout: the prepared run goes on as after any
an_run), flags, a new table, a non-finite root (the root check's verdict: the ordinary checks
after the run). So every refusal is the ordinary path's, on every rank.

At most RECORDS geometries are remembered per process (a Krylov loop has two to five), and only
blocks of at most MAX_ELEMENTS elements (beyond, the summary costs far more than the Python
around it).
"""

from __future__ import annotations

import numpy as np

from ..kernel import abi, ffi
from . import pairwise

__all__ = [
    "Call",
    "RECORDS",
    "MAX_ELEMENTS",
    "MAX_PAIRS",
    "STOP",
    "lookup",
    "lookup_pairs",
    "lookup_tile",
    "remember",
    "remember_tile",
    "forget",
]

RECORDS = 6
MAX_ELEMENTS = 1 << 17
MAX_PAIRS = 8  # dots() batches remembered
STOP = abi.STOP  # the summary op stopped the run: nothing was sent

abi.check(
    {"AN_MERGE_OVERFLOW": pairwise.FLAG_OVERFLOW, "AN_MERGE_INVALID": pairwise.FLAG_INVALID},
    "alpha_mpi/arrays/fast.py and arrays/pairwise.py",
)

_PAIR = (tuple, list)
_XS = tuple(f"X{j}" for j in range(pairwise.MAX_BATCH))
_YS = tuple(f"Y{j}" for j in range(pairwise.MAX_BATCH))

#: the remembered geometries, oldest first (a list: a loop's few calls are found at once)
_CALLS: list = []


class Call:
    """One remembered geometry on channel `ch`, exchange `ex` (rank order, k values): `key`
    (offset and n of 1-D blocks; shape, offset, extent and strides of a tile), `length` (a 1-D
    block's elements; None for a tile) and the geometry words the summary op reads."""

    __slots__ = (
        "comm",
        "ch",
        "ex",
        "op",
        "k",
        "key",
        "length",
        "words",
        "offset",
        "shape",
        "given",
        "nd",
        "extent",
        "strides",
        "_layout",
    )

    def __init__(self, ch, ex, op: str, k: int, key: tuple, length, words: list):
        self.comm, self.ch, self.ex, self.op, self.k = ch.user, ch, ex, op, k
        self.key, self.length = key, length
        self.words = np.array(words, dtype=np.int64)
        # the call's offset and shape as the caller gave them: ints (1-D), tuples (a tile)
        self.offset, self.shape = key if length is not None else (key[1], key[0])
        self.given = None  # (offset, shape): the last tuples a tile call passed, checked to hold ints
        self.nd = self.extent = self.strides = None
        if length is None:  # a tile: its extent and each array's byte strides, as C reads them
            self.nd = len(key[2])
            layout = ffi.new("int64_t[]", [*key[2], *(s for st in key[3] for s in st)])
            self.extent, self.strides = layout, layout + self.nd
            self._layout = layout  # owns the memory both point into


def _bind(c, j: int, x, y) -> bool:
    """Bind the exchange's j-th blocks to x and y (y None: sum) when each is a 1-D, C-contiguous,
    aligned float64 block of the remembered length (PreparedRun.bind_blocks: for this run, by one
    C call); False, with nothing bound, otherwise."""
    return c.ex.prepared.bind_blocks(_XS[j], None if y is None else _YS[j], x, y, c.length)


def lookup(comm, op: str, x, y, offset: int, n: int) -> Call | None:
    """The remembered call of this geometry, bound to x and y, when they fit it and its
    channel is usable; else None (the ordinary path). offset and n: ints."""
    for c in _CALLS:
        if c.k == 1 and c.op == op and c.comm is comm and c.length is not None and c.key == (offset, n):
            if c.ch.broken is not None or (y is None) != (op == "sum"):
                return None
            if c.ex.capacity != c.ch.block_capacity.current:
                return None  # the frames changed size: every rank takes the ordinary path alike
            return c if _bind(c, 0, x, y) else None
    return None


def lookup_pairs(comm, pairs: list, offset: int, n: int) -> Call | None:
    """The same for dots(comm, pairs, offset, n): k pairs (a tuple or list of two) of arrays
    that fit a remembered call of k values."""
    k = len(pairs)
    for c in _CALLS:
        if c.k == k and c.op == "dot" and c.comm is comm and c.length is not None and c.key == (offset, n):
            if c.ch.broken is not None or c.ex.capacity != c.ch.block_capacity.current:
                return None
            for pair in pairs:
                if type(pair) not in _PAIR or len(pair) != 2:
                    return None
            # a pair that does not fit leaves the earlier pairs bound: harmless, the ordinary
            # path that follows binds its own, and a later call checks every pair again
            for j, (x, y) in enumerate(pairs):
                if not _bind(c, j, x, y):
                    return None
            return c
    return None


def lookup_tile(comm, op: str, x, y, offset: tuple, shape: tuple) -> Call | None:
    """The remembered tile call of this geometry (offset and shape tuples of ints, the arrays'
    shape and strides), bound to x and y (None: sum), when they fit it, its channel is usable
    and the channel's tile frames are still the ones it passed with; else None."""
    for c in _CALLS:
        if c.k == 1 and c.op == op and c.comm is comm and c.length is None:
            key = c.key  # (shape, offset, extent, strides)
            if key[0] != shape or key[1] != offset:
                continue
            g = c.given
            if g is None or g[0] is not offset or g[1] is not shape:
                for v in (*offset, *shape):  # equal tuples may hold floats or bools (0.0 == 0)
                    if type(v) is not int:
                        return None
                c.given = (offset, shape)  # these objects hold ints (tuples do not change)
            if c.ch.broken is not None or c.ex.capacity != c.ch.capacity.current:
                return None
            if (y is None) != (op == "sum"):
                return None
            # one C call: the arrays' dtype, extent, strides and alignment, their pointers bound
            if c.ex.prepared.bind_tile("X0", None if y is None else "Y0", x, y, c.nd, c.extent, c.strides):
                return c
            # else another tile at the same place (another extent, other strides), or arrays
            # that fit no record: the ordinary path
    return None


def _add(c: Call) -> None:
    for i, old in enumerate(_CALLS):
        if (
            old.op == c.op
            and old.k == c.k
            and old.comm is c.comm
            and old.key == c.key
            and old.length == c.length
        ):
            if old.ch is c.ch and old.ex is c.ex:
                return  # known (this call took the ordinary path for a reason of its own)
            del _CALLS[i]  # of an earlier channel (before a reset), or other frames (tiles)
            break
    if len(_CALLS) >= RECORDS:
        del _CALLS[0]
    _CALLS.append(c)


def remember(ch, ex, op: str, xs: tuple, ys: tuple | None, offset: int, n: int) -> None:
    """Remember the geometry of a call that just passed every check with its own arrays
    (block_call.py: xs, and ys or None for sum), unless a record of it exists."""
    length = xs[0].shape[0]
    if length > MAX_ELEMENTS or ex.valid_order is not None or len(xs) > MAX_PAIRS:
        return
    # only the exchange every rank's ordinary path takes (rank order, the channel's frames): a
    # rank whose arrays miss the record then meets its peers in the same exchange
    if (
        ex.capacity != ch.block_capacity.current
        or ex.valid_need > ex.capacity
        or ex.order != tuple(range(ch.size))
    ):
        return
    _add(Call(ch, ex, op, len(xs), (offset, n), length, [offset, length, n]))


def remember_tile(ch, ex, op: str, args) -> None:
    """Remember a tile call (tile_call.py: its checked TileArgs `args`, one array or one pair)
    that just passed every check with its own arrays in exchange `ex`, whose frames held it."""
    geo = args.geo
    elements = 1
    for e in geo.extent:
        elements *= e
    if (
        len(args.xs) != 1
        or elements > MAX_ELEMENTS
        or ex.valid_words[0] != 1
        or ex.capacity != ch.capacity.current
    ):
        return
    strides = tuple(a.strides for a in args.xs) + (tuple(a.strides for a in args.ys) if args.ys else ())
    d = geo.ndim
    words = [geo.n, d, *geo.shape, *geo.offset, *geo.extent]
    words += [int(geo.strides[i]) for i in range(d * len(strides))]
    key = (geo.shape, geo.offset, geo.extent, strides)
    _add(Call(ch, ex, op, 1, key, None, words + list(geo.row_tail)))


def forget(ch) -> None:
    """Drop the records of channel `ch` (its reset, its communicator's Free)."""
    _CALLS[:] = [c for c in _CALLS if c.ch is not ch]
