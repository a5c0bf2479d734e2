"""One reduction of 1-D blocks (alpha_mpi.arrays.api with ints for offset and shape), on the
ordinary path: every call a fast.py record cannot take, and the end of one it handed back.

Per call, on every rank (exchange.py has the protocol, pairwise.py the tree and the verdicts):

1. The rank checks its inputs (a refusal of its own still takes part, with a refused row) and
   evaluates its block's summary in the C kernel straight into the round-0 frame of the
   channel's 1-D exchange at its current capacity. A summary that does not fit is not written.
2. The exchange runs; every rank then holds every row, and pairwise.check_rows refuses by name
   on every rank alike.
3. The rows say how many records the largest state may hold (exchange.block_need): where that
   is more than the frames held, or the blocks are out of rank order, every rank runs the
   exchange again (in frames that fit, or over the ranks sorted by offset). The channel's
   Capacity follows the needs (tiles.Capacity); the final state is the root [0, n).
"""

from __future__ import annotations

import operator

import numpy as np

from ..kernel import ffi, lib
from ..refusals import KernelRefusal, Refusal
from . import fast, pairwise
from .exchange import block_need
from .tile_call import check_float64, local_checks

__all__ = ["reduce_blocks", "exchange_blocks"]

_F64 = np.dtype(np.float64)
_ND = np.ndarray
_DARR = ffi.typeof("double[]")
_from_buffer = ffi.from_buffer
_summary = lib.ap_summary
_MAX_N = 1 << 62


def reduce_blocks(ch, op: str, xs, ys, offset, n, timeout, bad_batch=None) -> list:
    """The k values of one call of 1-D blocks on channel `ch` (the same on every rank), or a
    refusal raised by name on every rank."""
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
    values, used = exchange_blocks(ch, ex, op, k, m, row, n, detail, err, again=again)
    if err is None and timeout is None and not detail and length <= fast.MAX_ELEMENTS and k <= fast.MAX_PAIRS:
        # every check passed with these very arrays (none copied): a later call with the same
        # arguments is the one C call (fast.py)
        if all(a is b for a, b in zip(xs, given[0])) and (
            ys is None or all(a is b for a, b in zip(ys, given[1]))
        ):
            fast.remember(ch, used, op, xs, ys, offset, n)
    return values


def exchange_blocks(ch, ex, op, k, m, row, n, detail, err=None, ran=False, again=None):
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
