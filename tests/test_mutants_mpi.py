"""Executed mutants: wrong orders that run their communication to completion, refused by the oracle.

DESIGN.md "Showing that the declared order ran". Each mutant claims the declared plan's identity,
order id, topology and contract digest, so every frame header check passes and the real Combiner
runs it over MPI to the end; the independent oracle of the DECLARED tree then refuses what every
receiver got (`oracle-mismatch`, naming exactly the coordinates the mutation changed). Each test
first asserts that the data makes the mutant observable (a mutant with the declared bits proves
nothing), and that the executed result is the mutant's own oracle value bit for bit (the mutation
really ran). Run under `mpiexec -n 2` and `-n 5`; the non-MPI tests at the end build and simulate
mutants in one process.
"""

import numpy as np
import pytest

from alpha_mpi import DeliverTo, Layout, Refusal, ReplicateAll, hierarchy, oracle, plan, star
from alpha_mpi.model import Branch, Leaf
from alpha_mpi.numerics import OracleMismatch, contract_for_plan
from alpha_mpi.planning import realize, simulate
from alpha_mpi_verify.mutants import CONTROLS, KINDS, build_mutants, mutant, oracle_verdict, refute, run

from conftest import agree, order_sensitive

SHORT = 10.0
N = 256  # numerator coordinates: enough that every mutation shows in some coordinate

TOPOLOGIES = {
    "star": lambda slots, size: star(range(slots), size),
    "hierarchy:2": lambda slots, size: hierarchy(range(slots), size, 2),
    "hierarchy:3": lambda slots, size: hierarchy(range(slots), size, 3),
}


def weighted_data(slots, n=N, seed=0):
    """numerator: order-sensitive values; mass: unequal sample counts (1..7)."""
    rng = np.random.default_rng(seed)
    return {s: np.concatenate([order_sensitive(rng, n), [float(1 + (s * 5) % 7)]]) for s in range(slots)}


def declared_plan(topology, size, delivery="all", per_rank=3):
    slots = per_rank * size
    tree = TOPOLOGIES[topology](slots, size)
    d = ReplicateAll() if delivery == "all" else DeliverTo(size - 1)
    return plan(tree, d, Layout.weighted(N), size=size), slots


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
@pytest.mark.parametrize("delivery", ["all", "to-last"])
def test_control_the_declared_plan_passes_the_oracle(world, topology, delivery):
    size, rank = world.Get_size(), world.Get_rank()
    p, slots = declared_plan(topology, size, delivery)
    data = weighted_data(slots, seed=slots)
    from alpha_mpi.execution import Combiner

    c = Combiner(world, p, timeout=SHORT, contract=contract_for_plan(p).digest)
    got = c.run({s: data[s] for s in p.slots_of(rank)})
    c.free()
    verdict = "not a receiver"
    if rank in p.receivers:
        try:
            oracle_verdict(p, data, got)
            verdict = "accepted"
        except OracleMismatch as e:
            verdict = f"refused: {e}"
    agree(
        world, verdict == ("accepted" if rank in p.receivers else "not a receiver"), f"rank {rank}: {verdict}"
    )


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
@pytest.mark.parametrize("delivery", ["all", "to-last"])
def test_mutant_runs_to_completion_and_the_oracle_refuses_it(world, kind, topology, delivery):
    size, rank = world.Get_size(), world.Get_rank()
    p, slots = declared_plan(topology, size, delivery)
    data = weighted_data(slots, seed=slots + 1)
    m = mutant(p, kind)  # simulate() has checked that it communicates consistently
    assert (m.plan.identity, m.plan.layout_order_id, m.plan.topology) == (
        p.identity,
        p.layout_order_id,
        p.topology,
    )
    r = refute(world, m, data, timeout=SHORT, contract=contract_for_plan(p).digest)
    # Observable on this data: the mutant's oracle bits differ from the declared oracle's.
    agree(world, len(r.observable) > 0, f"{kind} unobservable")
    if rank in p.receivers:
        ok = (
            r.result is not None
            and r.matches_mutant  # what ran is the mutant, bit for bit
            and isinstance(r.refusal, OracleMismatch)
            and r.refusal.code == "oracle-mismatch"
            and r.refusal.coordinates == r.observable  # refused exactly where the mutation shows
        )
        why = f"{kind} on rank {rank}: matches_mutant={r.matches_mutant} refusal={r.refusal!r}"
    else:
        ok, why = r.result is None, f"rank {rank} is not a receiver but got {r.result!r}"
    if ok and kind == "duplicated-mass" and rank in p.receivers:
        # Only the weight mass differs; the numerator is exactly the declared one.
        want = oracle.evaluate(p.tree, {s: v.tolist() for s, v in data.items()})
        ok = (
            r.refusal.context["components"] == ["mass[0]"]
            and r.result[-1] == want[-1] + data[m.double_mass_of][-1]
        )
        why = (
            f"mass: components {r.refusal.context['components'][:4]}, "
            f"mass {r.result[-1]} vs declared {want[-1]}"
        )
    agree(world, ok, why)  # once on every rank (agree is collective)


