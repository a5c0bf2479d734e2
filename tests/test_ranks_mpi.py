"""Any rank count under pytest-mpi (`mpiexec -n N python -m pytest --with-mpi`, any N): every
realization of pairwise trees, one slot per rank and blocks of 4 slots per rank, in both modes,
gives the independent oracle's bits on every rank (any_rank_cases.py); a failure on any rank
fails on all."""

import pytest
from any_rank_cases import run_cases

from conftest import agree


@pytest.mark.mpi(min_size=1)
def test_every_realization_of_pairwise_trees_matches_the_oracle_at_this_size(world):
    bad, cases, butterflies = run_cases(world)
    # The butterflies apply at every size here: 3 of the 7 cases per layout and slot count.
    agree(world, not bad and cases == 28 and butterflies == 12, f"{bad[:3]} {cases} {butterflies}")
