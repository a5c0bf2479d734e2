"""`alpha-mpi bench dot`'s N-d tile rows (part 1b; dot_bench.py has the command and the table).

For each global shape and every process grid of p ranks in its dimensions, each rank's
row-major (Create_cart) tile, held contiguous as a solver holds it: arrays.dot against
np.dot(x.ravel(), y.ravel()) + MPI_Allreduce, interleaved and Barrier-separated, with the size
of what the exchange carries (the largest tile summary, the largest frame). Bits: every result
equal to the first, which equals the whole tree over the global arrays (rank 0).
"""

from __future__ import annotations

import numpy as np

from ... import arrays
from ...arrays import local, tiles
from ...planning.array_program import HEAD_WORDS, rounds, rows_in_round
from .harness import statistic, timed

FRAME_HEADER = 128  # bytes of the frame header (execution/frames.py)
TILE_COLUMNS = "shape grid tile records frame_kB=frame_kb alpha_us=t_alpha MPI_us=t_mpi ratio bits"


def _bits(v) -> int:
    return int(np.float64(v).view(np.uint64))


def process_grids(p: int, ndim: int) -> list:
    """Every grid of p processes in ndim dimensions, as Create_cart would take it (2x1, 1x2, ...)."""
    out = [()]
    for _ in range(ndim):
        out = [g + (d,) for g in out for d in range(p, 0, -1)]
    return [g for g in out if int(np.prod(g)) == p]


def _tile_of(shape, dims, rank):
    """(offset, extent) of `rank`'s tile: row-major grid coordinates, even cuts."""
    coords = np.unravel_index(rank, dims)
    lo = [s * c // d for s, c, d in zip(shape, coords, dims)]
    hi = [s * (c + 1) // d for s, c, d in zip(shape, coords, dims)]
    return tuple(lo), tuple(b - a for a, b in zip(lo, hi))


def _frame_bytes(p: int, capacity: int, k: int) -> int:
    """The largest frame of the tile exchange on p ranks with `capacity` records of k values."""
    rows = max((rows_in_round(p, i) for i in range(rounds(p))), default=1)
    words = HEAD_WORDS + tiles.ROW_WORDS * rows + capacity * (2 + k)
    return FRAME_HEADER + 8 * words


def tile_calls(comm, args, mpi_dots) -> tuple:
    """Part 1b: per shape (args.tiles) and process grid, arrays.dot of the tiles against
    np.dot + Allreduce (`mpi_dots(comm, pairs)`: dot_bench's reference); (rows, failed)."""
    from ...arrays.api import _channel

    p, r = comm.Get_size(), comm.Get_rank()
    rows, failed = [], False
    for shape in args.tiles:
        rng = np.random.default_rng(20_240_601 + sum(shape))
        gx, gy = rng.standard_normal(shape), rng.standard_normal(shape)  # the same on every rank
        whole = _bits(local.tree_value(gx.ravel(), gy.ravel())) if r == 0 else 0
        for dims in process_grids(p, len(shape)):
            offset, extent = _tile_of(shape, dims, r)
            cut = tuple(slice(o, o + e) for o, e in zip(offset, extent))
            x, y = np.ascontiguousarray(gx[cut]), np.ascontiguousarray(gy[cut])  # a solver's tile
            calls = {
                "t_alpha": lambda x=x, y=y, o=offset, s=shape: arrays.dot(comm, x, y, o, s),
                "t_mpi": mpi_dots(comm, [(x.ravel(), y.ravel())]),
            }
            first = arrays.dot(comm, x, y, offset, shape)
            per_rank = int(np.prod(shape)) // p  # the same on every rank (tile sizes differ)
            iters = max(args.min_iters, int(args.iters * 10**4 / max(1, per_rank)))
            times = {k: [] for k in calls}
            same = True
            for it in range(args.warmup + iters):
                for k, fn in calls.items():
                    dt, got = timed(comm, fn)
                    if it >= args.warmup:
                        times[k].append(dt)
                    if k == "t_alpha":
                        same &= _bits(got) == _bits(first)
            records = local.tile_records(offset, shape, extent)
            capacity = _channel(comm).capacity.current
            mine = np.array([statistic(times[k], args.stat) for k in calls] + [float(same), records])
            everyone = np.zeros((p, mine.size)) if r == 0 else None
            comm.Gather(mine, everyone, root=0)  # harness bookkeeping (timings), not reduced data
            if r == 0:
                worst = dict(zip(calls, everyone.max(axis=0)))
                ok = bool(everyone[:, -2].all()) and _bits(first) == whole
                failed |= not ok
                rows.append(
                    {
                        "shape": "x".join(map(str, shape)),
                        "grid": "x".join(map(str, dims)),
                        "tile": "x".join(map(str, extent)),
                        "records": int(everyone[:, -1].max()),
                        "frame_kb": _frame_bytes(p, capacity, 1) / 1e3,
                        **worst,
                        "ratio": worst["t_alpha"] / worst["t_mpi"],
                        "bits": "ok" if ok else "WRONG",
                    }
                )
    return rows, failed
