"""Rank 1 spends SECONDS in 'evaluation' between two combines; everyone must complete.

Run without ALPHA_MPI_TIMEOUT: the default bound must survive a slow (not dead) peer.
"""

import sys
import time

import numpy as np
from mpi4py import MPI

from alpha_mpi import pairwise
from alpha_mpi.execution import Allreducer

comm = MPI.COMM_WORLD
delay = float(sys.argv[1])
for n in (4, 20000):  # the latency and the bandwidth paths
    a = Allreducer(comm, pairwise(range(comm.size), comm.size), n)
    a.run({comm.rank: np.ones(n)})
    if comm.rank == 1:
        time.sleep(delay)
    got = a.run({comm.rank: np.ones(n)})
    print(f"rank {comm.rank}: {a.realization} n={n} ok={bool(np.all(got == comm.size))}", flush=True)
