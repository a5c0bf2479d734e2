"""A 2-D tile dot against the same data as a 1-D block (issue 42: target tile <= 1.1x block).

    mpiexec -n 2 python benchmarks/tile_dot_ab.py [side] [calls per round] [rounds]

The global field is side x side, cut in p row bands (grid p x 1: each tile is contiguous rows)
and in p column bands (grid 1 x p: each tile is `side` strided row segments). Per round the
variants take turns, each `calls` calls back to back after a Barrier, with NEW arrays every call
(a copy of the rank's data made outside the timing, as a solver's `q = A(p)` makes them):
    block      arrays.dot(comm, x1, y1, offset, n): the tile's data as one 1-D block
    rows tile  arrays.dot(comm, x, y, (r0, 0), (side, side)) of the row band
    cols tile  arrays.dot(comm, x, y, (0, c0), (side, side)) of the column band
    mpi        np.dot + comm.Allreduce into a preallocated 1-element buffer
Only the public API: it runs on any version. Prints on rank 0 the median over rounds of each
(us per call, max over ranks) and the ratios tile / block.
"""

import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

from alpha_mpi import arrays

comm = MPI.COMM_WORLD
p, r = comm.Get_size(), comm.Get_rank()
SIDE = int(sys.argv[1]) if len(sys.argv) > 1 else 128
N = int(sys.argv[2]) if len(sys.argv) > 2 else 500
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 7
rng = np.random.default_rng(7)
g, h = rng.standard_normal((SIDE, SIDE)), rng.standard_normal((SIDE, SIDE))
r0, r1 = SIDE * r // p, SIDE * (r + 1) // p
rows = (g[r0:r1].copy(), h[r0:r1].copy())
cols = (g[:, r0:r1].copy(), h[:, r0:r1].copy())
flat = (rows[0].ravel().copy(), rows[1].ravel().copy())
shape = (SIDE, SIDE)
send, recv = np.zeros(1), np.zeros(1)
POOL = 4  # new arrays every call: copies made ahead, cycled (no two calls in a row share one)


def fresh(pair):
    return [(pair[0].copy(), pair[1].copy()) for _ in range(POOL)]


def t_block(pool):
    for i in range(N):
        x, y = pool[i % POOL]
        arrays.dot(comm, x, y, r0 * SIDE, SIDE * SIDE)


def t_rows(pool):
    for i in range(N):
        x, y = pool[i % POOL]
        arrays.dot(comm, x, y, (r0, 0), shape)


def t_cols(pool):
    for i in range(N):
        x, y = pool[i % POOL]
        arrays.dot(comm, x, y, (0, r0), shape)


def t_mpi(pool):
    for i in range(N):
        x, y = pool[i % POOL]
        send[0] = np.dot(x, y)
        comm.Allreduce(send, recv)


variants = (
    ("block", t_block, flat),
    ("rows tile", t_rows, rows),
    ("cols tile", t_cols, cols),
    ("mpi", t_mpi, flat),
)
times: dict = {name: [] for name, _, _ in variants}
for _name, f, data in variants:  # warm: every geometry remembered, every frame grown
    f(fresh(data))
for _ in range(ROUNDS):
    for name, f, data in variants:
        pool = fresh(data)
        comm.Barrier()
        t0 = time.perf_counter()
        f(pool)
        times[name].append((time.perf_counter() - t0) / N)
med = {k: comm.allreduce(statistics.median(v), op=MPI.MAX) for k, v in times.items()}  # harness bookkeeping
if r == 0:
    cells = ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in med.items())
    print(
        f"p={p} {SIDE}x{SIDE}: {cells}; rows/block {med['rows tile'] / med['block']:.2f}, "
        f"cols/block {med['cols tile'] / med['block']:.2f}, block/mpi {med['block'] / med['mpi']:.2f}"
    )
