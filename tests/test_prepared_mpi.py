"""Prepared runs keyed by geometry (issue 42 items 1 and 2), over MPI at 2 and 5 ranks.

Every front end runs the executor through its PreparedRun (execution/prepared.py), which binds
each call's arrays by their geometry: new arrays of a known geometry run with no rebuild and no
verdict round; an array whose strides or size changed in place between warm runs is read where
and as it is now (or refused by name), never through the old layout (a bound array is pinned:
NumPy refuses to resize it until another is bound); a misaligned contribution
is copied, a misaligned `out` refused by name (`out-invalid`, `peer-refused` on the others) and
the next call works; an `out` that overlaps a contribution gets the result; two handles
alternate. Every result is compared bit for bit (uint64 views) with the independent oracle, on
data where another order gives other bits.
"""

import warnings

import numpy as np
import pytest
from array_oracle import oracle_dot

import alpha_mpi
from alpha_mpi import arrays, oracle, pairwise
from alpha_mpi.execution import Allreducer
from alpha_mpi.execution.convenience import cached_executors
from alpha_mpi.execution.endpoint import Endpoint
from alpha_mpi.refusals import Refusal

from conftest import agree, bits, order_sensitive, refusal_code

TIMEOUT = 60
SIZES = (7, 9000)  # a small payload (computed in the engine's buffer) and a split one (into `out`)


def _want(tree, data):
    return np.array(oracle.evaluate(tree, {s: np.asarray(v).tolist() for s, v in data.items()}))


def _same(got, want) -> bool:
    return got is not None and np.array_equal(bits(got), bits(want))


def _fresh(rng, size, n):
    """Every rank's contribution, new arrays (the same on every rank for one rng state)."""
    return {s: order_sensitive(rng, n) for s in range(size)}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("n", SIZES)
def test_new_arrays_every_call_rebind_with_no_rebuild_and_no_round(world, n):
    size, rank = world.Get_size(), world.Get_rank()
    tree = pairwise(range(size), size)
    comm = world.Dup()
    a = Allreducer(comm, tree, n, timeout=TIMEOUT)
    ep = Endpoint.of(comm)
    rng = np.random.default_rng(40 + n)
    rounds = None
    ok = True
    for i in range(5):
        data = _fresh(rng, size, n)
        want = _want(tree, data)
        out = np.empty(n) if i % 2 else None  # a new `out` too, every other call
        ok &= _same(a.run({rank: data[rank]}, out=out), want)
        ok &= _same(alpha_mpi.allreduce(comm, data[rank] * 1.0), want)  # a new array, no tree
        if i == 0:
            rounds, built = ep.rounds, len(cached_executors(comm))
    agree(world, ok, "new arrays every call")
    agree(world, ep.rounds == rounds and len(cached_executors(comm)) == built, "no rebuild, no round")
    a.free()
    alpha_mpi.execution.reset(comm)
    comm.Free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("n", SIZES)
