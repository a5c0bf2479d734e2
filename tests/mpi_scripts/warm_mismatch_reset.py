"""A job that recovers with reset() after one rank passed another realization to a warm
allreduce() (issue 36 item 8); it must exit 0. Each rank prints `rank R: CODE` for the refused
call, then `rank R: ok` after the reset and a call that gives the sum. Argument: the bound."""

import sys

import numpy as np
from mpi4py import MPI

from alpha_mpi import Refusal, star
from alpha_mpi.execution import allreduce, reset

bound = float(sys.argv[1])
world = MPI.COMM_WORLD
size, rank = world.Get_size(), world.Get_rank()
tree = star(range(size), size)
good = {rank: np.full(4, float(rank + 1))}
allreduce(world, tree, good, realization="tree", timeout=bound)
try:
    allreduce(world, tree, good, realization="replicate" if rank == size - 1 else "tree", timeout=bound)
    code = None
except Refusal as e:
    code = e.code
print(f"rank {rank}: {code}", flush=True)
reset(world)
got = allreduce(world, tree, good, realization="tree", timeout=bound)
if np.array_equal(got, np.full(4, float(size * (size + 1) // 2))):
    print(f"rank {rank}: ok", flush=True)
