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
import operator
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, SupportsIndex

import numpy as np

from ..execution.endpoint import Endpoint
from ..kernel import ffi, lib
from ..refusals import KernelRefusal, Refusal
from . import fast, pairwise
from .exchange import STREAM, Exchanges, block_need
from .tile_call import check_float64, finish_tiles, local_checks, reduce_tiles, tile_form

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["sum", "dot", "norm2", "dots", "reset"]

_F64 = np.dtype(np.float64)
_ND = np.ndarray
_DARR = ffi.typeof("double[]")
_from_buffer = ffi.from_buffer
_summary = lib.ap_summary
_MAX_N = 1 << 62

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


def _block(a, what: str, op: str):
    if type(a) is np.ndarray and a.dtype == _F64 and a.ndim == 1:
        # copied where C could not read it as `double *`: strided, or off its 8-byte alignment
        return a if a.flags.c_contiguous and a.flags.aligned else np.array(a, order="C")
    check_float64(a, what, op)
    raise Refusal(
        "array-block-invalid",
        f"{op}: {what} has shape {a.shape}, expected a 1-D block (for an N-d tile pass offset and "
        "shape as tuples, one int per dimension)",
    )


def _inputs(op, xs, ys, offset, n):
    """Checked (xs, ys, length, offset, n); raises the rank's own refusal."""
    if len(xs) == 1 and type(offset) is int and type(n) is int:  # the common case, no formatting
        x = xs[0]
        if type(x) is _ND and x.dtype is _F64 and x.ndim == 1 and x.flags.c_contiguous and x.flags.aligned:
            length = x.shape[0]
            if ys is not None and op != "norm2":
                y = ys[0]
                ok = (
                    type(y) is _ND
                    and y.dtype is _F64
                    and y.ndim == 1
                    and y.flags.c_contiguous
                    and y.flags.aligned
                    and y.shape[0] == length
                )
            else:
                ok, ys = True, (xs if ys is not None else None)
            if ok and 0 <= offset and offset + length <= n < _MAX_N:
                return xs, ys, length, offset, n
    return _inputs_checked(op, xs, ys, offset, n)


def _inputs_checked(op, xs, ys, offset, n):
    xs = tuple([_block(a, f"x[{j}]" if len(xs) > 1 else "x", op) for j, a in enumerate(xs)])
    if ys is None or op == "norm2":
        ys = xs if ys is not None else None
    else:
        ys = tuple([_block(a, f"y[{j}]" if len(ys) > 1 else "y", op) for j, a in enumerate(ys)])
    length = xs[0].shape[0]
    for name, group in (("x", xs), ("y", ys or ())):
        for j, a in enumerate(group):
            if a.shape[0] != length:
                raise Refusal(
                    "array-block-invalid",
                    f"{op}: {name}[{j}] has {a.shape[0]} elements, x[0] has "
                    f"{length}; every block of one call covers the same [offset, offset + len)",
                )
    if type(offset) is not int or type(n) is not int:
        try:
            offset, n = operator.index(offset), operator.index(n)
        except TypeError:
            raise Refusal(
                "array-block-invalid", f"{op}: offset and n must be integers, got {offset!r} and {n!r}"
            ) from None
    if not (0 <= offset and offset + length <= n < _MAX_N):
        raise Refusal(
            "array-block-invalid",
            f"{op}: this rank's block [{offset}, {offset + length}) is not inside "
            f"[0, {n}) (expected 0 <= offset, offset + len(x) <= n < 2^62)",
        )
    return xs, ys, length, offset, n


def _reduce(comm, op, xs, ys, offset, n, timeout, bad_batch=None):
    if type(n) is not int:
        offset, n, tile = tile_form(offset, n)
        if tile:
            return reduce_tiles(_channel(comm), op, xs, ys, offset, n, timeout, bad_batch)
    ch = _channel(comm)
    k = len(xs) if xs is not None else 1
    given = (xs, ys)
    detail = ""
    checked, err, status = local_checks(ch, timeout, bad_batch, lambda: _inputs(op, xs, ys, offset, n))
    if err is None:
        xs, ys, length, offset, n = checked
    ex = ch.exchanges.get((op, k, None, ch.block_capacity.current)) or ch.exchange(op, k)
    m = 0
    again = None
    if err is None:
        px, py = ex.xs_ptrs, ffi.NULL
        if k == 1:  # the common case without lists (the cdata must live until the kernel returns)
            hx = _from_buffer(_DARR, xs[0])
            px[0] = hx
            if ys is not None:
                hy = hx if ys is xs else _from_buffer(_DARR, ys[0])
                py = ex.ys_ptrs
                py[0] = hy
        else:
            held = [_from_buffer(_DARR, a) for a in xs]
            for j in range(k):
                px[j] = held[j]
            if ys is not None:
                held_y = held if ys is xs else [_from_buffer(_DARR, a) for a in ys]
                py = ex.ys_ptrs
                for j in range(k):
                    py[j] = held_y[j]
        m = _summary(px, py, k, offset, length, n, ex.state0, ex.capacity, ex.nonfinite)
        if m == lib.AP_ERR_OVERFLOW:  # frames smaller than this block's summary: not written; its
            # row tells every rank (block_need), and the exchange runs again in frames that fit
            def again(ex2, px=px, py=py, length=length, offset=offset, n=n):
                return _summary(px, py, k, offset, length, n, ex2.state0, ex2.capacity, ex2.nonfinite)

            m = 0
        if m < 0:  # cannot happen for checked inputs; refused like a local refusal (peers finish)
            err = KernelRefusal("kernel-bad-argument", f"{op}: the kernel refused the block (status {m})")
            status, m = pairwise.refused_status(err.code), 0
        elif ex.nonfinite[0]:
            detail = _first_nonfinite(xs, ys, offset, length)
            if detail:
                status = pairwise.STATUS_NONFINITE
    row = (offset, length, n, status) if err is None else (0, 0, 0, status)
    if err is not None:
        n = 0
    values, used = _exchange(ch, ex, op, k, m, row, n, detail, err, again=again)
    if err is None and timeout is None and not detail and length <= fast.MAX_ELEMENTS and k <= fast.MAX_PAIRS:
        # every check passed with these very arrays (none copied): a later call with the same
        # arguments is the one C call (fast.py)
        if all(a is b for a, b in zip(xs, given[0])) and (
            ys is None or all(a is b for a, b in zip(ys, given[1]))
        ):
            fast.remember(ch, used, op, xs, ys, offset, n)
    return values


