"""Every applicable realization of one declared order gives the same bits = the oracle, over MPI.

Run under `mpiexec -n 2` and `-n 5` with `python -m pytest --with-mpi`. Each case also runs on
sub-communicators of 1 .. min(5, size) ranks, so p = 1, 2, 3, 4, 5 are covered by the -n 5 run.
Sizes 1 and 7 leave chunks that differ in size or are empty; 9000 elements (72 KiB) take the
header + payload path; order-sensitive data makes any other order visible.
"""

import numpy as np
import pytest

from alpha_mpi import DeliverTo, Layout, hierarchy, oracle, pairwise, plan, star
from alpha_mpi.execution import Allreducer, ScatterCombiner, allreduce, reduce_scatter
from alpha_mpi.model.delivery import ReduceScatter
from alpha_mpi.planning.realize import REALIZATIONS, applicable, plan_scatter

from conftest import agree, bits, refusal_code, slot_data, topologies
from spycomm import SpyComm

TIMEOUT = 20


TOPOLOGIES = topologies()


def _want(tree, data):
    return np.array(oracle.evaluate(tree, {s: v.tolist() for s, v in data.items()}))


def _subcomms(world):
    """(q, comm of the first q ranks or None) for q = 1 .. min(5, size); Split is no data move."""
    size, rank = world.Get_size(), world.Get_rank()
    for q in range(1, min(5, size) + 1):
        sub = world.Split(0 if rank < q else 1, rank)
        yield q, (sub if rank < q else None)
        sub.Free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("n", [1, 7, 9000])
def test_every_applicable_realization_equals_the_oracle_on_1_to_5_ranks(world, n):
    for q, comm in _subcomms(world):
        verdicts = []
        if comm is not None:
            rank = comm.Get_rank()
            for topology, build in sorted(TOPOLOGIES.items()):
                slots = 8 if topology == "pairwise" else 2 * q + 1
                tree = build(slots, q)
                data = slot_data(slots, n, seed=31 * n + slots + q)
                want = _want(tree, data)
                other_tree = star(range(slots)) if topology != "star" else pairwise(range(slots))
                if other_tree.order_id != tree.order_id and n >= 1000:  # the data makes another order visible
                    other = _want(other_tree, data)
                    verdicts.append(
                        (not np.array_equal(bits(other), bits(want)), f"{topology}: order visible")
                    )
                tp = plan(tree, None, n, size=q)
                for name, why in applicable(tp).items():
                    if why is not None:
                        continue
                    a = Allreducer(
                        comm, tp, realization=name, segment=3 if n < 100 else 4000, timeout=TIMEOUT
                    )
                    mine = {s: data[s] for s in a.plan.slots_of(rank)}
                    for _ in range(2):  # a second run on the same buffers and requests
                        got = a.run(mine)
                    if rank in tp.receivers:
                        ok = got is not None and np.array_equal(bits(got), bits(want))
                    else:  # a rank owning no node of a random tree: ReplicateAll does not reach it
                        ok = got is None
                    verdicts.append((ok, f"p={q} {topology} {name}"))
                    verdicts.append(
                        (all(np.array_equal(bits(mine[s]), bits(data[s])) for s in mine), "inputs intact")
                    )
                    a.free()
        bad = [w for ok, w in verdicts if not ok]
        agree(world, not bad, f"{bad[:4]}")


@pytest.mark.mpi(min_size=2)
def test_pairwise_on_two_or_four_ranks_runs_the_butterflies(world):
    size, rank = world.Get_size(), world.Get_rank()
    if size not in (2, 4):
        pytest.skip("the butterflies need 2^k ranks")
    tree = pairwise(range(2 * size), size)
    for n, want_auto in ((1, "butterfly"), (1 << 20, "halving")):
        a = Allreducer(world, tree, n, timeout=60)
        agree(world, a.realization == want_auto, f"auto chose {a.realization} for {n}: {a.describe()}")
        data = slot_data(2 * size, n, seed=2)
        want = _want(tree, data) if n < 10 else None
        got = a.run({s: data[s] for s in a.plan.slots_of(rank)})
        if want is not None:
            agree(world, np.array_equal(bits(got), bits(want)), "bits")
        else:
            b = Allreducer(world, tree, n, realization="scatter", timeout=60)
            agree(
                world,
                np.array_equal(bits(got), bits(b.run({s: data[s] for s in b.plan.slots_of(rank)}))),
                "1M",
            )
            b.free()
        a.free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("topology", ["star", "pairwise"])
