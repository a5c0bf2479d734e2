"""The convenience calls as MPI users expect them (issue 33 item 5), over MPI at 2 and 5 ranks.

`alpha_mpi.allreduce(comm, x)` with no tree combines one contribution per rank over
`pairwise(range(p), p)`, equal in bits to the oracle; a bare array where a {slot: array} mapping
belongs is refused by name on that rank (`contributions-not-mapping`), `peer-refused` on the
others, on a first (building) call and on a warm one, and the next call works; a first call
whose sizes differ is `executor-identity-mismatch` on every rank, and the next call works; the
payload size is each call's (a warm call whose ranks differ in size: `contribution-size-mismatch`
on every rank, and the next call works).
"""

import numpy as np
import pytest

import alpha_mpi
from alpha_mpi import oracle, pairwise, star
from alpha_mpi.refusals import Refusal

from conftest import agree, bits, slot_data

TIMEOUT = 60


def _want(tree, data):
    return np.array(oracle.evaluate(tree, {s: v.tolist() for s, v in data.items()}))


def _code(fn):
    try:
        fn()
    except Refusal as e:
        return e.code
    return None


@pytest.mark.mpi(min_size=2)
def test_allreduce_without_a_tree_combines_one_contribution_per_rank_over_pairwise(world):
    size, rank = world.Get_size(), world.Get_rank()
    data = slot_data(size, 7, seed=11)  # order-sensitive: another order gives other bits
    want = _want(pairwise(range(size), size), data)
    comm = world.Dup()
    for _ in range(2):  # the first call builds, the second finds the cached executor
        got = alpha_mpi.allreduce(comm, data[rank], timeout=TIMEOUT)
        agree(world, np.array_equal(bits(got), bits(want)), "allreduce(comm, x)")
    comm.Free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("warm", [False, True])
