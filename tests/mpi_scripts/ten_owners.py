"""Ten owners: the hierarchy run matches the hierarchy oracle and not the star oracle."""

import sys

import numpy as np
from mpi4py import MPI

from alpha_mpi import hierarchy, oracle, plan, star
from alpha_mpi.execution import combine

comm = MPI.COMM_WORLD
rng = np.random.default_rng(10)
n = 2048
data = {
    s: (1.0 + rng.random(n)) * np.exp2(rng.integers(-60, 61, n)) * np.where(rng.random(n) < 0.5, -1, 1)
    for s in range(10)
}
h, s = hierarchy(range(10), comm.size, 2), star(range(10), comm.size)
lists = {k: v.tolist() for k, v in data.items()}
want_h = np.array(oracle.evaluate(h, lists)).view(np.uint64)
want_s = np.array(oracle.evaluate(s, lists)).view(np.uint64)
observable = not np.array_equal(want_h, want_s)
results = {}
for name, tree in (("hierarchy", h), ("star", s)):
    p = plan(tree, None, n, size=comm.size)
    got = combine(comm, p, {k: data[k] for k in p.slots_of(comm.rank)}).view(np.uint64)
    results[name] = (np.array_equal(got, want_h), np.array_equal(got, want_s))
# One write per line: print() may write the text and the newline separately, and ten ranks share a pipe.
sys.stdout.write(
    f"rank {comm.rank} observable={observable} hierarchy_run={results['hierarchy']} star_run={results['star']}\n"
)
sys.stdout.flush()
