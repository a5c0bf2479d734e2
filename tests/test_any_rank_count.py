"""Butterfly and halving at every rank count, symbolically in one process (no MPI).

The symbolic checker runs every rank's program with interned expressions: each receiver must end
with exactly the declared tree, no rank may wait forever, no region may be touched while a
receive into it is pending or written while a send from it is in flight. Pairwise trees are
rank-partitioned at every p (one slot per rank, blocks of 4 slots per rank), so the butterflies
apply there; elsewhere they are refused by name, with the list that applies.
"""

import json
import subprocess
import sys

import pytest

from alpha_mpi import DeliverTo, Refusal, pairwise, plan
from alpha_mpi.model import leaf_sequence
from alpha_mpi.planning.check import check
from alpha_mpi.planning.ranktop import butterfly_rounds, halving_shape, rank_top
from alpha_mpi.planning.realize import REALIZATIONS, REDUCE_SCATTER, applicable, realize

from conftest import topologies

TOPOLOGIES = {k: v for k, v in topologies().items() if k in ("pairwise", "star", "hierarchy:2", "random")}
SIZES = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16]


def _partitioned(tree, size):
    try:
        rank_top(tree, size, "x")
        return True
    except Refusal:
        return False


@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
@pytest.mark.parametrize("size", SIZES)
def test_every_realization_at_every_rank_count_ends_with_the_declared_tree(topology, size):
    for per_rank in (1, 4):
        tree = TOPOLOGIES[topology](per_rank * size, size)
        target = max(leaf.owner for leaf in leaf_sequence(tree))
        for delivery in (None, DeliverTo(target)):
            tp = plan(tree, delivery, 5, size=size)
            why = applicable(tp)
            partitioned = _partitioned(tree, size)
            if topology == "pairwise":
                assert partitioned, (size, per_rank)
            for name in REALIZATIONS:
                butterflies = name in ("butterfly", "halving")
                assert (why[name] is None) == (partitioned or not butterflies), (name, why[name])
                if why[name] is not None:
                    assert "not rank-partitioned" in why[name]
                    with pytest.raises(Refusal) as e:
                        realize(tp, name)
                    assert e.value.code == "realization-inapplicable"
                    assert e.value.context["applicable"] == ["tree", "scatter", "replicate"]
                    continue
                check(realize(tp, name, segment=2))
            for name in REDUCE_SCATTER:
                if why[name] is None:
                    prog = realize(tp, name, mode="reduce-scatter", segment=2)
                    check(prog)
                    held = sorted(c for c in prog.chunks if c[1] > c[0])
                    assert held[0][0] == 0 and held[-1][1] == 5
                    assert all(x[1] == y[0] for x, y in zip(held, held[1:]))


@pytest.mark.parametrize("name", ["butterfly", "halving"])
def test_1536_ranks_plan_and_check_in_seconds(name):
    """Not a timing assertion: the checker runs every rank's program at p = 1536."""
    p = 1536
    cost = check(realize(plan(pairwise(range(p), p), None, 64, size=p), name))
    L = (p - 1).bit_length()
    if name == "butterfly":
        assert cost.rounds <= L + 1 and cost.sends_per_rank_max <= L + 2
    else:
        assert cost.rounds <= 2 * L + 2 and cost.bytes_per_rank_max <= 3 * 8 * 64


def test_butterfly_sends_and_rounds_stay_within_bounds_for_every_p_up_to_300():
    from alpha_mpi.planning.realizations.butterfly import plan_schedule
    from alpha_mpi.planning.realizations.halving import plan_halving

    for p in range(1, 301):
        top = rank_top(pairwise(range(p), p), p, "x")
        L = (p - 1).bit_length()
        sc = plan_schedule(top, p, frozenset(range(p)))
        assert sc.rounds <= L + 1 and max(sc.load.sent) <= L + 2, p
        assert butterfly_rounds(top, False) == sc.rounds, p  # the cost model's rounds are the plan's
        n = 1000 + p
        h, chunks = plan_halving(top, n, p, frozenset(range(p)), "allreduce")
        depth, rs = halving_shape(top)
        assert h.rounds == rs + depth + (1 if (1 << depth) < p else 0) <= 2 * L + 2, p
        assert max(h.bytes.sent) <= 3 * n, p
        assert sum(1 for c in chunks if c[1] > c[0]) == 1 << depth


@pytest.mark.parametrize("ranks", [6, 12, 1000, 1536])
def test_plan_cost_targets(ranks):
    L = (ranks - 1).bit_length()
    for name in ("butterfly", "halving"):
        r = subprocess.run(
            [sys.executable, "-m", "alpha_mpi", "plan", "--slots", str(ranks), "--ranks", str(ranks)]
            + ["--topology", "pairwise", "--realization", name, "--elements", "100000", "--cost"]
            + ["--format", "json"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr
        d = json.loads(r.stdout)
        if name == "butterfly":
            assert d["rounds"] <= L + 1 and d["sends_per_rank_max"] <= L + 2, d["rounds"]
        else:
            assert d["rounds"] <= 2 * L + 2 and d["bytes_per_rank_max"] <= 3 * 8 * 100000


@pytest.mark.parametrize("size", [3, 4, 6, 8])
def test_large_payloads_reuse_buffers_without_a_deadlock(size):
    # Large payloads reuse dead work buffers, so a send must complete before a later receive
    # fills its buffer. The engine matches and receives a frame at W (size-safe receives; P
    # posts nothing), so completing that send before the P deadlocked two ranks that exchange
    # from reused buffers (halving at p = 4, 1 MiB: each waited for the other's W). The checker
    # models the engine's W, so it refuses such a program.
    tp = plan(pairwise(range(size), size), None, 2**17, size=size)
    for name in ("butterfly", "halving"):
        check(realize(tp, name))
    check(realize(tp, "halving", mode="reduce-scatter"))
