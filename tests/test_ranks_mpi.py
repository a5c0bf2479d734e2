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


@pytest.mark.mpi(min_size=2)
def test_butterfly_and_halving_of_large_payloads_complete_with_the_oracles_bits(world):
    # 1 MiB per rank: the frames go by rendezvous, and work buffers are reused (the schedule
    # that once deadlocked halving at p = 4 under matching receives). A deadlock would end in
    # peer-timeout on every rank within the bound, never a hang.
    import numpy as np

    from alpha_mpi import oracle, pairwise, plan
    from alpha_mpi.execution import Allreducer

    size, rank, n = world.Get_size(), world.Get_rank(), 2**17
    tree = pairwise(range(size), size)
    x = {s: np.random.default_rng(s).standard_normal(n) * 1e3**s for s in range(size)}
    want = np.array(oracle.evaluate(tree, {s: v[:64].tolist() for s, v in x.items()}))
    bad = []
    for name in ("butterfly", "halving"):
        for mode in ("allreduce", "reduce-scatter"):
            if name == "butterfly" and mode == "reduce-scatter":
                continue
            a = Allreducer(world, plan(tree, None, n, size=size), realization=name, mode=mode, timeout=60)
            mine = {s: x[s] for s in a.plan.slots_of(rank)}
            if mode == "allreduce":
                got, lo = a.run(mine), 0
            else:
                lo, _, got = a.reduce_scatter_run(mine)
            head = np.asarray(got)[: max(0, min(64 - lo, len(got)))]
            if not np.array_equal(head.view(np.uint64), want[lo : lo + len(head)].view(np.uint64)):
                bad.append(f"{name} {mode}")
            a.free()
    agree(world, not bad, f"rank {rank}: {bad}")
