"""combine() over MPI equals the independent oracle bit for bit (star, hierarchy, both deliveries).

Run under `mpiexec -n 2` and `-n 5` with `python -m pytest --with-mpi`. Each case runs on
COMM_WORLD, on a user duplicate, and on a spy communicator that refuses every data collective and
every pickling call, so the whole suite also proves the point-to-point-only rule.
"""

import numpy as np
import pytest

from alpha_mpi import DeliverTo, Layout, ReplicateAll, hierarchy, oracle, plan, star
from alpha_mpi.execution import Combiner, combine

from conftest import agree, bits, slot_data
from spycomm import SpyComm

TOPOLOGIES = {
    "star": lambda slots, size: star(range(slots), size),
    "hierarchy:2": lambda slots, size: hierarchy(range(slots), size, 2),
    "hierarchy:3": lambda slots, size: hierarchy(range(slots), size, 3),
}


@pytest.fixture(params=["world", "dup", "spy"])
def comm(request):
    from mpi4py import MPI

    if request.param == "world":
        return MPI.COMM_WORLD
    if request.param == "dup":
        return MPI.COMM_WORLD.Dup()
    return SpyComm(MPI.COMM_WORLD)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
@pytest.mark.parametrize("per_rank", [1, 3, 10])
@pytest.mark.parametrize("n", [1, 1000])
def test_replicate_all_equals_oracle(comm, topology, per_rank, n):
    size, rank = comm.Get_size(), comm.Get_rank()
    slots = per_rank * size
    tree = TOPOLOGIES[topology](slots, size)
    data = slot_data(slots, n, seed=slots * 7 + n)
    p = plan(tree, ReplicateAll(), n, size=size)
    mine = {s: data[s] for s in p.slots_of(rank)}
    got = combine(comm, p, mine)
    want = np.array(oracle.evaluate(tree, {s: data[s].tolist() for s in data}))
    agree(comm, got is not None and np.array_equal(bits(got), bits(want)), f"{topology} bits")
    # Inputs are never written.
    agree(comm, all(np.array_equal(bits(mine[s]), bits(data[s])) for s in mine), "inputs intact")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
def test_deliver_to_each_rank_leaves_others_untouched(comm, topology):
    size, rank = comm.Get_size(), comm.Get_rank()
    slots, n = 2 * size + 1, 257
    tree = TOPOLOGIES[topology](slots, size)
    data = slot_data(slots, n, seed=3)
    want = np.array(oracle.evaluate(tree, {s: data[s].tolist() for s in data}))
    for target in range(size):
        p = plan(tree, DeliverTo(target), n, size=size)
        mine = {s: data[s] for s in p.slots_of(rank)}
        out = np.full(n, -7.25)
        got = combine(comm, p, mine, out=out)
        if rank == target:
            agree(comm, got is out and np.array_equal(bits(out), bits(want)), "target bits")
        else:
            agree(comm, got is None and np.all(out == -7.25), "others untouched")


@pytest.mark.mpi(min_size=2)
def test_weighted_payload_numerator_and_mass(comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    slots, n = 3 * size, 33
    tree = hierarchy(range(slots), size, 2)
    layout = Layout.weighted(n)
    data = slot_data(slots, n, seed=11)
    counts = {s: float(1 + (s * 5) % 7) for s in range(slots)}  # unequal slot sizes
    p = plan(tree, None, layout, size=size)
    mine = {s: (data[s], np.array([counts[s]])) for s in p.slots_of(rank)}
    got = combine(comm, p, mine)
    full = {s: data[s].tolist() + [counts[s]] for s in range(slots)}
    want = np.array(oracle.evaluate(tree, full))
    agree(comm, np.array_equal(bits(got), bits(want)), "weighted bits")
    agree(comm, got[-1] == sum(counts.values()), "mass is the sample total")


@pytest.mark.mpi(min_size=2)
def test_large_vector_one_million_elements(world):
    size, rank = world.Get_size(), world.Get_rank()
    n = 1 << 20
    tree = hierarchy(range(size), size, 2)
    data = slot_data(size, n, seed=5)
    p = plan(tree, None, n, size=size)
    got = combine(world, p, {rank: data[rank]})
    want = np.array(oracle.evaluate(tree, {s: data[s].tolist() for s in data}))
    agree(world, np.array_equal(bits(got), bits(want)), "1M bits")


@pytest.mark.mpi(min_size=2)
def test_ten_slots_hierarchy_matches_hierarchy_oracle_not_star(world):
    size, rank = world.Get_size(), world.Get_rank()
    data = slot_data(10, 4096, seed=10)
    h, s = hierarchy(range(10), size, 2), star(range(10), size)
    want_h = np.array(oracle.evaluate(h, {k: v.tolist() for k, v in data.items()}))
    want_s = np.array(oracle.evaluate(s, {k: v.tolist() for k, v in data.items()}))
    assert not np.array_equal(bits(want_h), bits(want_s)), "data must make the order observable"
    p = plan(h, None, 4096, size=size)
    got = combine(world, p, {k: data[k] for k in p.slots_of(rank)})
    agree(world, np.array_equal(bits(got), bits(want_h)), "matches hierarchy")
    agree(world, not np.array_equal(bits(got), bits(want_s)), "differs from star")


@pytest.mark.mpi(min_size=2)
def test_repeated_runs_reuse_buffers_and_advance_steps(world):
    size, rank = world.Get_size(), world.Get_rank()
    tree = star(range(size), size)
    p = plan(tree, None, 64, size=size)
    c = Combiner(world, p, timeout=10)
    for step in range(5):
        data = slot_data(size, 64, seed=100 + step)
        got = c.run({rank: data[rank]})
        want = np.array(oracle.evaluate(tree, {k: v.tolist() for k, v in data.items()}))
        agree(world, np.array_equal(bits(got), bits(want)), f"step {step}")
    assert c.step == 5
