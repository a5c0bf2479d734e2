"""The index arithmetic of alpha_mpi.torch.SlotSampler (alpha_mpi.learning.epochs) and the
local cut of `step_local` (slice_local): a rank's share of every global batch, and the owned
slots' sizes recovered from the share's length alone."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from alpha_mpi.learning import slice_local, slot_ranges
from alpha_mpi.learning.epochs import epoch_order, epoch_windows, local_sizes, share
from alpha_mpi.model import ReplicateAll, build
from alpha_mpi.planning import plan
from alpha_mpi.refusals import Refusal


def owned_sets(slots, size):
    """Each rank's slots as the planner places the learners' default tree (pairwise)."""
    p = plan(build("pairwise", slots, size), ReplicateAll(), 1, size=size)
    return [list(p.slots_of(r)) for r in range(size)]


def test_an_epoch_is_one_seeded_permutation_the_same_for_the_same_seed_and_epoch():
    a, b = epoch_order(100, 3, 1), epoch_order(100, 3, 1)
    assert np.array_equal(a, b) and sorted(a.tolist()) == list(range(100))
    assert not np.array_equal(a, epoch_order(100, 3, 2)) and not np.array_equal(a, epoch_order(100, 4, 1))
    assert np.array_equal(epoch_order(10, 3, 5, shuffle=False), np.arange(10))
    with pytest.raises(Refusal) as e:
        epoch_order(10, 3, -1)
    assert e.value.code == "usage"


def test_windows_drop_or_keep_the_short_last_batch():
    assert epoch_windows(100, 32) == [(0, 32), (32, 64), (64, 96)]
    assert epoch_windows(100, 32, drop_last=False)[-1] == (96, 100)
    assert epoch_windows(96, 32, drop_last=False) == epoch_windows(96, 32)


@given(
    st.integers(1, 6).flatmap(lambda k: st.tuples(st.just(2**k), st.integers(0, k))),
    st.integers(1, 300),
)
def test_the_shares_of_all_ranks_are_the_global_batch_in_slot_order(sk, extra):
    slots, logp = sk
    size = 2**logp
    batch = slots + extra
    order = epoch_order(batch * 2 + 3, 9, 0)
    window = (batch, 2 * batch)
    parts = [share(order, window, slots, o) for o in owned_sets(slots, size)]
    assert sum(parts, []) == order[batch : 2 * batch].tolist()
    ranges = slot_ranges(batch, slots)
    for o, part in zip(owned_sets(slots, size), parts):
        assert local_sizes(len(part), slots, o) == [ranges[s][1] - ranges[s][0] for s in o]


def test_the_owned_sizes_follow_from_the_length_for_every_batch_and_every_owned_set():
    from alpha_mpi.learning.data import slot_sizes

    slots = 8
    for owned in ([0, 1, 2, 3], [4, 5, 6, 7], [0], [7], [1, 5], [0, 2, 4, 6], list(range(8))):
        for b in range(slots, 200):
            sizes = slot_sizes(b, slots)
            assert local_sizes(sum(sizes[s] for s in owned), slots, owned) == [sizes[s] for s in owned]


def test_a_length_that_is_no_cut_of_the_owned_slots_is_refused_by_name():
    with pytest.raises(Refusal) as e:
        local_sizes(3, 8, [0, 1, 2, 3])  # four slots need four samples at least
    assert e.value.code == "data-invalid"


def test_slice_local_cuts_the_share_into_its_slots_in_order_and_checks_a_given_cut():
    X, y = np.arange(20.0).reshape(10, 2), np.arange(10)
    got = slice_local(X, y, 4, [2, 3], sizes=[2, 2, 5, 5])
    assert [got[s][1].tolist() for s in (2, 3)] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    got = slice_local(X[:7], y[:7], 8, [0, 1, 2, 3])  # 7 = 2 + 2 + 2 + 1 (a batch of 8q + 3)
    assert [len(got[s][1]) for s in range(4)] == [2, 2, 2, 1]
    for bad in ([2, 2, 5, 4], [2, 2, 6, 5], [0, 4, 5, 5]):
        with pytest.raises(Refusal) as e:
            slice_local(X, y, 4, [2, 3], sizes=bad)
        assert e.value.code in ("data-invalid", "usage")
    with pytest.raises(Refusal) as e:
        slice_local(X, y[:9], 4, [2, 3])
    assert e.value.code == "data-invalid"