def _exchange(ch, ex, op, k, m, row, n, detail, err=None, ran=False, again=None):
    """Run the exchange (unless the one call `ran` it to its end: fast.py) and return the
    root's values and the exchange that gave them; refusals by name on every rank. `again`:
    how to write this rank's summary into another exchange, where it did not fit this one's
    frames (None: it is in this one's)."""
    try:
        if not ran:
            ex.run(row, m, n, local=err)  # raises this rank's refusal, a bad frame's or a peer's
        values = None
        if ex.valid_order is None and ex.valid_need <= ex.capacity and ex.table.tobytes() == ex.valid:
            values = ex.root(n)  # the table that passed every check last time: nothing to re-check
        if values is None:
            values, ex = _verdict(ch, ex, op, k, m, row, n, detail, again)
        else:
            ch.block_capacity.settle(ex.valid_need)
    except Refusal:
        ch.block_capacity.refused()  # perhaps on this rank only (tiles.Capacity.refused)
        raise
    finally:
        ch.step += 1
    pairwise.check_result(values, op)
    return values, ex


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
            capacity.settle(ex.valid_need)  # as every ordinary call does (tile_call.py, _verdict)
        return ex.root_values
    if rc == fast.STOP:  # the summary met a NaN/Inf or frames too small; nothing was sent
        return _reduce(c.comm, c.op, xs, ys, c.offset, c.shape, None)
    if c.length is None:
        return finish_tiles(ch, ex, c.op, xs, ys, c.offset, c.shape)
    row = (c.offset, c.length, c.shape, pairwise.STATUS_OK)
    return _exchange(ch, ex, c.op, c.k, int(ex.summary_result[0]), row, c.shape, "", ran=True)[0]


def _verdict(ch, ex, op, k, m_local, row, n, detail, again=None):
    """Refuse by name (the same on every rank), or exchange again (in index order, or in
    frames that fit), or return (the root's values, the exchange that gave them)."""
    tb = ex.table.tobytes()
    if tb != ex.valid:
        rows = ex.rows()
        pairwise.check_naming(pairwise.check_rows, rows, op, ch.rank, detail)
        order = None if pairwise.in_rank_order(rows) else pairwise.sorted_order(rows)
        ex.passed(tb, order, block_need(rows, order))
    need = ex.valid_need
    ch.block_capacity.settle(need)
    # every rank sees the same rows, so every rank takes this branch alike
    if ex.valid_order is not None or need > ex.capacity:
        # out of rank order (every rank runs the sorted exchange), or frames too small for
        # what the rows say the states hold (every rank runs the exchange in frames that fit)
        ex2 = ch.exchange(op, k, ex.valid_order, ch.block_capacity.current)
        if again is None:
            ex2.copy_local_from(ex, m_local)
        else:
            m_local = again(ex2)
        ex2.run_again(row, m_local, n, pairwise.check_rows, op)
        ex2.passed(ex2.valid, None, need)  # its own order, with frames that hold `need`
        ex = ex2
    return ex.result(n, op), ex


def _first_nonfinite(xs, ys, offset, length) -> str:
    """'x[i] = nan' for the first NaN/Inf among this rank's inputs, or '' (then a product or
    partial sum overflowed from finite inputs)."""
    for name, group in (("x", xs), ("y", ys if ys is not None and ys is not xs else ())):
        for j, a in enumerate(group):
            i = lib.ak_first_nonfinite(ffi.from_buffer(_DARR, a), length)
            if i >= 0:
                label = name if len(group) == 1 else f"{name}[{j}]"
                return f"{label}[{i}] = {float(a[i])!r} (global index {offset + i})"
    return ""
