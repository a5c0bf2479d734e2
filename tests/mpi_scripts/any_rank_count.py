"""Every realization of pairwise trees on this many ranks against the oracle (any_rank_cases.py).
Prints one verdict line per rank: `rank R ok=True cases=N butterflies=K [what failed]`."""

import os
import sys

from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from any_rank_cases import run_cases  # noqa: E402

bad, cases, butterflies = run_cases(MPI.COMM_WORLD)
sys.stdout.write(
    f"rank {MPI.COMM_WORLD.rank} ok={not bad} cases={cases} butterflies={butterflies} {bad[:3]}\n"
)
sys.stdout.flush()
