"""The README's example: an allreduce by a declared tree, the same bits on every rank count.

    mpiexec -n P python examples/quickstart.py      # any P from 1 to 8

Eight logical slots, each a vector of 1000 float64 values at its own scale (slot s around 1e6**s,
so the order of the additions shows in the bits), placed on the ranks in contiguous blocks.
Rank 0 prints the realization `auto` chose and a digest of the result: one digest on every P.
"""

import hashlib

import numpy as np
from mpi4py import MPI

from alpha_mpi import pairwise
from alpha_mpi.execution import Allreducer

comm = MPI.COMM_WORLD
tree = pairwise(range(8), owners=comm.size)  # 8 logical slots, placed in contiguous blocks
a = Allreducer(comm, tree, 1000)  # 1000 float64 per slot; realization "auto"
mine = {s: np.random.default_rng(s).standard_normal(1000) * 1e6**s for s in a.slots}
total = a.run(mine)  # the combined vector, on every rank
if comm.rank == 0:
    print(a.describe().splitlines()[0])
    print(f"ranks {comm.size}  digest {hashlib.sha256(total.tobytes()).hexdigest()[:16]}")
