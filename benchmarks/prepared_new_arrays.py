"""New arrays every call against the same arrays: the prepared run's budget (issue 42 item 2).

    mpiexec -n 2 python benchmarks/prepared_new_arrays.py [L] [calls per round] [rounds] [median|best]

Per round, each variant runs `calls` calls back to back after a Barrier, the variants
interleaved; prints on rank 0 the median over rounds (µs per call, max over ranks), or with
`best` the best round (on a loaded machine: many short rounds, `100 200 300 best`, and
`mpiexec -n 1` to see the binding alone, without a peer's scheduling in every call):
    dot same / dot new     arrays.dot(comm, x, y, offset, n) on the same two blocks of L
                           elements every call / on one of 16 other pairs each call
    Allreducer same / new  Allreducer.run({rank: v}) at 8 B, the same v / one of 16
    allreduce same / new   alpha_mpi.allreduce(comm, v) at 8 B, likewise
The budget: "new" costs at most 1 µs more than "same" (median, p = 2).
"""

import sys
import time

import numpy as np
from mpi4py import MPI

import alpha_mpi
from alpha_mpi import arrays, pairwise
from alpha_mpi.execution import Allreducer

comm = MPI.COMM_WORLD
p, r = comm.Get_size(), comm.Get_rank()
L = int(sys.argv[1]) if len(sys.argv) > 1 else 100
N = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 7
STAT = sys.argv[4] if len(sys.argv) > 4 else "median"
if STAT not in ("median", "best"):
    raise SystemExit(f"the statistic is median or best, not {STAT!r}")
n, lo = p * L, r * L
rng = np.random.default_rng(r)
x, y = rng.standard_normal(L), rng.standard_normal(L)
pairs = [(rng.standard_normal(L), rng.standard_normal(L)) for _ in range(16)]
a = Allreducer(comm, pairwise(range(p), p), 1)
v, vs = np.ones(1), [np.ones(1) for _ in range(16)]


def dot_same():
    for _ in range(N):
        arrays.dot(comm, x, y, lo, n)


def dot_new():
    for i in range(N):
        u, w = pairs[i & 15]
        arrays.dot(comm, u, w, lo, n)


def allreducer_same():
    for _ in range(N):
        a.run({r: v})


def allreducer_new():
    for i in range(N):
        a.run({r: vs[i & 15]})


def allreduce_same():
    for _ in range(N):
        alpha_mpi.allreduce(comm, v)


def allreduce_new():
    for i in range(N):
        alpha_mpi.allreduce(comm, vs[i & 15])


variants = (dot_same, dot_new, allreducer_same, allreducer_new, allreduce_same, allreduce_new)
for f in variants:
    f()  # warm: every geometry known
times: dict = {}
for _ in range(ROUNDS):
    for f in variants:
        comm.Barrier()
        t0 = time.perf_counter()
        f()
        times.setdefault(f.__name__, []).append((time.perf_counter() - t0) / N)
pick = np.median if STAT == "median" else np.min
worst = {k: comm.allreduce(float(pick(t)), op=MPI.MAX) for k, t in times.items()}  # harness bookkeeping
if r == 0:
    print(
        f"p={p} L={L} ({STAT} of {ROUNDS} rounds): "
        + ", ".join(f"{k} {t * 1e6:.2f} us" for k, t in worst.items())
    )
    print(
        "new - same: "
        + ", ".join(
            f"{k} {(worst[k + '_new'] - worst[k + '_same']) * 1e6:+.2f} us"
            for k in ("dot", "allreducer", "allreduce")
        )
    )
