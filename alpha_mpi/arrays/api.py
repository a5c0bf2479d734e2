"""sum, dot, norm2 and dots of distributed float64 arrays: the pairwise tree over global indices.

Every function is collective over `comm`: every rank calls it, in the same order, with its own
block of one global array, and gets the same Python float. Two forms:

- 1-D: `x` is elements [offset, offset + len(x)) of a global vector of length `shape` (ints).
- N-d: `x` is the tile x[i] = global[offset + i] of a C-order global array of `shape` (tuples
  of x.ndim <= 4 ints; `x` may be a strided view, such as the interior of an array with halo
  cells, and is never copied). The result is the 1-D one over the flattened global array.

The blocks must be disjoint and cover the global array (empty blocks are fine; any rank
order). The bits depend only on the data and the global shape: never on the number of ranks nor
on where the blocks begin and end (any tiling, Cartesian or not, even or uneven).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, SupportsIndex

import numpy as np

from ..execution.endpoint import Endpoint
from ..refusals import Refusal
from . import fast, pairwise
from .block_call import exchange_blocks, reduce_blocks
from .exchange import STREAM, Exchanges
from .tile_call import finish_tiles, reduce_tiles, tile_form

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["sum", "dot", "norm2", "dots", "reset"]

#: An int (1-D blocks) or a tuple of ints, one per dimension (N-d tiles).
Index = SupportsIndex | Sequence[SupportsIndex]


def sum(  # noqa: A001 - the natural name
    comm: MPI.Comm, x: np.ndarray, offset: Index, shape: Index, *, timeout: float | None = None
) -> float:
    """Σ x_i over the global array (the pairwise tree over its flattened indices [0, n)); the
    same float on every rank.

    Args:
        comm: the communicator; every rank calls, in the same order.
        x: this rank's block, float64: 1-D, or an N-d tile (any strides).
        offset: the block's global start: an int (1-D) or a tuple, one int per dimension.
        shape: the global length n (1-D) or the global shape (a tuple; n = its product).
        timeout: seconds to wait for a peer (default: ALPHA_MPI_TIMEOUT).
    """
    if timeout is None:
        if type(offset) is int and type(shape) is int:
            c = fast.lookup(comm, "sum", x, None, offset, shape)  # the record of this geometry, bound to x
        elif type(offset) is tuple and type(shape) is tuple:
            c = fast.lookup_tile(comm, "sum", x, None, offset, shape)
        else:
            c = None
        if c is not None:
            return _one_call(c, (x,), None)[0]
    return _reduce(comm, "sum", (x,), None, offset, shape, timeout)[0]


def dot(
    comm: MPI.Comm,
    x: np.ndarray,
    y: np.ndarray,
    offset: Index,
    shape: Index,
    *,
    timeout: float | None = None,
) -> float:
    """Σ x_i·y_i over the global arrays: each product rounded once (no FMA), then the pairwise
    tree over the flattened indices [0, n). x and y are this rank's blocks of one shape (their
    strides may differ); offset, shape and timeout as for `sum`."""
    if timeout is None:
        if type(offset) is int and type(shape) is int:
            c = fast.lookup(comm, "dot", x, y, offset, shape)
        elif type(offset) is tuple and type(shape) is tuple:
            c = fast.lookup_tile(comm, "dot", x, y, offset, shape)
        else:
            c = None
        if c is not None:
            return _one_call(c, (x,), (y,))[0]
    return _reduce(comm, "dot", (x,), (y,), offset, shape, timeout)[0]


def norm2(
    comm: MPI.Comm, x: np.ndarray, offset: Index, shape: Index, *, timeout: float | None = None
) -> float:
    """sqrt(Σ x_i·x_i): the pairwise tree of the squares, then one correctly rounded square
    root. No scaling: |x_i| above ~1e154 overflows and is refused (non-finite-combined).
    Arguments as for `sum`."""
    if timeout is None:
        if type(offset) is int and type(shape) is int:
            c = fast.lookup(comm, "norm2", x, x, offset, shape)
        elif type(offset) is tuple and type(shape) is tuple:
            c = fast.lookup_tile(comm, "norm2", x, x, offset, shape)
        else:
            c = None
        if c is not None:
            return math.sqrt(_one_call(c, (x,), (x,))[0])
    return math.sqrt(_reduce(comm, "norm2", (x,), (x,), offset, shape, timeout)[0])


def dots(
    comm: MPI.Comm,
    pairs: Iterable[tuple[np.ndarray, np.ndarray]],
    offset: Index,
    shape: Index,
    *,
    timeout: float | None = None,
) -> list[float]:
    """[dot(x, y) for (x, y) in pairs] in one exchange (one latency for k inner products), the
    same bits as k calls of dot. Every array of every pair is a block of the same place
    (offset, and the same block shape) of the global shape; arguments as for `sum`."""
    if timeout is None and type(offset) is int and type(shape) is int and type(pairs) is list:
        c = fast.lookup_pairs(comm, pairs, offset, shape)
        if c is not None:
            return list(_one_call(c, tuple(q[0] for q in pairs), tuple(q[1] for q in pairs)))
    try:
        pairs = list(pairs)
        if not 1 <= len(pairs) <= pairwise.MAX_BATCH or not all(
            isinstance(p, (tuple, list)) and len(p) == 2 for p in pairs
        ):
            raise TypeError
    except TypeError:
        return _reduce(comm, "dot", None, None, offset, shape, timeout, bad_batch=pairs)
    return _reduce(
        comm, "dot", tuple(p[0] for p in pairs), tuple(p[1] for p in pairs), offset, shape, timeout
    )


def reset(comm: MPI.Comm) -> None:
    """Forget alpha_mpi.arrays' exchanges on `comm` (after a peer-timeout left them broken) and
    recover the communicator's endpoint (its stale messages drained). Collective: call it on
    every rank; the next reduction agrees a fresh tag block."""
    _forget(comm)
    # drains what a failed call left on every rank (execution/recovery.py: a peer running a call
    # joins it, and this rank then refuses its reset by name once every rank has reset)
    Endpoint.of(comm).recover(drop=(STREAM,))


def _forget(comm) -> None:
    """Drop the arrays' channel on `comm` (local): its exchanges, stream and remembered calls."""
    kv = _keyval()
    ch = comm.Get_attr(kv)
    if ch is not None:
        comm.Delete_attr(kv)
        ch.free()


