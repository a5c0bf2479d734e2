"""Tree, scatter and auto realizations of one declared order give the same bits = the oracle.

Run under `mpiexec -n 2` and `-n 5` with `python -m pytest --with-mpi`. Sizes 1 and 7 leave
chunks that differ in size or are empty; small segments force several frames per chunk.
"""

import numpy as np
import pytest

from alpha_mpi import DeliverTo, Layout, ReplicateAll, hierarchy, oracle, plan, star
from alpha_mpi.execution import Allreducer, Combiner, ScatterCombiner, allreduce, reduce_scatter
from alpha_mpi.planning.scatter_plan import ReduceScatter, plan_scatter
from alpha_mpi.refusals import Refusal

from conftest import agree, bits, slot_data
from spycomm import SpyComm

TOPOLOGIES = {
    "star": lambda slots, size: star(range(slots), size),
    "hierarchy:2": lambda slots, size: hierarchy(range(slots), size, 2),
}
TIMEOUT = 20


def _want(tree, data):
    return np.array(oracle.evaluate(tree, {s: v.tolist() for s, v in data.items()}))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
@pytest.mark.parametrize("per_rank", [1, 3])
@pytest.mark.parametrize("n", [1, 7, 1000])
def test_three_realizations_equal_the_oracle(world, topology, per_rank, n):
    size, rank = world.Get_size(), world.Get_rank()
    slots = per_rank * size
    tree = TOPOLOGIES[topology](slots, size)
    data = slot_data(slots, n, seed=31 * n + slots)
    want = _want(tree, data)
    for realization, extra in (("tree", {}), ("scatter", {"segment": 64}), ("scatter", {}), ("auto", {})):
        a = Allreducer(world, tree, n, realization=realization, timeout=TIMEOUT, **extra)
        assert a.realization == ("tree" if realization == "auto" else realization)  # small: auto picks tree
        mine = {s: data[s] for s in a.plan.slots_of(rank)}
        got = a.run(mine)
        agree(world, got is not None and np.array_equal(bits(got), bits(want)), f"{realization} bits")
        agree(world, all(np.array_equal(bits(mine[s]), bits(data[s])) for s in mine), "inputs intact")
        a.free()


@pytest.mark.mpi(min_size=2)
def test_auto_picks_scatter_from_the_crossover_and_the_bits_do_not_change(world, monkeypatch):
    size, rank = world.Get_size(), world.Get_rank()
    tree = hierarchy(range(2 * size), size, 3)
    n = 513
    data = slot_data(2 * size, n, seed=4)
    want = _want(tree, data)
    mine = {s: data[s] for s in plan(tree, None, n, size=size).slots_of(rank)}
    a = Allreducer(world, tree, n, crossover_bytes=8 * n, timeout=TIMEOUT)
    b = Allreducer(world, tree, n, crossover_bytes=8 * n + 8, timeout=TIMEOUT)
    assert (a.realization, b.realization) == ("scatter", "tree")
    assert a.order_id == b.order_id == b.plan.order_id
    assert a.identity != b.identity
    for x in (a, b):
        agree(world, np.array_equal(bits(x.run(mine)), bits(want)), x.realization)
    monkeypatch.setenv("ALPHA_MPI_CROSSOVER_BYTES", "0")
    c = Allreducer(world, tree, n, timeout=TIMEOUT)
    assert c.realization == "scatter"
    agree(world, np.array_equal(bits(allreduce(world, tree, mine, layout=n)), bits(want)), "functional auto (env)")
    monkeypatch.setenv("ALPHA_MPI_CROSSOVER_BYTES", str(1 << 40))
    agree(world, np.array_equal(bits(allreduce(world, tree, mine, layout=n)), bits(want)), "functional auto (tree)")
    assert Allreducer(world, tree, n, timeout=TIMEOUT).realization == "tree"


@pytest.mark.mpi(min_size=2)
def test_one_million_coordinates_once(world):
    size, rank = world.Get_size(), world.Get_rank()
    n = 1 << 20
    tree = hierarchy(range(size), size, 2)
    data = slot_data(size, n, seed=5)
    want = _want(tree, data)
    results = {}
    for realization in ("tree", "scatter"):
        a = Allreducer(world, tree, n, realization=realization, timeout=60)
        results[realization] = a.run({rank: data[rank]})
        a.free()
    agree(world, np.array_equal(bits(results["scatter"]), bits(want)), "scatter 1M")
    agree(world, np.array_equal(bits(results["tree"]), bits(want)), "tree 1M")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
