"""Tilings and data for the N-d tile tests (test_arrays_tiles.py, test_arrays_tiles_mpi.py).

A tiling here is a list of boxes (offset, extent), one per rank, in rank order. Cartesian ones
come from cuts per dimension (uneven, empty pieces allowed) and a row-major (Create_cart)
numbering of the grid of boxes; `shuffled` hands the boxes to ranks in another order.
"""

import itertools

import numpy as np

from conftest import order_sensitive

#: Awkward global shapes (no dimension a power of two) and two with aligned rows.
SHAPES = [(37, 53), (7, 9, 11), (64, 32), (5, 4, 3, 2)]


def global_data(shape, seed=0):
    """x, y over the global shape: values whose sum changes with the order (conftest)."""
    rng = np.random.default_rng(1009 * seed + sum(shape))
    n = int(np.prod(shape))
    return order_sensitive(rng, n).reshape(shape), order_sensitive(rng, n).reshape(shape)


def even_cuts(size: int, parts: int) -> list:
    return [size * i // parts for i in range(parts + 1)]


def uneven_cuts(size: int, parts: int, rng) -> list:
    """parts + 1 cut points 0 = c0 <= ... <= c_parts = size (empty pieces allowed)."""
    inner = sorted(rng.integers(0, size + 1, parts - 1).tolist())
    return [0, *inner, size]


def cartesian(cuts) -> list:
    """Boxes (offset, extent) of the grid of `cuts` (one list per dimension), row-major: the
    rank of grid coordinates (c0, c1, ...) is that of MPI's Create_cart."""
    pieces = [list(zip(c, c[1:])) for c in cuts]
    return [(tuple(a for a, _ in box), tuple(b - a for a, b in box)) for box in itertools.product(*pieces)]


def process_grids(p: int, ndim: int) -> list:
    """Every grid of p processes in ndim dimensions (dims with product p: 2x1, 1x2, ...)."""
    return [d for d in itertools.product(range(1, p + 1), repeat=ndim) if int(np.prod(d)) == p]


def tilings(shape, p: int, rng, uneven: int = 1) -> list:
    """Cartesian tilings of `shape` on p ranks: even cuts on every process grid, and `uneven`
    draws of uneven cuts per grid."""
    out = []
    for dims in process_grids(p, len(shape)):
        out.append(cartesian([even_cuts(s, d) for s, d in zip(shape, dims)]))
        for _ in range(uneven):
            out.append(cartesian([uneven_cuts(s, d, rng) for s, d in zip(shape, dims)]))
    return out


def block(g, box):
    """The tile of the global array g at box = (offset, extent): a view."""
    offset, extent = box
    return g[tuple(slice(o, o + e) for o, e in zip(offset, extent))]


def with_halo(tile):
    """A copy of `tile` inside an array with one ghost cell on every side, returned as the
    interior view (strided, not contiguous where the tile has more than one row)."""
    padded = np.full(tuple(s + 2 for s in tile.shape), np.nan)
    interior = tuple(slice(1, s + 1) for s in tile.shape)
    padded[interior] = tile
    return padded[interior]


def oracle_values(g, h, oracle_sum, oracle_dot, oracle_norm2) -> dict:
    """The oracle's values over the flattened (C-order) global arrays."""
    xf, yf = g.ravel().tolist(), h.ravel().tolist()
    return {
        "sum": oracle_sum(xf),
        "dot": oracle_dot(xf, yf),
        "norm2": oracle_norm2(xf),
        "dotyy": oracle_dot(yf, yf),
    }
