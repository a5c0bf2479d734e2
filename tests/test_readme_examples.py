"""The README's two examples say what they print: examples/order.py shows MPI_Allreduce's bits
changing with the rank count while alpha_mpi's stay, and examples/quickstart.py prints one
digest on every rank count, a digest the left-to-right order does not give.

Single-process tests: they launch their own `mpiexec` jobs (conftest.run_example)."""

import hashlib
import re

import numpy as np

from conftest import needs_mpiexec, run_example

pytestmark = needs_mpiexec


def _order(n):
    out = run_example(n, ["order.py"], limit=180)
    m = re.search(rf"^ranks +{n}  MPI_Allreduce ([0-9a-f]{{16}})  alpha_mpi ([0-9a-f]{{16}})$", out, re.M)
    assert m, out
    return m.group(1), m.group(2)


def test_order_example_mpi_bits_change_with_the_rank_count_alpha_bits_do_not():
    runs = {n: _order(n) for n in (1, 2, 3)}
    assert len({alpha for _, alpha in runs.values()}) == 1, runs
    assert len({mpi for mpi, _ in runs.values()}) > 1, runs  # the data makes the order visible


def _quick(n):
    out = run_example(n, ["quickstart.py"], limit=180)
    m = re.search(rf"^ranks {n}  digest ([0-9a-f]{{16}})$", out, re.M)
    assert m and out.startswith("realization "), out
    return m.group(1)


def test_quickstart_prints_one_digest_on_every_rank_count_and_the_order_shows():
    digests = {n: _quick(n) for n in (1, 2, 3)}
    assert len(set(digests.values())) == 1, digests
    # The same eight vectors added left to right give other bits: the declared order is visible.
    vectors = [np.random.default_rng(s).standard_normal(1000) * 1e6**s for s in range(8)]
    chain = vectors[0].copy()
    for v in vectors[1:]:
        chain = chain + v
    assert hashlib.sha256(chain.tobytes()).hexdigest()[:16] != digests[1]
