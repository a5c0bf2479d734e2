"""The planner and the dry-run simulator: schedules, delivery laws, assembly. One process."""

import json

import pytest

from alpha_mpi import (
    Branch,
    DeliverTo,
    Layout,
    Leaf,
    Refusal,
    ReplicateAll,
    hierarchy,
    plan,
    plan_assembly,
    simulate,
    star,
)
from alpha_mpi.model import expression
from alpha_mpi.planning import realize
from alpha_mpi.planning.assembly import even_ranges
from alpha_mpi.planning.assembly_program import lower_assembly
from alpha_mpi.planning.check import check
from alpha_mpi.planning.program import Op


def test_star_delivery_law_hub_sends_one_instead_of_three():
    t = star(range(4), 4)
    rep = simulate(plan(t, ReplicateAll(), 8))
    to = simulate(plan(t, DeliverTo(2), 8))
    assert rep.sends(0, "d") == 3
    assert to.sends(0, "d") == 1
    assert to.receives(2, "d") == 1 and to.receives(1, "d") == 0 and to.receives(3, "d") == 0


def test_hierarchy_delivery_law_path_relays_other_subtree_silent():
    # Heap of seven owners, fanout 2: 0 -> (1, 2), 1 -> (3, 4), 2 -> (5, 6).
    t = hierarchy(range(7), 7, 2)
    tr = simulate(plan(t, DeliverTo(5), Layout.weighted(4)))
    assert tr.receives(2, "d") == 1 and tr.sends(2, "d") == 1  # forwarder relays
    assert tr.receives(5, "d") == 1
    for r in (1, 3, 4, 6):  # the other subtree, and the sibling, receive nothing
        assert tr.receives(r, "d") == 0
    assert tr.sends(0, "d") == 1
    rep = simulate(plan(t, ReplicateAll(), 1))
    assert all(rep.receives(r, "d") == 1 for r in range(1, 7))


def test_plan_is_deterministic_and_rows_are_per_rank():
    t = hierarchy(range(10), 4, 3)
    a, b = plan(t, None, 5), plan(t, None, 5)
    assert a.to_json() == b.to_json()
    pa, pb = realize(a, "tree"), realize(b, "tree")
    assert pa.identity == a.identity and pa.describe() == pb.describe()
    for r in range(4):
        assert pa.rank(r) == pb.rank(r)
    with pytest.raises(Refusal) as e:
        pa.rank(4)
    assert e.value.code == "rank-out-of-range"


def test_local_subtree_is_one_fused_group():
    t = star(range(6), [0, 0, 0, 1, 1, 1])
    p = plan(t, None, 1)
    g_rank0 = [g for g in p.groups if g.rank == 0]
    assert len(g_rank0) == 1 and g_rank0[0].expression() == "(((((s0+s1)+s2)+e0)+e1)+e2)"
    # rank 1's three leaves each travel separately: a star hub folds every leaf itself.
    assert sum(1 for e in p.edges if e.phase == "r") == 3
    h = hierarchy(range(8), 2, 2)
    for g in plan(h, None, 1).groups:
        assert sum(1 for op in g.program if op == -1) == len(g.inputs) - 1


def test_op_strings_round_trip():
    for t in (star(range(9), 3), hierarchy(range(9), 3, 2), hierarchy(range(9), 9, 3)):
        for d in (ReplicateAll(), DeliverTo(2)):
            prog = realize(plan(t, d, Layout.weighted(5)), "tree")
            for r in range(prog.size):
                for op in prog.rank(r).ops:
                    assert Op.parse(str(op)) == op
    with pytest.raises(Refusal) as e:
        Op.parse("rR3<1:8")  # the Step form of before: the Program is the one schedule
    assert e.value.code == "step-parse-error"


def test_json_and_dot_outputs():
    p = plan(hierarchy(range(5), 3, 2), DeliverTo(1), 2)
    d = json.loads(p.to_json())
    assert d["layout_order_id"] == p.layout_order_id and d["receivers"] == [1]
    assert p.to_dot().startswith("digraph plan {")


def test_plan_refusals():
    t = star(range(4), 4)
    with pytest.raises(Refusal) as e:
        plan(t, None, 1, size=3)
    assert e.value.code == "owner-out-of-range"
    with pytest.raises(Refusal) as e:
        plan(star(range(4), [0, 0, 1, 1]), DeliverTo(2), 1, size=4)
    assert e.value.code == "delivery-target-not-owner"
    with pytest.raises(Refusal) as e:
        plan(t, "everyone", 1)
    assert e.value.code == "delivery-invalid"
    with pytest.raises(Refusal) as e:
        plan(t, None, 0)
    assert e.value.code == "layout-invalid"
    with pytest.raises(Refusal) as e:
        plan("tree", None, 1)
    assert e.value.code == "tree-malformed"


def test_simulator_catches_a_broken_schedule():
    p = plan(star(range(3), 3), None, 1)
    prog = realize(p, "tree")
    check(prog)
    # Rank 1 waits for the result (W3) before it sends its leaf up (S0): rank 0 waits for that
    # leaf, rank 1 for rank 0 -> a deadlock, named with the grid, not a hang.
    r1 = prog.rank(1)
    assert r1.text() == "P3 C0 S0 W3 C1 D0"
    ops = tuple(Op.parse(x) for x in "P3 W3 C0 S0 C1 D0".split())
    broken = prog.replace(builder=lambda r: r1.replace(ops=ops) if r == 1 else prog.rank(r))
    with pytest.raises(Refusal) as e:
        check(broken)
    assert e.value.code == "plan-simulation-failed"
    assert "ERROR HERE" in str(e.value)
    # A tree plan whose rank 1 sends its value to rank 2 instead of the hub is refused too.
    edges = tuple(e.replace(dst=2) if (e.phase, e.src) == ("r", 1) else e for e in p.edges)
    with pytest.raises(Refusal) as e:
        simulate(p.replace(edges=edges))
    assert e.value.code == "plan-simulation-failed"


def test_branch_owned_by_a_rank_without_leaves_relays():
    t = Branch(Leaf(0, 0), Leaf(1, 1), 2)
    p = plan(t, ReplicateAll(), 1)
    tr = simulate(p)
    assert p.root_rank == 2 and tr.results[0] == tr.results[1] == expression(t)


def test_assembly_selection_and_refusals():
    p = plan_assembly(even_ranges(10, 3), 10, 3)
    prog = lower_assembly(p)
    assert sum(len(prog.rank(r).sends()) for r in range(3)) == 6
    assert "  [0, 3) @r0" in p.describe() and "  r1: " in p.describe(prog)
    p = plan_assembly(even_ranges(10, 3), 10, 3, DeliverTo(0))
    prog = lower_assembly(p)
    assert {m.dst for r in range(3) for m in prog.rank(r).sends()} == {0}
    for ranges, code in (
        ([(0, 0, 6), (1, 5, 10)], "data-parallel-assembly-overlap"),
        ([(0, 0, 4), (1, 5, 10)], "data-parallel-assembly-coverage"),
        ([(0, 0, 4), (1, 4, 9)], "data-parallel-assembly-coverage"),
        ([(0, 1, 10)], "data-parallel-assembly-coverage"),
        ([(0, 0, 5), (0, 0, 5), (1, 5, 10)], "data-parallel-assembly-overlap"),
        ([(0, 0, 5), (3, 5, 10)], "owner-out-of-range"),
    ):
        with pytest.raises(Refusal) as e:
            plan_assembly(ranges, 10, 2)
        assert e.value.code == code, ranges
