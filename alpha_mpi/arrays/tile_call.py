"""One reduction of N-d tiles (alpha_mpi.arrays.api with tuples for offset and shape).

Per call, on every rank (tiles.py has the geometry and the verdicts):

1. The rank checks its inputs (a refusal of its own still takes part, with a refused row) and
   evaluates its tile's summary in one C pass over the tile's row segments (ap_summary_tile:
   strided views are read in place) straight into the round-0 frame of the tile exchange of
   the channel's current capacity. A summary that does not fit is not written; its record
   count (ap_tile_records) goes in the row all the same.
2. The exchange runs (the 1-D Program, with tile rows: shape, offset, extent, record count).
3. Every rank holds every row: tiles.check_tiles refuses by name on every rank alike. The rows
   also say how many records the largest state may hold (tiles.capacity_needed); if that is
   more than the frames held, every rank knows it and runs the exchange again with frames that
   fit (the channel's Capacity keeps them for the next calls: one more exchange per change of
   tiling, none while it stays). The final state is the root [0, n) and its values the result.
"""

from __future__ import annotations

import operator

import numpy as np

from ..execution.waits import timeout_from_env
from ..kernel import ffi, lib
from ..refusals import KernelRefusal, Refusal
from . import fast, pairwise
from . import tiles as G

__all__ = ["tile_form", "reduce_tiles", "finish_tiles", "check_float64", "local_checks"]

_F64 = np.dtype(np.float64)
_ND = np.ndarray
_SEQ = (tuple, list, np.ndarray)
_DARR = ffi.typeof("double[]")
_MAX_N = 1 << 62
_GEOMETRIES = 64  # kept per channel (a solver has a few tiles; a changing tiling starts afresh)


def tile_form(offset, shape) -> tuple:
    """(offset, shape, is_tile). Sequences of one int are the 1-D form (the same exchange as
    ints); any other sequence makes a tile call (whose checks name what is wrong)."""
    if not (isinstance(offset, _SEQ) or isinstance(shape, _SEQ)):
        return offset, shape, False
    try:
        if len(offset) == 1 and len(shape) == 1:
            return offset[0], shape[0], False
    except TypeError:  # an int beside a tuple: a tile call with the wrong number of dims
        pass
    return offset, shape, True


class Geometry:
    """A tile's place, checked, and what the kernel reads of it: the shape, offset and extent
    words and the arrays' element strides. Made once per (offset, shape, block shape, strides)
    and kept by the channel: a solver calls with the same tiles again and again."""

    __slots__ = ("shape", "offset", "extent", "n", "ndim", "arrays", "words", "strides", "row_tail")

    def __init__(self, shape: tuple, offset: tuple, extent: tuple, strides: tuple):
        self.shape, self.offset, self.extent = shape, offset, extent
        n = 1
        for s in shape:
            n *= s
        self.n, self.ndim, self.arrays = n, len(shape), len(strides)
        self.words = ffi.new("int64_t[]", [*shape, *offset, *extent])
        rows = [_element_strides(s, extent) for s in strides]
        self.strides = ffi.new("int64_t[]", [v for r in rows for v in r])
        self.row_tail = G.Tile(0, 0, 0, 0, shape, offset, extent).words()[3:]  # ndim onwards

    @classmethod
    def checked(cls, op: str, shape: tuple, offset: tuple, extent: tuple, strides: tuple) -> Geometry:
        """The geometry, or this rank's refusal (array-block-invalid) naming what is wrong."""
        d = len(shape)
        if not 1 <= d <= G.MAX_NDIM:
            raise Refusal(
                "array-block-invalid",
                f"{op}: the global shape {shape} has {d} dimensions, expected 1 to {G.MAX_NDIM} "
                "(dimensions every tile covers whole can be merged by a reshape)",
            )
        if len(offset) != d or len(extent) != d:
            raise Refusal(
                "array-block-invalid",
                f"{op}: offset {offset} and the block's shape {extent} must have one entry per "
                f"dimension of the global shape {shape}",
            )
        n = 1
        for s in shape:
            n = n * s if s >= 0 else -1
        bad = [
            i
            for i in range(d)
            if not (0 <= offset[i] and 0 <= shape[i] and offset[i] + extent[i] <= shape[i])
        ]
        if bad or not 0 <= n < _MAX_N:
            end = tuple(o + e for o, e in zip(offset, extent))
            raise Refusal(
                "array-block-invalid",
                f"{op}: this rank's tile from {offset} to {end} (exclusive) is not inside the shape {shape}"
                + (f" (dimension {bad[0]})" if bad else " (expected prod(shape) < 2^62)"),
            )
        return cls(shape, offset, extent, strides)

    def tile(self, rank: int, status: int, records: int, room: int) -> G.Tile:
        return G.Tile(rank, status, records, room, self.shape, self.offset, self.extent)