# ----------------------------------------------------------------------------------------------
# The exchanges (alpha_mpi.arrays' stream on the communicator's endpoint, its step and buffers) are cached
# as an MPI attribute of the user's communicator: it goes away with that communicator, so a new
# communicator that reuses a freed handle never meets a stale channel.
_KEYVAL: list = []


def _keyval() -> int:
    if not _KEYVAL:
        from mpi4py import MPI

        _KEYVAL.append(MPI.Comm.Create_keyval(delete_fn=_deleted))
    return _KEYVAL[0]


def _deleted(comm, keyval, ch) -> None:
    """The channel's attribute goes (reset, or the communicator's Free): its remembered calls
    (fast.py) go with it."""
    try:
        fast.forget(ch)
    except Exception:  # never raise out of an MPI callback
        pass


def _channel(comm) -> Exchanges:
    kv = _KEYVAL[0] if _KEYVAL else _keyval()
    ch = comm.Get_attr(kv)
    if ch is None:
        ch = Exchanges(comm, drop=lambda st: _forget(comm))
        comm.Set_attr(kv, ch)
    if ch.broken is not None and ch.endpoint.pending_reset is not None:
        ch.endpoint.settle()  # it broke on a peer's reset: reset with it, then a fresh channel
        return _channel(comm)
    if ch.broken is not None:
        raise Refusal(
            "combiner-broken",
            f"an earlier array reduction on this communicator ended with [{ch.broken}] and frames "
            "may still be in flight; call alpha_mpi.arrays.reset(comm) on every rank",
        )
    return ch


def _reduce(comm, op, xs, ys, offset, n, timeout, bad_batch=None):
    if type(n) is not int:
        offset, n, tile = tile_form(offset, n)
        if tile:
            return reduce_tiles(_channel(comm), op, xs, ys, offset, n, timeout, bad_batch)
    return reduce_blocks(_channel(comm), op, xs, ys, offset, n, timeout, bad_batch)


def _one_call(c: fast.Call, xs: tuple, ys: tuple | None):
    """A call of a remembered geometry (fast.py): the exchange's prepared run, bound to the
    call's arrays and geometry, in one C call; its k values (indexable). Whatever is not the
    clean steady state goes on in Python from where it happened."""
    ch, ex = c.ch, c.ex
    step = ch.step
    ch.call_timeout = ch.timeout
    try:
        rc = ex.run_bound(step, c.words)  # the arrays were bound by the lookup (fast.py)
    except BaseException as e:
        ch.step = step + 1
        if isinstance(e, Refusal):
            (ch.capacity if c.length is None else ch.block_capacity).refused()
        raise
    if rc == 0 and not ex.verdict[0]:  # the root check took the root's values
        ch.step = step + 1
        capacity = ch.capacity if c.length is None else ch.block_capacity
        if ex.valid_need != capacity.steady:
            capacity.settle(ex.valid_need)  # as every ordinary call does (tile_call.py, block_call.py)
        return ex.root_values
    if rc == fast.STOP:  # the summary met a NaN/Inf or frames too small; nothing was sent
        return _reduce(c.comm, c.op, xs, ys, c.offset, c.shape, None)
    if c.length is None:
        return finish_tiles(ch, ex, c.op, xs, ys, c.offset, c.shape)
    row = (c.offset, c.length, c.shape, pairwise.STATUS_OK)
    return exchange_blocks(ch, ex, c.op, c.k, int(ex.summary_result[0]), row, c.shape, "", ran=True)[0]
