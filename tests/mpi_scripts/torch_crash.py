"""examples/torch_preempt.py with rank 1 raising after step 2: the job must end in seconds.

mpiexec -n 2 python -m mpi4py tests/mpi_scripts/torch_crash.py          # mpi4py aborts
mpiexec -n 2 python tests/mpi_scripts/torch_crash.py --abort-hook       # abort_on_exception()
"""

import os
import sys

from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))

from torch_preempt import main  # noqa: E402

import alpha_mpi  # noqa: E402


def fail_on_rank_1(step):
    if MPI.COMM_WORLD.Get_rank() == 1 and step == 2:
        raise RuntimeError("rank 1 failed after step 2 (on purpose)")


if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--abort-hook" in argv:
        argv.remove("--abort-hook")
        alpha_mpi.abort_on_exception()
    main(["--steps", "1000", "--log-every", "1", *argv], each_step=fail_on_rank_1)
