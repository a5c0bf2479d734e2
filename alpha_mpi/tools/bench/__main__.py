"""`python -m alpha_mpi.tools.bench COMMAND [options]` (under mpiexec): the same as
`alpha-mpi bench COMMAND [options]`, including its handling of refusals (exit 3, and the whole
job aborted so that no rank waits for a peer that is gone)."""

import sys

from ...cli import main

if __name__ == "__main__":
    sys.exit(main(["bench"] + sys.argv[1:]))
