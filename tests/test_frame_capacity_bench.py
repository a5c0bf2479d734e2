"""benchmarks/frame_capacity.py runs and checks itself (not its timings): on two ranks, frames
kept at the 1-D bound and frames that follow the rows give the same bits for the same data, and
the latter end smaller, for a 1-D block and a 2-D tile. Launches its own mpiexec under a hard
`timeout`."""

import os

from conftest import needs_mpiexec, run_mpi

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "frame_capacity.py")

pytestmark = needs_mpiexec


def test_the_frame_capacity_benchmark_checks_its_bits_and_its_frames():
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    r, _ = run_mpi(2, SCRIPT, "400", "2", "20", env=env, cwd=ROOT, limit=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [line for line in r.stdout.splitlines() if line.startswith("p=2 ")]
    assert len(lines) == 2 and all("of 132 records" in line for line in lines), r.stdout
