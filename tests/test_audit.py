"""The audit's pure parts (issue 24), without MPI: the digest sees every single flipped bit, the
rotation meets every slot within ceil(S/K) steps, the fault hook flips exactly what it says, and
the exit-98 report says how to resume without the node."""

import math

import numpy as np
import pytest

from alpha_mpi.learning.audit import audited_slots, payload_digest, sdc_report
from alpha_mpi.learning.replicas import replicated_digest
from alpha_mpi.refusals import Refusal
from alpha_mpi_verify.faults import BitFlip


def test_every_single_bit_flip_changes_the_payload_digest():
    x = np.random.default_rng(1).standard_normal(67)
    d = payload_digest(x)
    seen = {d}
    for i in range(len(x)):
        for b in range(64):
            y = x.copy()
            y.view(np.uint64)[i] ^= np.uint64(1) << np.uint64(b)
            dy = payload_digest(y)
            assert dy != d, (i, b)
            seen.add(dy)
    assert len(seen) == 1 + 64 * len(x)  # and no two flips collide either


def test_replicated_digest_chains_arrays_in_order():
    a, b = np.arange(5.0), np.arange(7.0) / 3
    assert replicated_digest([a, b]) == replicated_digest([a, b.copy()])
    assert replicated_digest([a, b]) != replicated_digest([b, a])
    c = b.copy()
    c.view(np.uint64)[6] ^= np.uint64(1)
    assert replicated_digest([a, b]) != replicated_digest([a, c])


@pytest.mark.parametrize("slots,k", [(8, 1), (8, 3), (6, 6), (5, 2)])
def test_rotation_meets_every_slot_within_ceil_s_over_k_steps(slots, k):
    for start in range(slots):
        seen = set()
        for t in range(start, start + math.ceil(slots / k)):
            got = audited_slots(t, k, slots)
            assert len(got) == len(set(got)) == k
            seen.update(got)
        assert seen == set(range(slots)), (start, seen)


def test_bitflip_flips_exactly_its_bit_on_its_rank_step_and_slot():
    hook = BitFlip(rank=1, step=2, element=3, bit=51, slot=4)
    buf = np.ones(6)
    for rank, step, slot in [(0, 2, 4), (1, 1, 4), (1, 3, 4), (1, 2, 5)]:
        hook(rank, step, slot, buf)
    assert np.array_equal(buf, np.ones(6)) and hook.hits == []
    hook(1, 2, 4, buf)
    want = np.ones(6)
    want.view(np.uint64)[3] ^= np.uint64(1) << np.uint64(51)
    assert np.array_equal(buf.view(np.uint64), want.view(np.uint64)) and hook.hits == [(2, 4)]
    persistent = BitFlip(rank=0, step=2, element=0, bit=0, persistent=True)
    for t in range(5):
        persistent(0, t, 0, np.zeros(1))
    assert [t for t, _ in persistent.hits] == [2, 3, 4]


def test_sdc_report_says_how_to_resume_without_the_node():
    e = Refusal("sdc-detected", "step 3: ...", step=3, ranks=(2,), hosts=("node17",))
    text = sdc_report(e, "ck", 4)
    assert "[sdc-detected]" in text and "--exclude=node17" in text and "--checkpoint-dir ck --resume" in text
    assert "saved in ck" in text
    bare = sdc_report(e, None, 4)
    assert "node17" in bare and "--checkpoint-dir" in bare and "--exclude" not in bare
    rd = sdc_report(Refusal("replica-diverged", "after step 4: ...", step=4, ranks=(1,)), "ck", 3)
    assert "[replica-diverged]" in rd and "--resume-from" in rd