def test_deliver_to_each_rank_leaves_the_others_untouched(world, topology):
    size, rank = world.Get_size(), world.Get_rank()
    slots, n = 2 * size + 1, 257
    tree = TOPOLOGIES[topology](slots, size)
    data = slot_data(slots, n, seed=3)
    want = _want(tree, data)
    for target in range(size):
        a = Allreducer(world, tree, n, DeliverTo(target), realization="scatter", segment=32, timeout=TIMEOUT)
        mine = {s: data[s] for s in a.plan.slots_of(rank)}
        out = np.full(n, -7.25)
        got = a.run(mine, out=out)
        if rank == target:
            agree(world, got is out and np.array_equal(bits(out), bits(want)), "target bits")
        else:
            agree(world, got is None and np.all(out == -7.25), "others untouched")
        a.free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("per_rank", [1, 2])
@pytest.mark.parametrize("n", [1, 7, 1000])
def test_reduce_scatter_returns_each_rank_its_chunk_of_the_oracle(world, per_rank, n):
    size, rank = world.Get_size(), world.Get_rank()
    slots = per_rank * size
    tree = hierarchy(range(slots), size, 2)
    data = slot_data(slots, n, seed=77 + n)
    want = _want(tree, data)
    mine = {s: data[s] for s in plan(tree, None, n, size=size).slots_of(rank)}
    start, stop, chunk = reduce_scatter(world, tree, mine, layout=n)
    agree(world, np.array_equal(bits(chunk), bits(want[start:stop])), "chunk bits")
    bounds = world.allgather((start, stop))  # test-side check that the chunks tile the payload
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(b == c for (_, b), (c, _) in zip(bounds, bounds[1:]))
    assert max(b - a for a, b in bounds) - min(b - a for a, b in bounds) <= 1
    # into a caller's buffer, whole-payload sized: the chunk lands at out[start:stop]
    sp = plan_scatter(tree, ReduceScatter(), n, size=size, segment=16)
    c = ScatterCombiner(world, sp, timeout=TIMEOUT)
    out = np.full(n, 3.5)
    s2, e2, view = c.reduce_scatter_run(mine, out=out)
    agree(world, (s2, e2) == (start, stop) and np.array_equal(bits(out[start:stop]), bits(want[start:stop])), "into out")
    agree(world, np.all(np.delete(out, np.arange(start, stop)) == 3.5), "rest of out untouched")
    c.free()


@pytest.mark.mpi(min_size=2)
def test_weighted_layout_and_in_place(world):
    size, rank = world.Get_size(), world.Get_rank()
    slots, n = 2 * size, 40
    tree = star(range(slots), size)
    layout = Layout.weighted(n)
    data = slot_data(slots, n, seed=12)
    counts = {s: float(1 + s % 5) for s in range(slots)}
    full = {s: np.concatenate([data[s], [counts[s]]]) for s in range(slots)}
    want = _want(tree, full)
    a = Allreducer(world, tree, layout, realization="scatter", segment=8, timeout=TIMEOUT)
    got = a.run({s: (data[s], np.array([counts[s]])) for s in a.plan.slots_of(rank)})
    agree(world, np.array_equal(bits(got), bits(want)), "weighted")
    # in place: out is one of this rank's contributions
    mine = {s: full[s].copy() for s in a.plan.slots_of(rank)}
    first = a.plan.slots_of(rank)[0]
    got = a.run(mine, out=mine[first])
    agree(world, got is mine[first] and np.array_equal(bits(got), bits(want)), "in place")


@pytest.mark.mpi(min_size=2)
def test_point_to_point_only_on_a_spy_communicator(world):
    size, rank = world.Get_size(), world.Get_rank()
    spy = SpyComm(world)
    tree = hierarchy(range(2 * size), size, 2)
    n = 301
    data = slot_data(2 * size, n, seed=8)
    want = _want(tree, data)
    mine = {s: data[s] for s in plan(tree, None, n, size=size).slots_of(rank)}
    for realization in ("tree", "scatter", "auto"):
        a = Allreducer(spy, tree, n, realization=realization, segment=50, timeout=TIMEOUT)
        agree(world, np.array_equal(bits(a.run(mine)), bits(want)), realization)
        agree(world, np.array_equal(bits(a.run(mine)), bits(want)), realization + " again")
    c = ScatterCombiner(spy, plan_scatter(tree, ReduceScatter(), n, size=size), timeout=TIMEOUT)
    start, stop, chunk = c.run(mine)
    agree(world, np.array_equal(bits(chunk), bits(want[start:stop])), "reduce-scatter on spy")
    d = Allreducer(spy, tree, n, DeliverTo(size - 1), realization="scatter", timeout=TIMEOUT)
    got = d.run(mine)
    agree(world, (got is None) == (rank != size - 1), "deliver-to on spy")