@pytest.mark.mpi(min_size=2)
def test_every_mutant_kind_executed_refused_and_observable_on_one_plan(world):
    size, rank = world.Get_size(), world.Get_rank()
    p, slots = declared_plan("hierarchy:2", size)
    data = weighted_data(slots, seed=99)
    refused = []
    for kind, m in build_mutants(p).items():
        r = refute(world, m, data, timeout=SHORT)
        if r.observable and r.matches_mutant and r.refusal is not None:
            refused.append(kind)
    agree(world, len(refused) >= 4 and sorted(refused) == sorted(KINDS), f"rank {rank}: refused {refused}")


@pytest.mark.mpi(min_size=2)
def test_commuted_operands_are_not_a_mutant_the_oracle_accepts_them(world):
    """Why the harness insists on observability: a+b and b+a have the same IEEE bits, so the
    'commuted' control runs, the oracle accepts it, and require_observable refuses it."""
    size, rank = world.Get_size(), world.Get_rank()
    p, slots = declared_plan("star", size)
    data = weighted_data(slots, seed=5)
    m = mutant(p, "commuted")
    with pytest.raises(Refusal) as e:
        m.require_observable(data)
    assert e.value.code == "mutant-unobservable"
    got = run(world, m, {s: data[s] for s in m.plan.slots_of(rank)}, timeout=SHORT)
    oracle_verdict(p, data, got)  # accepted: commuting an add changes no bit
    agree(world, True)


# ------------------------------------------------------------------------- single process


@pytest.mark.parametrize("size", range(2, 11))
@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
def test_mutants_build_simulate_and_are_observable_for_many_sizes(size, topology):
    p, slots = declared_plan(topology, size, per_rank=2)
    data = weighted_data(slots, seed=size)
    ms = build_mutants(p, KINDS + CONTROLS)
    for kind, m in ms.items():
        simulate(m.plan)
        coords = m.observable_coordinates(data)
        assert bool(coords) == (kind != "commuted"), (kind, m.description)
        assert m.plan.identity == p.identity and m.plan.layout_order_id == p.layout_order_id


def test_duplicated_leaf_bypasses_the_coverage_check_the_planner_would_apply():
    p, _ = declared_plan("hierarchy:2", 3)
    m = mutant(p, "duplicated-leaf")
    x = m.tree  # the mutated tree repeats a slot: the planner refuses to plan it
    with pytest.raises(Refusal) as e:
        plan(x, None, Layout.weighted(N), size=3)
    assert e.value.code == "coverage-duplicate-leaf"
    # ... yet the mutant plan's schedule and traffic are the declared ones, only a program differs.
    mine, theirs = realize(m.plan, "tree"), realize(p, "tree")
    assert m.plan.edges == p.edges
    for r in range(p.size):  # the same messages, sent and awaited in the same order
        a, b = mine.rank(r), theirs.rank(r)
        assert a.messages == b.messages
        assert [o for o in a.ops if o.kind in "SW"] == [o for o in b.ops if o.kind in "SW"]
    assert sum(a.program != b.program for a, b in zip(m.plan.groups, p.groups)) == 1


def test_mutants_that_have_no_place_are_refused_by_name():
    one = plan(star(range(4), 1), None, Layout.weighted(4), size=1)
    with pytest.raises(Refusal) as e:
        mutant(one, "swap-across-subtrees")
    assert e.value.code == "mutant-not-applicable"
    unweighted = plan(star(range(4), 2), None, 8, size=2)
    with pytest.raises(Refusal) as e:
        mutant(unweighted, "duplicated-mass")
    assert e.value.code == "mutant-not-applicable"
    two = plan(Branch(Leaf(0, 0), Leaf(1, 1), 0), None, Layout.weighted(4), size=2)
    with pytest.raises(Refusal) as e:
        mutant(two, "moved-leaf")
    assert e.value.code == "mutant-not-applicable"


def test_an_unobservable_mutant_is_refused_not_counted():
    p, slots = declared_plan("star", 2)
    # All-equal small integers: every order gives the same bits, so no mutant can be observed.
    flat = {s: np.full(N + 1, 1.0) for s in range(slots)}
    m = mutant(p, "reassociated")
    with pytest.raises(Refusal) as e:
        m.require_observable(flat)
    assert e.value.code == "mutant-unobservable"