def test_deliver_to_each_rank_leaves_the_others_untouched(world, topology):
    size, rank = world.Get_size(), world.Get_rank()
    slots, n = 2 * size, 257
    tree = TOPOLOGIES[topology](slots, size)
    data = slot_data(slots, n, seed=3)
    want = _want(tree, data)
    tp = plan(tree, None, n, size=size)
    for name in [k for k, v in applicable(tp).items() if v is None]:
        for target in range(size):
            a = Allreducer(world, tree, n, DeliverTo(target), realization=name, segment=32, timeout=TIMEOUT)
            mine = {s: data[s] for s in a.plan.slots_of(rank)}
            out = np.full(n, -7.25)
            got = a.run(mine, out=out)
            if rank == target:
                agree(world, got is out and np.array_equal(bits(out), bits(want)), f"{name} target bits")
            else:
                agree(world, got is None and np.all(out == -7.25), f"{name} others untouched")
            a.free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("per_rank", [1, 2])
@pytest.mark.parametrize("n", [1, 7, 1000, 20000])
def test_reduce_scatter_returns_each_rank_its_chunk_of_the_oracle(world, per_rank, n):
    size, rank = world.Get_size(), world.Get_rank()
    slots = per_rank * size
    for tree in (hierarchy(range(slots), size, 2), pairwise(range(slots), size)):
        data = slot_data(slots, n, seed=77 + n)
        want = _want(tree, data)
        mine = {s: data[s] for s in plan(tree, None, n, size=size).slots_of(rank)}
        start, stop, chunk = reduce_scatter(world, tree, mine, layout=n)
        agree(world, np.array_equal(bits(chunk), bits(want[start:stop])), "chunk bits")
        bounds = sorted(world.allgather((start, stop)))  # test-side check that the chunks tile the payload
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(b == c for (_, b), (c, _) in zip(bounds, bounds[1:]))
        # The chunks held differ by at most one (halving at p != 2^k leaves some ranks none).
        held = [b - a for a, b in bounds if b > a]
        assert max(held) - min(held) <= 1
    # into a caller's buffer, whole-payload sized: the chunk lands at out[start:stop]
    tree = hierarchy(range(slots), size, 2)
    want = _want(tree, data)
    mine = {s: data[s] for s in plan(tree, None, n, size=size).slots_of(rank)}
    c = ScatterCombiner(world, plan_scatter(tree, ReduceScatter(), n, size=size, segment=16), timeout=TIMEOUT)
    out = np.full(n, 3.5)
    s2, e2, view = c.reduce_scatter_run(mine, out=out)
    agree(world, np.array_equal(bits(out[s2:e2]), bits(want[s2:e2])), "into out")
    agree(world, np.all(np.delete(out, np.arange(s2, e2)) == 3.5), "rest of out untouched")
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
    for name, seg in (("scatter", 8), ("replicate", None), ("tree", None)):
        a = Allreducer(world, tree, layout, realization=name, segment=seg, timeout=TIMEOUT)
        got = a.run({s: (data[s], np.array([counts[s]])) for s in a.plan.slots_of(rank)})
        agree(world, np.array_equal(bits(got), bits(want)), f"{name} weighted")
        # in place: out is one of this rank's contributions
        mine = {s: full[s].copy() for s in a.plan.slots_of(rank)}
        first = a.plan.slots_of(rank)[0]
        got = a.run(mine, out=mine[first])
        agree(world, got is mine[first] and np.array_equal(bits(got), bits(want)), f"{name} in place")
        a.free()


@pytest.mark.mpi(min_size=2)
def test_point_to_point_only_on_a_spy_communicator(world):
    size, rank = world.Get_size(), world.Get_rank()
    spy = SpyComm(world)
    tree = pairwise(range(2 * size), size)
    for n in (301, 9000):
        data = slot_data(2 * size, n, seed=8)
        want = _want(tree, data)
        mine = {s: data[s] for s in plan(tree, None, n, size=size).slots_of(rank)}
        for name in ("auto",) + REALIZATIONS:
            if name in ("butterfly", "halving") and size & (size - 1):
                continue
            a = Allreducer(spy, tree, n, realization=name, segment=50, timeout=TIMEOUT)
            agree(world, np.array_equal(bits(a.run(mine)), bits(want)), name)
            agree(world, np.array_equal(bits(a.run(mine)), bits(want)), name + " again")
        start, stop, chunk = reduce_scatter(spy, tree, mine, layout=n)
        agree(world, np.array_equal(bits(chunk), bits(want[start:stop])), "reduce-scatter on spy")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", ["allreduce", "reduce-scatter"])
