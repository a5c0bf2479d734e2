"""Rank 2 leaves mid-job (finalizes and exits between combines); its peers must not hang.

Each surviving rank prints its refusal code and aborts the job with exit status 3.
"""

import os
import sys
import time

import numpy as np
from mpi4py import MPI

from alpha_mpi import plan, star
from alpha_mpi.execution import Combiner
from alpha_mpi.refusals import Refusal

comm = MPI.COMM_WORLD
timeout = float(sys.argv[1])
p = plan(star(range(comm.size), comm.size), None, 8, size=comm.size)
c = Combiner(comm, p, timeout=timeout)
mine = {s: np.ones(8) for s in p.slots_of(comm.rank)}
c.run(mine)
if comm.rank == 2:
    sys.exit(0)
t0 = time.monotonic()
try:
    c.run(mine)
except Refusal as e:
    sys.stdout.write(f"rank {comm.rank}: {e.code} after {time.monotonic() - t0:.2f}s\n")
    sys.stdout.flush()
    time.sleep(0.5)  # let every survivor report before the abort tears the job down
    comm.Abort(3)
    os._exit(3)  # MPICH's MPI_Abort may return to the caller while the launcher tears down
print(f"rank {comm.rank}: completed without its peer", flush=True)
