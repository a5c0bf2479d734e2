"""Every realization of pairwise trees on a communicator's ranks (one slot per rank, blocks of
4 slots per rank), in both modes, against the independent oracle, with data that makes another
order visible. Shared by the launcher test (mpi_scripts/any_rank_count.py at 3 and 6 ranks) and
the pytest-mpi test (test_ranks_mpi.py at whatever size it runs)."""

import numpy as np

from alpha_mpi import Branch, Leaf, oracle, pairwise, plan
from alpha_mpi.execution import Allreducer
from alpha_mpi.planning.realize import applicable


def data(slots, n, seed):
    rng = np.random.default_rng(seed)
    out = {}
    for s in range(slots):  # values over ~120 binades with mixed signs
        out[s] = (
            (1.0 + rng.random(n)) * np.exp2(rng.integers(-60, 61, n)) * np.where(rng.random(n) < 0.5, -1, 1)
        )
    return out


def right_comb(slots):
    """s0 + (s1 + (s2 + ...)): an order unlike the pairwise one from three slots on."""
    node = Leaf(slots - 1, 0)
    for s in range(slots - 2, -1, -1):
        node = Branch(Leaf(s, 0), node, 0)
    return node


def run_cases(comm):
    """(what failed, cases run, butterfly/halving cases run) on this rank."""
    size, rank = comm.Get_size(), comm.Get_rank()
    bad, cases, butterflies = [], 0, 0
    for per_rank in (1, 4):
        slots = per_rank * size
        tree = pairwise(range(slots), size)
        for n in (3, 9000):
            x = data(slots, n, seed=100 * per_rank + n)
            lists = {k: v.tolist() for k, v in x.items()}
            want = np.array(oracle.evaluate(tree, lists))
            other = np.array(oracle.evaluate(right_comb(slots), lists))
            if n > 1000 and size > 2 and np.array_equal(want.view(np.uint64), other.view(np.uint64)):
                bad.append(f"{slots} slots: the data does not tell the pairwise order from another")
            tp = plan(tree, None, n, size=size)
            for mode in ("allreduce", "reduce-scatter"):
                for name, why in applicable(tp, mode).items():
                    if why is not None:
                        if name in ("butterfly", "halving") and mode == "allreduce":
                            bad.append(f"{name} refused on {slots} slots: {why}")
                        continue
                    a = Allreducer(comm, tp, realization=name, mode=mode, segment=4000, timeout=120)
                    mine = {s: x[s] for s in a.plan.slots_of(rank)}
                    for _ in range(2):  # a second run on the same buffers
                        if mode == "allreduce":
                            got, lo, hi = a.run(mine), 0, n
                        else:
                            lo, hi, got = a.reduce_scatter_run(mine)
                    ok = got is not None and np.array_equal(
                        np.asarray(got).view(np.uint64), want[lo:hi].view(np.uint64)
                    )
                    if not ok:
                        bad.append(f"{name} {mode} {slots} slots n={n}")
                    cases += 1
                    butterflies += name in ("butterfly", "halving")
                    a.free()
    return bad, cases, butterflies
