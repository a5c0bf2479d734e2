"""arrays.dot in a loop: where the microseconds of one call go (docs/performance.md, issue 33).

    mpiexec -n 2 python benchmarks/arrays_dot_loop.py [L] [calls per round] [rounds]

Per round, the four variants take turns, each `calls` calls back to back after a Barrier:
    dot        arrays.dot(comm, x, y, offset, n), the same arguments every call (the one C call)
    C call     its C call alone: the exchange's prepared run bound to the record's geometry
               (Exchange.run_bound: one an_run), no Python around it but the loop
    ordinary   arrays.dot(..., timeout=300.0): the ordinary path, every check in Python
    mpi        send[0] = np.dot(x, y); comm.Allreduce(send, recv)
Prints, on rank 0, the best round of each (µs per call, max over ranks) and the ratios to mpi.
"""

import sys
import time

import numpy as np
from mpi4py import MPI

from alpha_mpi import arrays
from alpha_mpi.arrays import fast

comm = MPI.COMM_WORLD
p, r = comm.Get_size(), comm.Get_rank()
L = int(sys.argv[1]) if len(sys.argv) > 1 else 100
N = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 7
rng = np.random.default_rng(r)
x, y = rng.standard_normal(L), rng.standard_normal(L)
n, lo = p * L, r * L
for _ in range(50):
    arrays.dot(comm, x, y, lo, n)
c = fast.lookup(comm, "dot", x, y, lo, n)
assert c is not None, "the call is not remembered"
ch = c.ch
send, recv = np.zeros(1), np.zeros(1)


def t_dot():
    for _ in range(N):
        arrays.dot(comm, x, y, lo, n)


def t_c():
    for _ in range(N):
        c.ex.run_bound(ch.step, c.words)
        ch.step += 1


def t_ordinary():
    for _ in range(N):
        arrays.dot(comm, x, y, lo, n, timeout=300.0)


def t_mpi():
    for _ in range(N):
        send[0] = np.dot(x, y)
        comm.Allreduce(send, recv)


best: dict = {}
for _ in range(ROUNDS):
    for name, f in (("dot", t_dot), ("C call", t_c), ("ordinary", t_ordinary), ("mpi", t_mpi)):
        comm.Barrier()
        t0 = time.perf_counter()
        f()
        best[name] = min(best.get(name, np.inf), (time.perf_counter() - t0) / N)
worst = {k: comm.allreduce(v, op=MPI.MAX) for k, v in best.items()}  # harness bookkeeping
if r == 0:
    cells = ", ".join(f"{k} {v * 1e6:.2f} us" for k, v in worst.items())
    print(
        f"p={p} L={L}: {cells}; dot/mpi {worst['dot'] / worst['mpi']:.2f}, "
        f"ordinary/mpi {worst['ordinary'] / worst['mpi']:.2f}"
    )