def test_strides_changed_in_place_between_warm_runs_are_read_as_they_are_now(world, n):
    size, rank = world.Get_size(), world.Get_rank()
    tree = pairwise(range(size), size)
    comm = world.Dup()
    a = Allreducer(comm, tree, n, timeout=TIMEOUT)
    rng = np.random.default_rng(50 + n)
    bases = {s: order_sensitive(rng, 2 * n) for s in range(size)}
    views = {s: b[:n] for s, b in bases.items()}  # contiguous, of one geometry
    ok = True
    for _ in range(2):  # warm: the geometry is bound
        ok &= _same(a.run({rank: views[rank]}), _want(tree, views))
        ok &= _same(alpha_mpi.allreduce(comm, views[rank]), _want(tree, views))
    for v in views.values():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # NumPy 2.4 deprecates it; it still works
            v.strides = (16,)  # every other element of its base: not the memory bound before
    want = _want(tree, {s: b[::2] for s, b in bases.items()})
    assert not np.array_equal(bits(want), bits(_want(tree, {s: b[:n] for s, b in bases.items()})))
    ok &= _same(a.run({rank: views[rank]}), want)
    ok &= _same(alpha_mpi.allreduce(comm, views[rank]), want)
    agree(world, ok, "strides changed in place")
    a.free()
    alpha_mpi.execution.reset(comm)
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_a_bound_contribution_is_pinned_and_once_unbound_is_rebound_where_its_data_is(world):
    size, rank = world.Get_size(), world.Get_rank()
    n = 9
    tree = pairwise(range(size), size)
    comm = world.Dup()
    a = Allreducer(comm, tree, n, timeout=TIMEOUT)
    rng = np.random.default_rng(60)
    data = _fresh(rng, size, n)
    x = data[rank].copy()
    agree(world, _same(a.run({rank: x}), _want(tree, data)), "warm")
    try:
        x.resize(3 * n, refcheck=False)  # bound: pinned, its data cannot move under the handle
        pinned = False
    except ValueError:
        pinned = True
    agree(world, pinned, "a bound array is pinned")
    agree(world, _same(a.run({rank: data[rank]}), _want(tree, data)), "another array bound")
    bad = size - 1
    if rank == bad:
        x.resize(3 * n, refcheck=False)  # free now: the data moves under the same object
    code = refusal_code(lambda: a.run({rank: x}))
    agree(world, code == ("contribution-shape" if rank == bad else "peer-refused"), f"got {code}")
    if rank == bad:
        x.resize(n, refcheck=False)  # the payload's length again, the data perhaps elsewhere
        x[:] = data[rank]
    agree(world, _same(a.run({rank: x}), _want(tree, data)), "rebound where the data is now")
    a.free()
    comm.Free()


def _misaligned(values):
    """A read-only float64 view of `values` at an odd address."""
    raw = np.zeros(8 * values.size + 1, dtype=np.uint8)
    raw[1:] = values.view(np.uint8)
    v = np.frombuffer(raw.data, dtype=np.float64, count=values.size, offset=1)
    assert not v.flags.aligned and np.array_equal(bits(v), bits(values))
    return v


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("n", SIZES)
def test_a_misaligned_contribution_is_copied_and_a_misaligned_out_refused_by_name(world, n):
    size, rank = world.Get_size(), world.Get_rank()
    tree = pairwise(range(size), size)
    comm = world.Dup()
    a = Allreducer(comm, tree, n, timeout=TIMEOUT)
    rng = np.random.default_rng(70 + n)
    data = _fresh(rng, size, n)
    want = _want(tree, data)
    ok = _same(a.run({rank: data[rank]}), want)  # warm, aligned
    ok &= _same(a.run({rank: _misaligned(data[rank])}), want)  # the same geometry, misaligned
    ok &= _same(alpha_mpi.allreduce(comm, _misaligned(data[rank])), want)
    agree(world, ok, "a misaligned contribution is copied")
    bad = 0
    raw = np.zeros(8 * n + 1, dtype=np.uint8)
    out = np.empty(n)
    if rank == bad:
        out = np.ndarray((n,), dtype=np.float64, buffer=raw, offset=1)  # writeable, misaligned
        assert out.flags.writeable and not out.flags.aligned
    code = refusal_code(lambda: a.run({rank: data[rank]}, out=out))
    agree(world, code == ("out-invalid" if rank == bad else "peer-refused"), f"got {code}")
    agree(world, _same(a.run({rank: data[rank]}, out=np.empty(n)), want), "the next call works")
    a.free()
    alpha_mpi.execution.reset(comm)
    comm.Free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("n", SIZES)
