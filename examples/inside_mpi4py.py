"""alpha_mpi inside an existing mpi4py program (docs/mpi4py.md): your own messages beside it on the
same communicator, a sub-communicator, a duplicate of yours, freeing them.

    mpiexec -n P python examples/inside_mpi4py.py      # any P from 1 to 8

One declared tree of eight slots (slot s around 1e6**s, so the order of the additions shows in
the bits) is combined on COMM_WORLD, on each half of a Split, and on a Dup of COMM_WORLD: the
same bits everywhere, since the tree, not the group of ranks, fixes the order. Meanwhile each
rank's own receive (any source, any tag) waits on COMM_WORLD: alpha_mpi's frames travel on its
duplicate of the communicator, so that receive gets the user's message and nothing of alpha_mpi.
Every rank checks what it got and the script exits 1 on any difference.
"""

import hashlib
import sys

import numpy as np
from mpi4py import MPI

from alpha_mpi import pairwise
from alpha_mpi.execution import allreduce
from alpha_mpi.model import leaf_sequence

SLOTS = 8


def contribution(slot: int) -> np.ndarray:
    """Slot `slot`'s vector: a function of the slot alone, whichever rank holds it."""
    return np.random.default_rng(slot).standard_normal(1000) * 1e6**slot


def combined(comm: MPI.Comm) -> np.ndarray:
    """The eight slots combined over `comm` (placed on its ranks in contiguous blocks)."""
    tree = pairwise(range(SLOTS), owners=comm.size)
    mine = {leaf.slot: contribution(leaf.slot) for leaf in leaf_sequence(tree) if leaf.owner == comm.rank}
    return allreduce(comm, tree, mine)  # collective over comm: every rank, in the same order


world = MPI.COMM_WORLD
rank, size = world.rank, world.size
problems = []

# 1. Your own traffic on the same communicator: a receive from any source with any tag, posted
# before alpha_mpi's first call on COMM_WORLD (which makes its duplicate) and still pending
# while alpha_mpi combines. It gets the message sent to it below, never an alpha_mpi frame.
got, status = np.zeros(1), MPI.Status()
pending = world.Irecv(got, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
total = combined(world)
world.Send(np.array([float(rank)]), dest=(rank + 1) % size, tag=7)
pending.Wait(status)
if (got[0], status.Get_source(), status.Get_tag()) != ((rank - 1) % size, (rank - 1) % size, 7):
    problems.append(f"the user's receive got {got[0]} from {status.Get_source()} tag {status.Get_tag()}")

# 2. A sub-communicator: the even ranks and the odd ranks, each combining the same tree on its
# own ranks at the same time (each communicator has its own duplicate).
half = world.Split(color=rank % 2, key=rank)
if combined(half).view(np.uint64).tobytes() != total.view(np.uint64).tobytes():
    problems.append(f"the half of {half.size} ranks gave other bits")

# 3. A duplicate of your own is another communicator: alpha_mpi makes it its own duplicate.
mine = world.Dup()
if combined(mine).view(np.uint64).tobytes() != total.view(np.uint64).tobytes():
    problems.append("the Dup of COMM_WORLD gave other bits")

# 4. Free them as usual, on every rank: alpha_mpi's duplicate of each goes with it.
half.Free()
mine.Free()

# Every rank's verdict, gathered (a plain mpi4py collective on your data, not alpha_mpi's).
flags = np.zeros(size, dtype=np.int64)
world.Allgather(np.array([len(problems)], dtype=np.int64), flags)
for p in problems:
    print(f"rank {rank}: {p}", file=sys.stderr)
if rank == 0:
    print(f"thread level provided {MPI.Query_thread()} (MPI_THREAD_SERIALIZED is {MPI.THREAD_SERIALIZED})")
    print(f"ranks {size}  digest {hashlib.sha256(total.tobytes()).hexdigest()[:16]}")
    if not flags.any():
        print("the same bits on COMM_WORLD, each half and a Dup; each user's receive got the user's message")
sys.exit(1 if flags.any() else 0)