def test_a_non_finite_contribution_is_refused_everywhere_after_communication(world, mode):
    size, rank = world.Get_size(), world.Get_rank()
    slots, n = 2 * size, 100
    tree = star(range(slots), size)
    data = slot_data(slots, n, seed=9)
    bad_slot = slots - 1  # owned by the last rank
    bad = dict(data)
    bad[bad_slot] = data[bad_slot].copy()
    bad[bad_slot][3] = np.nan  # coordinate 3 lies in rank 0's chunk
    a = Allreducer(world, tree, n, realization="scatter", mode=mode, segment=16, timeout=TIMEOUT)
    code = refusal_code(lambda: a.run({s: bad[s] for s in a.slots}))
    expected = "non-finite-contribution" if rank == size - 1 else "non-finite-combined"
    agree(world, code == expected, f"refused as {code}, expected {expected}")
    # A clean refusal: the channel is intact and the executor runs again.
    want = _want(tree, data)
    got = a.run({s: data[s] for s in a.slots})
    if mode == "reduce-scatter":  # run() gives the chunk's values, `a.executor.chunk` its bounds
        start, stop = a.executor.chunk
        agree(world, np.array_equal(bits(got), bits(want[start:stop])), "after refusal")
        again = a.reduce_scatter_run({s: data[s] for s in a.slots})
        agree(world, (again.start, again.stop) == (start, stop), "reduce_scatter_run bounds")
        agree(world, np.array_equal(bits(again.values), bits(got)), "reduce_scatter_run values")
    else:
        agree(world, np.array_equal(bits(got), bits(want)), "after refusal")


@pytest.mark.mpi(min_size=2)
def test_overflow_is_refused_as_non_finite_combined(world):
    size, rank = world.Get_size(), world.Get_rank()
    tree = pairwise(range(size), size)
    for name in [k for k, v in applicable(plan(tree, None, 9, size=size)).items() if v is None]:
        a = Allreducer(world, tree, 9, realization=name, timeout=TIMEOUT)
        x = np.full(9, 1.0e308)
        agree(world, refusal_code(lambda: a.run({rank: x})) == "non-finite-combined", f"{name} overflow")


@pytest.mark.mpi(min_size=2)
def test_a_peer_running_another_realization_is_refused_by_name(world):
    """Rank 0 builds the tree realization, the others scatter: the build agreement refuses on
    every rank by name, fast (no frame moves), and the next build on every rank works."""
    import time

    size, rank = world.Get_size(), world.Get_rank()
    tree = star(range(size), size)
    n = 7
    data = slot_data(size, n, seed=1)
    t0 = time.monotonic()
    code = refusal_code(
        lambda: Allreducer(world, tree, n, realization="tree" if rank == 0 else "scatter", timeout=2)
    )
    elapsed = time.monotonic() - t0
    agree(
        world,
        code == "executor-identity-mismatch" and elapsed < 15,
        f"rank {rank}: {code} after {elapsed:.1f}s",
    )
    a = Allreducer(world, tree, n, realization="scatter", timeout=TIMEOUT)
    got = a.run({rank: data[rank]})
    agree(world, np.array_equal(bits(got), bits(_want(tree, data))), "the next build works")
    a.free()


@pytest.mark.mpi(min_size=2)
def test_scatter_frames_name_another_identity_for_another_segment_length(world):
    size, rank = world.Get_size(), world.Get_rank()
    tree = star(range(size), size)
    n = 64 * size
    seg = 8 if rank == 0 else 16
    code = refusal_code(lambda: Allreducer(world, tree, n, realization="scatter", segment=seg, timeout=2))
    agree(world, code == "executor-identity-mismatch", f"rank {rank}: {code}")


@pytest.mark.mpi(min_size=2)
def test_convenience_calls_cache_their_executor(world):
    from alpha_mpi.execution.convenience import cached_executors

    size, rank = world.Get_size(), world.Get_rank()
    tree = pairwise(range(size), size)
    data = slot_data(size, 5, seed=4)
    want = _want(tree, data)

    def ours():  # an earlier test file may have left executors of this tree at other sizes
        return {
            k for k in cached_executors(world) if k.tree == ("tree", tree._placed) and k.mode == "allreduce"
        }

    before = ours()
    seen = []
    for _ in range(3):
        got = allreduce(world, tree, {rank: data[rank]})
        agree(world, np.array_equal(bits(got), bits(want)), "allreduce()")
        seen.append(ours())
    assert len(seen[0] - before) <= 1 and seen[0] == seen[1] == seen[2]  # three calls, one executor
