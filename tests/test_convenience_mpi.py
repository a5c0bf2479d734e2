"""The convenience calls as MPI users expect them (issue 33 item 5), over MPI at 2 and 5 ranks.

`alpha_mpi.allreduce(comm, x)` with no tree combines one contribution per rank over
`pairwise(range(p), p)`, equal in bits to the oracle; a bare array where a {slot: array} mapping
belongs is refused by name on that rank (`contributions-not-mapping`), `peer-refused` on the
others, on a first (building) call and on a warm one, and the next call works; a first call
whose sizes differ is `executor-identity-mismatch` on every rank, and the next call works.
"""

import numpy as np
import pytest

import alpha_mpi
from alpha_mpi import oracle, pairwise
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
    comm = world.Dup()  # the payload size is still the first call's per tree (see the docs)
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
