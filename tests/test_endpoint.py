"""The Endpoint and the verdict round in one process (COMM_SELF and duplicates of it)."""

import numpy as np
import pytest
from mpi4py import MPI

from alpha_mpi.execution import Allreducer, Endpoint, verdict
from alpha_mpi.execution.endpoint import TAG_BASE, TagBlock, block_size
from alpha_mpi.model import Leaf
from alpha_mpi.refusals import Refusal


@pytest.fixture
def comm():
    c = MPI.COMM_SELF.Dup()
    yield c
    c.Free()


def test_one_endpoint_per_communicator_kept_on_it(comm):
    ep = Endpoint.of(comm)
    assert Endpoint.of(comm) is ep and Endpoint.existing(comm) is ep
    other = MPI.COMM_SELF.Dup()
    try:
        assert Endpoint.existing(other) is None
        assert Endpoint.of(other) is not ep
    finally:
        other.Free()


def test_a_record_carries_status_code_and_words_unchanged(comm):
    ep = Endpoint.of(comm)
    v = ep.verdict([0, 2**64 - 1, 12345], None, "a test round")
    assert v.status == (verdict.OK,) and v.words.tolist() == [[0, 2**64 - 1, 12345]]
    assert not v.words.flags.writeable
    v = ep.verdict([1], Refusal("usage", "no"), "a test round")
    assert v.failed == [0] and v.codes == ("usage",)
    v = ep.verdict([1], KeyError("k"), "a test round")
    assert v.status == (verdict.RAISED,) and v.code_of(0) == "an unexpected KeyError"


def test_blocks_follow_the_build_order_and_give_each_message_two_tags(comm):
    ep = Endpoint.of(comm)
    a = Allreducer(comm, Leaf(0, 0), 4)
    b = Allreducer(comm, Leaf(0, 0), 4)
    ba, bb = a.executor.seat.block, b.executor.seat.block
    assert ba.base == TAG_BASE and bb.base == ba.base + ba.size  # one rank: no message, the flag tag
    assert (ba.size, block_size(3), TagBlock(10, 7).flag_tag, TagBlock(10, 7).messages) == (1, 7, 16, 3)
    assert (a.executor.sequence, b.executor.sequence) == (0, 1) and ep.next_sequence == 2
    a.free()
    assert TAG_BASE not in ep.tags.live and bb.base in ep.tags.live


def test_a_full_tag_space_refuses_by_name_and_wraps_once_freed(comm):
    ep = Endpoint.of(comm)
    ep.tags.ub = TAG_BASE + 1  # two tags: two one-tag blocks
    a, b = Allreducer(comm, Leaf(0, 0), 4), Allreducer(comm, Leaf(0, 0), 4)
    with pytest.raises(Refusal) as e:
        Allreducer(comm, Leaf(0, 0), 4)
    assert e.value.code == "tag-space-exhausted" and ep.next_sequence == 2
    a.free()
    c = Allreducer(comm, Leaf(0, 0), 4)
    assert c.executor.seat.block.base == TAG_BASE and c.executor.sequence == 2
    assert np.array_equal(c.run({0: np.arange(4.0)}), np.arange(4.0))
    b.free()
    c.free()


def test_a_broken_executor_keeps_its_block(comm):
    a = Allreducer(comm, Leaf(0, 0), 4)
    a.executor.broken = "peer-timeout"
    a.free()
    assert a.executor.seat.block.base in Endpoint.of(comm).tags.live
