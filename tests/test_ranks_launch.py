"""Any rank count over MPI, from launched jobs: at 3 and 6 ranks (not powers of two) every
realization of pairwise trees — butterfly and halving included — gives the oracle's bits on
every rank (any_rank_cases.py), and the learners give the one-rank run's digest (8 slots, so the
slot blocks are uneven at 6 ranks) in every partition mode.

Each launch runs under a hard `timeout`, so a hang fails the test instead of the suite.
"""

import os
import re

import pytest

from conftest import needs_mpiexec, printed_digest, run_mpi

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = needs_mpiexec


@pytest.mark.parametrize("ranks", [3, 6])
def test_every_realization_of_pairwise_trees_matches_the_oracle(ranks):
    r, _ = run_mpi(ranks, os.path.join(HERE, "mpi_scripts", "any_rank_count.py"), limit=400)
    assert r.returncode == 0, r.stdout + r.stderr
    verdicts = re.findall(r"^rank (\d+) ok=(\w+) cases=(\d+) butterflies=(\d+)", r.stdout, re.M)
    assert sorted(int(v[0]) for v in verdicts) == list(range(ranks)), r.stdout
    assert all(v[1] == "True" for v in verdicts), r.stdout
    # 2 layouts x 2 slot counts x (5 allreduce + 2 reduce-scatter), the butterflies 3 of each.
    assert {(v[2], v[3]) for v in verdicts} == {("28", "12")}, r.stdout


def _digest(ranks, partition="none"):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    r, _ = run_mpi(
        ranks, "-m", "alpha_mpi", "train", "--steps", "50", "--partition", partition, limit=400, env=env
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return printed_digest(r.stdout)


@pytest.fixture(scope="module")
def one_rank_digest():
    return _digest(1)


@pytest.mark.parametrize("partition", ["none", "state", "grads", "params"])
@pytest.mark.parametrize("ranks", [3, 6])
def test_the_learner_gives_the_one_rank_digest(one_rank_digest, ranks, partition):
    assert _digest(ranks, partition) == one_rank_digest
