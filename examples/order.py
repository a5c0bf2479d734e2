"""The order problem in one run: sum the same 16 contributions on any number of ranks.

    mpiexec -n P python examples/order.py

Each of 16 logical contributions (slots) is a vector of 100,000 float64 values spread over many
binades. `MPI_Allreduce` of each rank's partial sum gives other bits on other rank counts (the
rank count changes the order of the additions); alpha_mpi's allreduce by the declared `pairwise`
tree over the 16 slots gives one digest on every rank count from 1 to 16. Rank 0 prints one
digest line for each.
"""

import hashlib

import numpy as np
from mpi4py import MPI

from alpha_mpi import pairwise
from alpha_mpi.execution import allreduce
from alpha_mpi.model import leaf_sequence

SLOTS, N = 16, 100_000


def contribution(slot):
    """Slot `slot`'s vector: a function of the slot alone, whichever rank holds it."""
    rng = np.random.default_rng(slot)
    return rng.standard_normal(N) * np.exp2(rng.integers(-40, 41, N))


def digest(x):
    return hashlib.sha256(np.ascontiguousarray(x, dtype=np.float64).tobytes()).hexdigest()[:16]


comm = MPI.COMM_WORLD
tree = pairwise(range(SLOTS), owners=comm.size)  # 16 slots placed in contiguous blocks
mine = {leaf.slot: contribution(leaf.slot) for leaf in leaf_sequence(tree) if leaf.owner == comm.rank}

# MPI: each rank adds its slots, then MPI_Allreduce adds the ranks' sums in an order of its own.
local = np.zeros(N)
for vector in mine.values():
    local += vector
mpi = np.empty(N)
comm.Allreduce(local, mpi, op=MPI.SUM)

ordered = allreduce(comm, tree, mine)  # the declared tree's order, on every rank count

if comm.rank == 0:
    print(f"ranks {comm.size:2d}  MPI_Allreduce {digest(mpi)}  alpha_mpi {digest(ordered)}")
