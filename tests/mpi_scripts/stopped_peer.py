"""After one combine, the last rank stops (SIGSTOP) or dies (SIGKILL); the others must name it,
and the job must end by itself with a non-zero status (no hang in MPI_Finalize).

argv: stop|kill, timeout seconds. The survivors catch the refusal and exit normally: ending the
job is alpha_mpi's abort-at-exit (or the launcher's, for a dead rank).
"""

import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

from alpha_mpi import pairwise
from alpha_mpi.execution import Allreducer
from alpha_mpi.refusals import Refusal

comm = MPI.COMM_WORLD
how, timeout = sys.argv[1], float(sys.argv[2])
a = Allreducer(comm, pairwise(range(comm.size), comm.size), 16, timeout=timeout)
a.run({comm.rank: np.ones(16)})
if comm.rank == comm.size - 1:
    os.kill(os.getpid(), signal.SIGSTOP if how == "stop" else signal.SIGKILL)
t0 = time.monotonic()
try:
    a.run({comm.rank: np.ones(16)})
    print(f"rank {comm.rank}: completed without its peer", flush=True)
except Refusal as e:
    print(f"rank {comm.rank}: {e.code} after {time.monotonic() - t0:.1f}s", flush=True)
sys.exit(0)