class TileArgs:
    """A tile call's checked inputs: its Geometry and the arrays (read in place, or copied where
    a last-dimension stride is not one element)."""

    __slots__ = ("geo", "xs", "ys")

    def __init__(self, geo: Geometry, xs: tuple, ys):
        self.geo, self.xs, self.ys = geo, xs, ys

    def summary(self, ex, capacity: int) -> int:
        """ap_summary_tile into ex's local state: the record count, or AP_ERR_* (ex.room: the
        records held at most)."""
        geo, k = self.geo, ex.k
        px, py = ex.xs_ptrs, ffi.NULL
        held = [_pointer(a) for a in self.xs]
        for j in range(k):
            px[j] = held[j]
        if self.ys is not None:
            py = ex.ys_ptrs
            held_y = held if self.ys is self.xs else [_pointer(a) for a in self.ys]
            for j in range(k):
                py[j] = held_y[j]
        d, g = geo.ndim, geo.words
        return lib.ap_summary_tile(
            px,
            py,
            k,
            d,
            g,
            g + d,
            g + 2 * d,
            geo.strides,
            ex.state0,
            capacity,
            ex.scratch,
            ex.nonfinite,
            ex.room,
        )

    def records(self, room) -> int:
        """The summary's record count (its geometry and strides alone); room[0]: what the kernel
        pass needs."""
        geo = self.geo
        d, g = geo.ndim, geo.words
        return lib.ap_tile_records(d, g, g + d, g + 2 * d, geo.strides, geo.arrays, room)


def _pointer(a):
    """The kernel's pointer to a's first element (held until the kernel returns)."""
    if a.flags.c_contiguous:
        return ffi.from_buffer(_DARR, a)
    return ffi.cast("double *", a.__array_interface__["data"][0])  # a is held by TileArgs