def test_an_out_that_overlaps_a_contribution_gets_the_result(world, n):
    size, rank = world.Get_size(), world.Get_rank()
    tree = pairwise(range(size), size)
    comm = world.Dup()
    a = Allreducer(comm, tree, n, timeout=TIMEOUT)
    rng = np.random.default_rng(80 + n)
    ok = True
    for i in range(3):
        data = _fresh(rng, size, n)
        want = _want(tree, data)
        buf = np.empty(n + 1)
        buf[i % 2 :][:n] = data[rank]
        x = buf[i % 2 :][:n]
        out = x if i != 1 else np.empty(n)  # in place, then another `out`, then in place again
        got = a.run({rank: x}, out=out)
        ok &= got is out and _same(out, want)
    agree(world, ok, "out overlapping a contribution")
    a.free()
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_two_handles_alternate_with_new_arrays(world):
    size, rank = world.Get_size(), world.Get_rank()
    tree = pairwise(range(size), size)
    comm = world.Dup()
    reducers = [
        Allreducer(comm, tree, 5, realization="tree", timeout=TIMEOUT),
        Allreducer(comm, tree, 5, realization="replicate", timeout=TIMEOUT),
        Allreducer(comm, tree, 9000, timeout=TIMEOUT),
    ]
    rng = np.random.default_rng(90)
    ok = True
    for i in range(9):
        a = reducers[i % 3]
        n = 5 if i % 3 < 2 else 9000
        data = _fresh(rng, size, n)
        want = _want(tree, data)
        ok &= _same(a.run({rank: data[rank]}), want)
        ok &= _same(alpha_mpi.allreduce(comm, data[rank]), want)  # the convenience calls in turn
    agree(world, ok, "alternating handles")
    for a in reducers:
        a.free()
    alpha_mpi.execution.reset(comm)
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_arrays_dot_with_new_and_restrided_blocks_gives_the_oracle_bits(world):
    size, rank = world.Get_size(), world.Get_rank()
    length = 37
    n = size * length
    comm = world.Dup()
    rng = np.random.default_rng(100)
    ok = True
    for _ in range(4):
        xs = order_sensitive(rng, n)
        ys = order_sensitive(rng, n)
        lo = rank * length
        x, y = xs[lo : lo + length].copy(), ys[lo : lo + length].copy()  # new blocks every call
        ok &= np.float64(arrays.dot(comm, x, y, lo, n)).view(np.uint64) == np.float64(
            oracle_dot(xs.tolist(), ys.tolist())
        ).view(np.uint64)
    base = order_sensitive(np.random.default_rng(101), 2 * n)  # the same on every rank
    x = base[2 * rank * length :][:length]
    y = np.ones(length)
    arrays.dot(comm, x, y, rank * length, n)  # warm with this very x
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        x.strides = (16,)
    whole = np.concatenate([base[2 * r * length :][: 2 * length : 2] for r in range(size)])
    want = oracle_dot(whole.tolist(), [1.0] * n)
    ok &= np.float64(arrays.dot(comm, x, y, rank * length, n)).view(np.uint64) == np.float64(want).view(
        np.uint64
    )
    agree(world, ok, "arrays.dot, new and restrided blocks")
    arrays.reset(comm)
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_a_refused_call_leaves_the_handle_usable(world):
    size, rank = world.Get_size(), world.Get_rank()
    tree = pairwise(range(size), size)
    comm = world.Dup()
    a = Allreducer(comm, tree, 4, timeout=TIMEOUT)
    data = _fresh(np.random.default_rng(110), size, 4)
    mine = data[rank].astype(np.float32) if rank == 0 else data[rank]  # refused on rank 0
    code = refusal_code(lambda: a.run({rank: mine}))
    agree(world, code == ("dtype-invalid" if rank == 0 else "peer-refused"), f"got {code}")
    agree(world, _same(a.run({rank: data[rank]}), _want(tree, data)), "the next call")
    with pytest.raises(Refusal) as e:
        a.prepared.reduce_scatter_run({rank: data[rank]})
    assert e.value.code == "plan-delivery-mismatch"
    a.free()
    comm.Free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("n", SIZES)
def test_a_freed_allreducer_refuses_to_run_by_name(world, n):
    """run() after free() on every rank: `executor-freed` (local, on every rank alike), never an
    IndexError from the freed table, whether the contribution is the bound one or a new one."""
    size, rank = world.Get_size(), world.Get_rank()
    tree = pairwise(range(size), size)
    comm = world.Dup()
    a = Allreducer(comm, tree, n, timeout=TIMEOUT)
    rng = np.random.default_rng(91)
    data = _fresh(rng, size, n)
    ok = _same(a.run({rank: data[rank]}), _want(tree, data))
    a.free()
    codes = [
        refusal_code(lambda: a.run({rank: data[rank]})),
        refusal_code(lambda: a.run({rank: data[rank].copy()})),
    ]
    agree(world, ok and codes == ["executor-freed"] * 2, f"after free: {codes}")
    comm.Free()
