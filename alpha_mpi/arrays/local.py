"""The local half, without MPI: summaries of blocks and their merge, over the C kernel.

The exchange (alpha_mpi.arrays.exchange) calls the kernel directly into its frames; these
wrappers allocate and are for tests, benchmarks and anyone who wants to see a summary:

    >>> s = summary([x], None, offset=3, n=10)       # records of the block [3, 3 + len(x))
    >>> merge(s, summary([z], None, 0, 10), 10).root()  # when the two blocks cover [0, 10)
"""

from __future__ import annotations

import numpy as np

from ..kernel import ffi, lib
from ..refusals import KernelRefusal
from . import pairwise

__all__ = ["Summary", "summary", "merge", "tree_value", "tile_summary", "tile_records"]

_DARR = ffi.typeof("double[]")
_CA = ("C", "A")  # C-contiguous and 8-byte aligned: the kernel reads `double *`


class Summary:
    """Records (lo, hi, values[k]) of the maximal nodes of the tree over [0, n) that a set of
    blocks covers, sorted by lo."""

    __slots__ = ("words", "count", "k", "n")

    def __init__(self, words: np.ndarray, count: int, k: int, n: int):
        self.words, self.count, self.k, self.n = words, count, k, n

    def ranges(self) -> list:
        w = self.words[: self.count * (2 + self.k)].reshape(self.count, 2 + self.k)
        return [(int(a), int(b)) for a, b in w[:, :2]]

    def values(self) -> np.ndarray:
        """(count, k) float64 values of the records."""
        w = self.words[: self.count * (2 + self.k)].reshape(self.count, 2 + self.k)
        return np.ascontiguousarray(w[:, 2:]).view(np.float64)

    def root(self) -> list:
        """The k values of [0, n) (refused unless this summary is exactly the root)."""
        if self.n == 0 and self.count == 0:
            return [0.0] * self.k
        if self.ranges() != [(0, self.n)]:
            raise KernelRefusal(
                "kernel-bad-argument", f"the summary covers {self.ranges()}, not [0, {self.n})"
            )
        return self.values()[0].tolist()


def _check(status: int, what: str) -> int:
    if status >= 0:
        return status
    why = {
        lib.AP_ERR_OVERFLOW: "more nodes than the capacity",
        lib.AP_ERR_INVALID: "partially overlapping nodes",
        lib.AP_ERR_BAD_ARGUMENT: "arguments out of range",
    }.get(status, f"status {status}")
    raise KernelRefusal("kernel-bad-argument", f"{what}: {why}")


def summary(xs, ys, offset: int, n: int, capacity: int = pairwise.CAPACITY) -> Summary:
    """The summary of the block [offset, offset + len(xs[0])): k = len(xs) values per record,
    sums of xs[j] (ys None) or dots of xs[j] with ys[j]."""
    k = len(xs)
    xs = [np.require(a, np.float64, _CA) for a in xs]
    held = [ffi.from_buffer(_DARR, a) for a in xs]
    px = ffi.new("double *[]", held)
    py = ffi.NULL
    if ys is not None:
        ys = [np.require(a, np.float64, _CA) for a in ys]
        held_y = [ffi.from_buffer(_DARR, a) for a in ys]
        py = ffi.new("double *[]", held_y)
    words = np.zeros(capacity * (2 + k), dtype=np.int64)
    nf = ffi.new("int32_t *")
    m = lib.ap_summary(
        px, py, k, offset, len(xs[0]), n, ffi.from_buffer("int64_t[]", words, True), capacity, nf
    )
    return Summary(words, _check(m, "summary"), k, n)


def merge(a: Summary, b: Summary, n: int, capacity: int = pairwise.CAPACITY) -> Summary:
    """The union of two summaries with siblings joined (ap_merge)."""
    k = a.k
    out = np.zeros(capacity * (2 + k), dtype=np.int64)
    m = lib.ap_merge(
        ffi.from_buffer("int64_t[]", a.words),
        a.count,
        ffi.from_buffer("int64_t[]", b.words),
        b.count,
        ffi.from_buffer("int64_t[]", out, True),
        capacity,
        n,
        k,
    )
    return Summary(out, _check(m, "merge"), k, n)


def tree_value(x, y=None, n=None) -> float:
    """The whole tree over one array (one rank holding everything): the local kernel alone."""
    x = np.require(x, np.float64, _CA)
    n = x.shape[0] if n is None else n
    if n == 0:
        return 0.0
    v = ffi.new("double *")
    py = ffi.from_buffer(_DARR, np.require(y, np.float64, _CA)) if y is not None else ffi.NULL
    _check(lib.ap_node_value(ffi.from_buffer(_DARR, x), py, 0, n, n, v), "tree_value")
    return v[0]


class _Target:
    """Where TileArgs.summary writes: an Exchange's kernel arguments, here for a bare buffer."""

    def __init__(self, k: int, words: np.ndarray):
        self.k = k
        self.xs_ptrs, self.ys_ptrs = ffi.new("double *[]", k), ffi.new("double *[]", k)
        self.scratch = ffi.new("double *[]", 2 * k)
        self.nonfinite = ffi.new("int32_t *")
        self.room = ffi.new("int64_t *")
        self.state0 = ffi.from_buffer("int64_t[]", words, True)


def tile_summary(xs, ys, offset, shape, capacity: int | None = None) -> Summary:
    """The summary of an N-d tile (xs[j], ys[j]: its blocks, any strides) at `offset` of the
    C-order global `shape`: the records of the flattened tree's maximal nodes inside it
    (`capacity`: records room, by default exactly the tile's record count)."""
    from .tile_call import tile_inputs  # the API's checks and kernel arguments (no MPI)

    args = tile_inputs(
        "tile_summary", list(xs), None if ys is None else list(ys), tuple(offset), tuple(shape)
    )
    k = len(args.xs)
    if capacity is None:
        room = ffi.new("int64_t *")
        _check(args.records(room), "tile records")
        capacity = int(room[0])
    words = np.zeros(max(1, capacity) * (2 + k), dtype=np.int64)
    m = args.summary(_Target(k, words), capacity)
    return Summary(words, _check(m, "tile summary"), k, args.geo.n)


def tile_records(offset, shape, extent) -> int:
    """The record count of the summary of the tile of `extent` at `offset` of `shape`."""
    d = len(shape)
    g = ffi.new("int64_t[]", [*shape, *offset, *extent])
    return _check(lib.ap_tile_records(d, g, g + d, g + 2 * d, ffi.NULL, 0, ffi.NULL), "tile records")