def test_a_bare_array_where_a_mapping_belongs_is_refused_by_name_on_every_rank(world, warm):
    size, rank = world.Get_size(), world.Get_rank()
    comm = world.Dup()  # a communicator no call used: the first call builds
    tree = pairwise(range(size), size)
    data = slot_data(size, 6, seed=12 + warm)
    want = _want(tree, data)
    if warm:
        got = alpha_mpi.allreduce(comm, tree, {rank: data[rank]}, timeout=TIMEOUT)
        agree(world, np.array_equal(bits(got), bits(want)), "warm-up call")
    bad = size - 1
    mine = data[rank] if rank == bad else {rank: data[rank]}
    code = _code(lambda: alpha_mpi.allreduce(comm, tree, mine, timeout=TIMEOUT))
    expected = "contributions-not-mapping" if rank == bad else "peer-refused"
    agree(world, code == expected, f"rank {rank}: {code}, expected {expected}")
    got = alpha_mpi.allreduce(comm, tree, {rank: data[rank]}, timeout=TIMEOUT)  # the next call works
    agree(world, np.array_equal(bits(got), bits(want)), "the call after the refusal")
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_a_first_call_whose_sizes_differ_is_named_on_every_rank_and_the_next_call_works(world):
    """Every rank takes part in the build and asks for another executor: nothing is left on the
    channel, so the refusal does not break the communicator (no combiner-broken, no reset)."""
    size, rank = world.Get_size(), world.Get_rank()
    comm = world.Dup()  # a communicator no call used: the first call builds
    data = slot_data(size, 9, seed=21)
    want = _want(pairwise(range(size), size), data)
    short = data[rank][:-1] if rank == size - 1 else data[rank]
    code = _code(lambda: alpha_mpi.allreduce(comm, short, timeout=TIMEOUT))
    agree(world, code == "executor-identity-mismatch", f"rank {rank}: {code}")
    got = alpha_mpi.allreduce(comm, data[rank], timeout=TIMEOUT)
    agree(world, np.array_equal(bits(got), bits(want)), "the call after the refusal")
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_the_payload_size_is_each_calls_on_every_rank(world):
    """Sizes change from call to call (alike on every rank) without layout=: each call's bits are
    the oracle's for its data, across realizations (8 B to 64 KiB + picks butterfly or halving),
    and a size met before takes its parked executor back instead of building again."""
    from alpha_mpi.execution.convenience import cached_executors

    size, rank = world.Get_size(), world.Get_rank()
    comm = world.Dup()
    tree = pairwise(range(size), size)
    for i, n in enumerate((7, 1, 7, 9000, 3, 7, 9000)):
        data = slot_data(size, n, seed=40 + i)
        got = alpha_mpi.allreduce(comm, data[rank], timeout=TIMEOUT)
        agree(world, np.array_equal(bits(got), bits(_want(tree, data))), f"call {i}: {n} elements")
        got = alpha_mpi.allreduce(comm, tree, {rank: data[rank]}, timeout=TIMEOUT)  # the same tree, named
        agree(world, np.array_equal(bits(got), bits(_want(tree, data))), f"call {i} with the tree")
    held = len(cached_executors(comm))
    agree(world, held == 4, f"{held} executors cached (one tree, 4 sizes)")
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_a_weighted_payload_and_a_reduce_scatter_take_each_calls_size(world):
    size, rank = world.Get_size(), world.Get_rank()
    comm = world.Dup()
    tree = pairwise(range(size), size)
    for i, n in enumerate((5, 12, 5)):
        num, mass = slot_data(size, n, seed=60 + i), slot_data(size, 1, seed=70 + i)
        got = alpha_mpi.allreduce(comm, tree, {rank: (num[rank], mass[rank])}, timeout=TIMEOUT)
        want = _want(tree, {s: np.concatenate([num[s], mass[s]]) for s in num})
        agree(world, np.array_equal(bits(got), bits(want)), f"weighted call {i}: {n} + 1")
        data = slot_data(size, 4 * size + i, seed=80 + i)
        chunk = alpha_mpi.reduce_scatter(comm, tree, {rank: data[rank]}, timeout=TIMEOUT)
        whole = _want(tree, data)
        ok = np.array_equal(bits(chunk.values), bits(whole[chunk.start : chunk.stop]))
        agree(world, ok, f"reduce_scatter call {i}: {data[rank].size} elements")
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_a_warm_call_whose_sizes_differ_is_named_on_every_rank_and_the_next_call_works(world):
    """One rank passes another size on a warm call: every rank refuses
    `contribution-size-mismatch` naming that rank and its size, nothing is combined, no reset is
    needed: the next calls (the old size, then a new one) work."""
    size, rank = world.Get_size(), world.Get_rank()
    comm = world.Dup()
    tree = pairwise(range(size), size)
    data = slot_data(size, 6, seed=90)
    got = alpha_mpi.allreduce(comm, data[rank], timeout=TIMEOUT)
    agree(world, np.array_equal(bits(got), bits(_want(tree, data))), "warm-up call")
    odd = size - 1
    mine = np.concatenate([data[rank], data[rank]]) if rank == odd else data[rank]
    try:
        alpha_mpi.allreduce(comm, mine, timeout=TIMEOUT)
        said = None
    except Refusal as e:
        said = e
    ok = (
        said is not None
        and said.code == "contribution-size-mismatch"
        and f"rank {odd}: 12 elements" in said.message
        and "rank rank" not in said.message
    )
    agree(world, ok, f"rank {rank}: {said!r}")
    for n in (6, 11):
        data = slot_data(size, n, seed=91 + n)
        got = alpha_mpi.allreduce(comm, data[rank], timeout=TIMEOUT)
        agree(world, np.array_equal(bits(got), bits(_want(tree, data))), f"the call after the refusal ({n})")
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_another_refusal_in_a_resized_call_keeps_its_own_name(world):
    """Every rank changes size, one of them with a float32 payload: the call is rerun at the new
    size and refused there by that rank's own code (`dtype-invalid`), `peer-refused` elsewhere."""
    size, rank = world.Get_size(), world.Get_rank()
    comm = world.Dup()
    tree = pairwise(range(size), size)
    data = slot_data(size, 4, seed=95)
    alpha_mpi.allreduce(comm, data[rank], timeout=TIMEOUT)
    data = slot_data(size, 8, seed=96)
    mine = data[rank].astype(np.float32) if rank == 0 else data[rank]
    code = _code(lambda: alpha_mpi.allreduce(comm, mine, timeout=TIMEOUT))
    expected = "dtype-invalid" if rank == 0 else "peer-refused"
    agree(world, code == expected, f"rank {rank}: {code}, expected {expected}")
    got = alpha_mpi.allreduce(comm, data[rank], timeout=TIMEOUT)
    agree(world, np.array_equal(bits(got), bits(_want(tree, data))), "the call after the refusal")
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_the_steady_loop_fast_path_follows_every_form_of_the_call(world):
    """A plain call finds the last plain call's executor by its tree alone: mixing the bare form,
    the named tree, another realization, out=, a resize and a reset keeps every call's bits."""
    from alpha_mpi.execution import reset

    size, rank = world.Get_size(), world.Get_rank()
    comm = world.Dup()
    tree = pairwise(range(size), size)
    other = star(range(size), size)  # another order over the same slots
    calls = [
        lambda x: alpha_mpi.allreduce(comm, x, timeout=None),
        lambda x: alpha_mpi.allreduce(comm, tree, {rank: x}),
        lambda x: alpha_mpi.allreduce(comm, tree, {rank: x}, realization="tree"),
        lambda x: alpha_mpi.allreduce(comm, x, out=np.empty_like(x)),
        lambda x: alpha_mpi.allreduce(comm, other, {rank: x}),
    ]
    for i in range(12):
        data = slot_data(size, 5 if i < 6 else 3, seed=100 + i)
        call = calls[i % len(calls)]
        t = other if i % len(calls) == 4 else tree
        got = call(data[rank])
        agree(world, np.array_equal(bits(got), bits(_want(t, data))), f"call {i}")
        if i == 7:
            reset(comm)
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_the_steady_calls_found_by_identity_follow_resizes_resets_and_freed_communicators(world):
    """The steady calls' memo (convenience._STEADY: the last plain calls' executors by endpoint,
    tree object and layout=) never runs an executor the cache dropped: the bare form resized and
    back, the layout= form, out=, a reset, a freed communicator and its successor keep every
    call's bits (the oracle's, on order-sensitive data)."""
    from alpha_mpi.execution import reset

    size, rank = world.Get_size(), world.Get_rank()
    tree = pairwise(range(size), size)
    for round_ in range(2):
        comm = world.Dup()
        for i, n in enumerate([5, 5, 3, 3, 5, 1, 1]):
            data = slot_data(size, n, seed=200 + 10 * round_ + i)
            want = bits(_want(tree, data))
            forms = (
                lambda x: alpha_mpi.allreduce(comm, x),
                lambda x: alpha_mpi.allreduce(comm, tree, {rank: x}, layout=n),
                lambda x: alpha_mpi.allreduce(comm, x, out=np.empty_like(x)),
            )
            for j, form in enumerate(forms):
                got = form(data[rank])
                agree(world, np.array_equal(bits(got), want), f"round {round_}, call {i}, form {j}")
            if i == 3:
                reset(comm)
        comm.Free()