def _element_strides(strides: tuple, extent: tuple) -> list:
    """Byte strides in elements; a dimension of one element steps nowhere (0), and the last
    steps by one (checked in _tile_array, or it holds one element)."""
    out = [s // 8 if e > 1 else 0 for s, e in zip(strides, extent)]
    out[-1] = 1
    return out


def check_float64(a, what: str, op: str) -> None:
    """dtype-invalid unless `a` is a numpy array of native float64 (1-D blocks and tiles)."""
    if not isinstance(a, np.ndarray):
        raise Refusal(
            "dtype-invalid", f"{op}: {what} is a {type(a).__name__}, expected a numpy float64 array"
        )
    if a.dtype != _F64:
        raise Refusal(
            "dtype-invalid",
            f"{op}: {what} is {a.dtype}, expected native float64 (binary32 widens exactly: x.astype(np.float64))",
        )


def _tile_array(a, what: str, op: str, ndim: int):
    """a, checked: a float64 numpy array of ndim dimensions (copied only where its elements
    are not 8-byte steps along the last dimension, or not 8-byte aligned)."""
    if type(a) is np.ndarray and a.dtype is _F64 and a.ndim == ndim and a.flags.aligned:
        st = a.strides
        if st[-1] == 8 and not any(s & 7 for s in st):
            return a
    check_float64(a, what, op)
    if a.ndim != ndim:
        raise Refusal(
            "array-block-invalid",
            f"{op}: {what} has {a.ndim} dimensions (shape {a.shape}), the global shape has {ndim}; "
            "pass this rank's tile with one dimension per global dimension",
        )
    if any(s % 8 for s in a.strides) or (a.shape[-1] > 1 and a.strides[-1] != 8) or not a.flags.aligned:
        # rows must be contiguous for the kernel (rare: x[:, ::2]) and elements on their 8-byte
        # alignment (np.frombuffer(b, offset=1) is read through `double *` otherwise)
        return np.array(a, order="C")
    return a


def _ints(v, what: str, op: str) -> tuple:
    try:
        return tuple([operator.index(i) for i in v])
    except TypeError:
        raise Refusal(
            "array-block-invalid",
            f"{op}: {what} must be a tuple of integers, one per dimension, got {v!r:.80}",
        ) from None


def tile_inputs(op: str, xs, ys, offset, shape, cache: dict | None = None) -> TileArgs:
    """The checked TileArgs of a tile call; raises the rank's own refusal. `cache`: Geometries
    by (shape, offset, block shape, strides), kept between calls."""
    if cache is not None and len(xs) == 1 and type(offset) is tuple and type(shape) is tuple:
        # A solver's call: one pair of float64 arrays read in place, int tuples; its geometry
        # was checked on an earlier call (the key holds ints only, so a float never matches).
        x = xs[0]
        y = x if ys is None or op == "norm2" else ys[0]
        if (
            type(x) is _ND
            and type(y) is _ND
            and x.dtype is _F64
            and y.dtype is _F64
            and x.flags.aligned  # else copied below: the kernel reads `double *`
            and y.flags.aligned
            and x.shape == y.shape
            and all(type(v) is int for v in offset)
            and all(type(v) is int for v in shape)
        ):
            key = (shape, offset, x.shape, (x.strides,) if ys is None else (x.strides, y.strides))
            geo = cache.get(key)
            if geo is not None:
                return TileArgs(geo, xs, None if ys is None else (x,) if y is x else (y,))
    shape = _ints(shape if isinstance(shape, _SEQ) else (shape,), "shape", op)
    offset = _ints(offset if isinstance(offset, _SEQ) else (offset,), "offset", op)
    d = len(shape)
    xs = tuple([_tile_array(a, f"x[{j}]" if len(xs) > 1 else "x", op, d) for j, a in enumerate(xs)])
    if ys is None or op == "norm2":
        ys = xs if ys is not None else None
    else:
        ys = tuple([_tile_array(a, f"y[{j}]" if len(ys) > 1 else "y", op, d) for j, a in enumerate(ys)])
    extent = xs[0].shape
    for name, group in (("x", xs), ("y", ys or ())):
        for j, a in enumerate(group):
            if a.shape != extent:
                raise Refusal(
                    "array-block-invalid",
                    f"{op}: {name}[{j}] has shape {a.shape}, x[0] has {extent}; every block of one "
                    "call is the same tile",
                )
    strides = tuple([a.strides for a in xs] + ([a.strides for a in ys] if ys is not None else []))
    key = (shape, offset, extent, strides)
    geo = cache.get(key) if cache is not None else None
    if geo is None:
        geo = Geometry.checked(op, shape, offset, extent, strides)
        if cache is not None:
            if len(cache) >= _GEOMETRIES:
                cache.clear()
            cache[key] = geo
    return TileArgs(geo, xs, ys)


def local_checks(ch, timeout, bad_batch, inputs) -> tuple:
    """(inputs(), None, STATUS_OK), or (None, this rank's refusal, its row status): the call's
    timeout, a dots() batch that is not pairs, then `inputs`' own checks (1-D blocks or tiles).
    A rank that refuses still takes part in the exchange, with that status in its row."""
    ch.call_timeout = ch.timeout
    try:
        if timeout is not None:
            ch.call_timeout = timeout_from_env(timeout)
        if bad_batch is not None:
            raise pairwise.batch_refusal(bad_batch)
        return inputs(), None, pairwise.STATUS_OK
    except Refusal as e:
        return None, e, pairwise.refused_status(e.code)


def reduce_tiles(ch, op: str, xs, ys, offset, shape, timeout, bad_batch=None) -> list:
    """The k values of one tile call on channel `ch` (the same on every rank), or a refusal
    raised by name on every rank."""
    k = len(xs) if xs is not None else 1
    args, err, status = local_checks(
        ch, timeout, bad_batch, lambda: tile_inputs(op, xs, ys, offset, shape, ch.geometries)
    )
    ex = ch.tile_exchange(op, k, ch.capacity.current)
    m = records = n = 0
    detail = ""
    if err is None:
        n = args.geo.n
        m = records = args.summary(ex, ex.capacity)
        if m == lib.AP_ERR_OVERFLOW:  # not written; the row still tells every rank what it needs
            m, records = 0, args.records(ex.room)
        if m < 0 or records < 0:  # cannot happen for checked inputs; refused like a local refusal
            err = KernelRefusal("kernel-bad-argument", f"{op}: the kernel refused the tile (status {m})")
            status, m, records, n = pairwise.refused_status(err.code), 0, 0, 0
        elif ex.nonfinite[0]:
            detail = _first_nonfinite(args)
            if detail:
                status = pairwise.STATUS_NONFINITE
    if err is None:
        row = [status, records, int(ex.room[0]), *args.geo.row_tail]  # tiles.Tile.words()
    else:
        row = G.Tile.refused(ch.rank, status).words()
    try:
        ex.run(row, m, n, local=err)  # raises this rank's refusal, a bad frame's or a peer's
        values, used = _verdict(ch, ex, op, args, row, m, records, n, detail)
    except Refusal:
        ch.capacity.refused()  # perhaps on this rank only (tiles.Capacity.refused)
        raise
    finally:
        ch.step += 1
    pairwise.check_result(values, op)
    if err is None and timeout is None and not detail and _own(args, xs, ys):
        # every check passed with these very arrays (none copied): a later call of this
        # geometry is a run bound to its arrays (fast.py)
        fast.remember_tile(ch, used, op, args)
    return values


def _own(args: TileArgs, xs, ys) -> bool:
    """The call's arrays were read in place (none copied)."""
    if len(xs) != len(args.xs) or any(a is not b for a, b in zip(args.xs, xs)):
        return False
    return ys is None or (len(ys) == len(args.ys) and all(a is b for a, b in zip(args.ys, ys)))


def finish_tiles(ch, ex, op: str, xs, ys, offset: tuple, shape: tuple) -> list:
    """The end of a remembered tile call (fast.py) whose run ended with the root check's
    verdict that Python must look: the ordinary checks of the table it left (this rank's row,
    written by the summary op, is its row 0), an exchange again where the frames were too
    small, and the root's values."""
    try:
        args = tile_inputs(op, xs, ys, offset, shape, ch.geometries)
        m = int(ex.summary_result[0])
        values, _ = _verdict(ch, ex, op, args, ex.table[0].tolist(), m, m, args.geo.n, "")
    except Refusal:
        ch.capacity.refused()
        raise
    finally:
        ch.step += 1
    pairwise.check_result(values, op)
    return values


def _verdict(ch, ex, op, args, row, m, records, n, detail) -> tuple:
    """Refuse by name (the same on every rank), or exchange again in frames that fit, or return
    (the root's values, the exchange that gave them)."""
    tb = ex.table.tobytes()
    if tb != ex.valid:
        tiles = ex.rows()
        pairwise.check_naming(G.check_tiles, tiles, op, ch.rank, detail)
        ex.passed_tiles(tb, G.capacity_needed(tiles, ch.size))
    need = ex.valid_need
    ch.capacity.settle(need)
    if need > ex.capacity:  # every rank sees this alike: exchange again in frames that fit
        ex2 = ch.tile_exchange(op, ex.k, ch.capacity.current)
        if m == records:
            ex2.copy_local_from(ex, m)
        else:
            m = args.summary(ex2, ex2.capacity)
        ex2.run_again(row, m, n, G.check_tiles, op)
        ex2.passed_tiles(ex2.valid, need)
        ex = ex2
    return ex.result(n, op), ex


def _first_nonfinite(args: TileArgs) -> str:
    """'x[i, j] = nan (global index g = (..))' for the first NaN/Inf among this rank's inputs, or ''
    (then a product or partial sum overflowed from finite inputs)."""
    ys = args.ys if args.ys is not None and args.ys is not args.xs else ()
    for name, group in (("x", args.xs), ("y", ys)):
        for j, a in enumerate(group):
            bad = np.argwhere(~np.isfinite(a))
            if bad.size:
                i = tuple(int(v) for v in bad[0])
                at = tuple(o + v for o, v in zip(args.geo.offset, i))
                flat = int(np.ravel_multi_index(at, args.geo.shape))
                label = name if len(group) == 1 else f"{name}[{j}]"
                return f"{label}[{', '.join(map(str, i))}] = {float(a[i])!r} (global index {flat} = {at})"
    return ""
