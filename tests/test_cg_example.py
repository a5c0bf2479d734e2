"""examples/cg.py: the residual history digest of CG with alpha_mpi.arrays.dot is the same on
1, 2, 3, 4 and 5 ranks (uneven row blocks), while the comm.Allreduce version's is not.

Launches its own mpiexec per rank count, each under a hard `timeout`."""

import os
import re

from conftest import needs_mpiexec, run_mpi

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


pytestmark = needs_mpiexec


def run_cg(p, *args):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    r, _ = run_mpi(p, os.path.join(ROOT, "examples", "cg.py"), *args, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    found = dict(re.findall(r"reduce=(\w+) iterations=\d+ residual=\S+ digest=([0-9a-f]{16})", r.stdout))
    assert set(found) == {"alpha", "mpi"}, r.stdout
    return found, r.stdout


def test_cg_digest_is_the_same_on_every_rank_count():
    runs = {p: run_cg(p, "--grid", "40") for p in (1, 2, 3, 4, 5)}
    alpha = {p: d["alpha"] for p, (d, _) in runs.items()}
    mpi = {p: d["mpi"] for p, (d, _) in runs.items()}
    shown = "\n".join(out for _, out in runs.values())
    assert len(set(alpha.values())) == 1, f"alpha digests differ across rank counts: {alpha}\n{shown}"
    # The point of the example: the usual Allreduce of partial dots depends on the cuts.
    assert len(set(mpi.values())) > 1, f"the data must make the Allreduce order visible: {mpi}\n{shown}"
    rows = [int(v) for v in re.search(r"grid rows per rank \[([0-9, ]+)\]", runs[5][1]).group(1).split(",")]
    assert sum(rows) == 40 and len(set(rows)) > 1, f"the blocks must be uneven: {rows}"