def _refusal(fn):
    try:
        fn()
    except Refusal as e:
        return e.code
    return None


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", ["replicate", "reduce-scatter"])
def test_a_non_finite_contribution_is_refused_everywhere_after_communication(world, mode):
    size, rank = world.Get_size(), world.Get_rank()
    slots, n = 2 * size, 100
    tree = star(range(slots), size)
    data = slot_data(slots, n, seed=9)
    bad_slot = slots - 1  # owned by the last rank
    bad = dict(data)
    bad[bad_slot] = data[bad_slot].copy()
    bad[bad_slot][3] = np.nan  # coordinate 3 lies in rank 0's chunk
    delivery = ReduceScatter() if mode == "reduce-scatter" else ReplicateAll()
    c = ScatterCombiner(world, plan_scatter(tree, delivery, n, size=size, segment=16), timeout=TIMEOUT)
    mine = {s: bad[s] for s in c.slots}
    code = _refusal(lambda: c.run(mine))
    expected = "non-finite-contribution" if rank == size - 1 else "non-finite-combined"
    agree(world, code == expected, f"refused as {code}, expected {expected}")
    # A clean refusal: the channel is intact and the combiner runs again.
    want = _want(tree, data)
    got = c.run({s: data[s] for s in c.slots})
    if mode == "reduce-scatter":
        start, stop, chunk = got
        agree(world, np.array_equal(bits(chunk), bits(want[start:stop])), "after refusal")
    else:
        agree(world, np.array_equal(bits(got), bits(want)), "after refusal")


@pytest.mark.mpi(min_size=2)
def test_overflow_is_refused_as_non_finite_combined(world):
    size, rank = world.Get_size(), world.Get_rank()
    tree = star(range(size), size)
    a = Allreducer(world, tree, 9, realization="scatter", timeout=TIMEOUT)
    x = np.full(9, 1.0e308)
    agree(world, _refusal(lambda: a.run({rank: x})) == "non-finite-combined", "overflow")


@pytest.mark.mpi(min_size=2)
def test_a_peer_running_the_tree_realization_is_refused_by_name(world):
    """Rank 0 runs the tree realization, the others scatter: every rank refuses by name, fast."""
    import time

    size, rank = world.Get_size(), world.Get_rank()
    tree = star(range(size), size)
    n = 7
    data = slot_data(size, n, seed=1)
    a = Allreducer(world, tree, n, realization="tree" if rank == 0 else "scatter", timeout=2)
    t0 = time.monotonic()
    code = _refusal(lambda: a.run({rank: data[rank]}))
    elapsed = time.monotonic() - t0
    codes = world.allgather(code)
    allowed = {"frame-identity-mismatch", "frame-size-mismatch", "peer-timeout"}
    agree(world, code in allowed and elapsed < 15, f"rank {rank}: {code} after {elapsed:.1f}s")
    assert any(c in ("frame-identity-mismatch", "frame-size-mismatch") for c in codes), codes
    assert a.broken is not None or code == "peer-timeout"


@pytest.mark.mpi(min_size=2)
def test_scatter_frames_name_another_identity_than_the_tree_plan(world):
    """Every rank runs scatter, but with another segment length on rank 0: refused by name."""
    size, rank = world.Get_size(), world.Get_rank()
    tree = star(range(size), size)
    n = 64 * size
    seg = 8 if rank == 0 else 16
    c = ScatterCombiner(world, plan_scatter(tree, None, n, size=size, segment=seg), timeout=2)
    code = _refusal(lambda: c.run({rank: np.ones(n)}))
    codes = world.allgather(code)
    agree(world, code in {"frame-identity-mismatch", "frame-size-mismatch", "peer-timeout"}, f"{code}")
    assert "frame-identity-mismatch" in codes, codes


@pytest.mark.mpi(min_size=2)
def test_contribution_errors_are_clean(world):
    size, rank = world.Get_size(), world.Get_rank()
    tree = star(range(size), size)
    a = Allreducer(world, tree, 10, realization="scatter", timeout=TIMEOUT)
    assert _refusal(lambda: a.run({})) == "contribution-missing"
    assert _refusal(lambda: a.run({rank: np.ones(10), size + 5: np.ones(10)})) == "contribution-unexpected"
    assert _refusal(lambda: a.run({rank: np.ones(11)})) == "contribution-shape"
    assert _refusal(lambda: a.run({rank: np.ones(10, dtype=np.float32)})) == "dtype-invalid"
    assert _refusal(lambda: a.run({rank: np.ones(10)}, out=np.empty(9))) == "kernel-bad-argument"
    got = a.run({rank: np.ones(10)})
    agree(world, np.all(got == float(size)), "usable after clean refusals")
    assert isinstance(Allreducer(world, tree, 10, realization="tree").executor, Combiner)
