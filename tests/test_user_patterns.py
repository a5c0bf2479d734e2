"""benchmarks/user_patterns.py --quick: its programs' digests, not its timings (issue 42).

The benchmark runs users' programs (1-D and 3-D CG, a tile dot, a mixed loop of Allreducers and
allreduce() forms, a Newton-Krylov mini-app) with alpha_mpi and with MPI_Allreduce. In --quick
mode the problems are fixed global ones, so the alpha digests must be the same on 1 and 2
ranks (2-D and 3-D tiles cut differently); the script itself checks that each digest repeats,
that the tile dot has the 1-D block's bits and every allreduce() form the Allreducer's (exit 1
otherwise); and the 1-D CG's digest is recomputed here with the independent oracle's dot.

Launches its own mpiexec per rank count, each under a hard `timeout`."""

import json
import os

import numpy as np
from array_oracle import oracle_dot

from conftest import needs_mpiexec, run_mpi

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "user_patterns.py")

pytestmark = needs_mpiexec


def run_quick(p, tmp_path) -> dict:
    out = tmp_path / f"quick{p}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    r, _ = run_mpi(p, SCRIPT, "--quick", "--json", out, env=env, cwd=ROOT, limit=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert all(w["checks"] == "ok" for w in rows), r.stdout
    return {w["program"]: w["digest"] for w in rows}


def oracle_cg1d(n: int, iters: int) -> str:
    """cg1d of the benchmark on one array, every dot by the oracle (plain Python floats)."""
    import hashlib

    i = np.arange(0, n, dtype=np.float64)
    b = np.sin(0.37 * i) + 0.01 * np.cos(3.1 * i)

    def A(v):
        w = np.concatenate(([0.0], v, [0.0]))
        return 2.0 * w[1:-1] - w[:-2] - w[2:]

    x, r = np.zeros(n), b.copy()
    p = r.copy()
    rr = oracle_dot(r, r)
    history = [rr]
    for _ in range(iters):
        q = A(p)
        a = rr / oracle_dot(p, q)
        x = x + a * p
        r = r - a * q
        rr_new = oracle_dot(r, r)
        p = r + (rr_new / rr) * p
        rr = rr_new
        history.append(rr)
    return hashlib.sha256(np.asarray(history, dtype=np.float64).tobytes()).hexdigest()


def test_the_quick_programs_give_the_same_bits_on_1_and_2_ranks_and_the_oracles(tmp_path):
    one, two = run_quick(1, tmp_path), run_quick(2, tmp_path)
    for name in ("cg1d 1000", "cg3d 6", "newton 12"):
        assert one[name] == two[name], f"{name}: the alpha digest depends on the rank count"
        assert len(one[name]) == 64
    assert two["cg1d 1000"] == oracle_cg1d(1000, 10)
    assert "mixed: allreduce(comm, x)" in two and "tile 16" in two
