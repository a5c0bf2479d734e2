"""The Endpoint (execution/endpoint.py) over MPI: one duplicate per communicator, one tag block per
executor, the verdict round, the tag space, recovery.

Run under `mpiexec -n N python -m pytest --with-mpi` (2 and 5 ranks in CI).
"""

import threading

import numpy as np
import pytest
from mpi4py import MPI

from alpha_mpi import oracle
from alpha_mpi.execution import Allreducer, Endpoint, allreduce
from alpha_mpi.execution.endpoint import TAG_BASE
from alpha_mpi.learning import MLP, DataParallelLearner
from alpha_mpi.model import Branch, Leaf, ReplicateAll, pairwise
from alpha_mpi.planning import plan
from alpha_mpi.refusals import Refusal

from conftest import agree, bits, order_sensitive
from spycomm import SpyComm

SHORT = 20
DUPS = ("Dup", "Idup", "Clone", "Create", "Split")


def _oracle(tree, data):
    return np.array(oracle.evaluate(tree, {s: v.tolist() for s, v in data.items()}))


def _code(fn):
    try:
        fn()
        return None
    except Refusal as e:
        return e.code


@pytest.mark.mpi(min_size=2)
def test_learners_audits_and_executors_duplicate_the_communicator_once(world):
    """An audited, partitioned numpy learner (its combines, assembly, scalar reducer, the two
    audit tables, the replica digests, the start round), a second learner and an Allreducer on
    the same communicator: one library duplicate in all (MPI_Comm_idup, once), nothing else
    duplicated or split but the one Split_type that measures the node."""
    spy = SpyComm(world.Dup())
    model = MLP(6, 5, 3)
    for _ in range(2):
        DataParallelLearner(
            spy,
            model,
            slots=2 * world.Get_size(),
            partition="state",
            audit_slots=1,
            audit_digests=1,
            timeout=SHORT,
        )
    Allreducer(spy, pairwise(range(world.Get_size()), world.Get_size()), 4, timeout=SHORT).free()
    made = [c for c in spy.calls if c in DUPS]
    agree(world, made == ["Idup"], f"rank {world.Get_rank()}: {made}")
    agree(world, spy.calls.count("Split_type") == 0, "Split_type runs on the library duplicate")


@pytest.mark.mpi(min_size=2)
def test_executors_of_one_plan_run_at_once_from_two_threads_without_crossing(world):
    """Two Allreducers of the same plan on one communicator, run at the same time from two
    threads, in opposite orders on odd and even ranks: each has its own tag block, so no frame of
    one is ever matched by the other (with one tag set for both they would cross: the other
    executor's sequence, refused by name). Both give the oracle's bits."""
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        pytest.skip("needs MPI_THREAD_MULTIPLE")
    size, rank = world.Get_size(), world.Get_rank()
    comm = world.Dup()
    n = 257
    tree = pairwise(range(size), size)
    execs = [Allreducer(comm, tree, n, realization="tree", timeout=SHORT) for _ in range(2)]
    agree(world, execs[0].executor.seat.block != execs[1].executor.seat.block, "two executors, two blocks")
    rng = np.random.default_rng(5)
    data = [{s: order_sensitive(rng, n) for s in range(size)} for _ in range(2)]
    want = [_oracle(tree, d) for d in data]
    got, errors = [None, None], []

    def go(k):
        try:
            for _ in range(20):
                got[k] = execs[k].run({rank: data[k][rank]})
        except Exception as e:  # reported through the verdict below
            errors.append(repr(e))

    order = (0, 1) if rank % 2 == 0 else (1, 0)
    threads = [threading.Thread(target=go, args=(k,)) for k in order]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = not errors and all(np.array_equal(bits(got[k]), bits(want[k])) for k in range(2))
    agree(world, ok, f"rank {rank}: {errors}")
    for a in execs:
        a.free()
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_the_tag_space_running_out_is_refused_on_every_rank_and_freeing_makes_room(world):
    """A tag space of a few blocks (MPI_TAG_UB as a small MPI might have it): executors take
    blocks in build order; one more than fits is `tag-space-exhausted` on every rank, never a
    block reused while its holder lives; the failed build leaves the numbering as it was, and
    once the first executor is freed the next build wraps around into its block and works."""
    size, rank = world.Get_size(), world.Get_rank()
    comm = world.Dup()
    ep = Endpoint.of(comm)
    tree = Branch(Leaf(0, 0), Leaf(1, 1 % size), 0) if size > 1 else Leaf(0, 0)
    p = plan(tree, ReplicateAll(), 3, size=size)
    first = Allreducer(comm, p, timeout=SHORT)
    size_of = first.executor.seat.block.size
    ep.tags.ub = first.executor.seat.block.base + 3 * size_of - 1  # room for two more blocks
    kept = [first] + [Allreducer(comm, p, timeout=SHORT) for _ in range(2)]
    bases = [a.executor.seat.block.base for a in kept]
    sequence = ep.next_sequence
    code = _code(lambda: Allreducer(comm, p, timeout=SHORT))
    agree(world, code == "tag-space-exhausted", f"rank {rank}: {code}")
    agree(world, ep.next_sequence == sequence, "the refused build gave its number back")
    first.free()
    again = Allreducer(comm, p, timeout=SHORT)
    agree(world, again.executor.seat.block.base == TAG_BASE and TAG_BASE in bases[:1], f"{bases}")
    data = {s: np.full(3, 2.0**s) for s in range(size)}
    mine = {s: data[s] for s in p.slots_of(rank)}
    got = again.run(mine)  # the tree's leaves are on ranks 0 and 1: the result reaches them only
    ok = got is None if rank > 1 else np.array_equal(bits(got), bits(_oracle(tree, data)))
    agree(world, ok, "the wrapped executor")
    for a in kept[1:] + [again]:
        a.free()


@pytest.mark.mpi(min_size=2)
def test_the_verdict_round_gives_every_rank_every_rank_word_and_status(world):
    """Each rank says its own words (its rank, a 64-bit pattern) and the last rank a refusal:
    every rank receives every rank's words unchanged, sees the same statuses, and raising names
    the refusing rank and its code (the refusing rank raises its own)."""
    size, rank = world.Get_size(), world.Get_rank()
    comm = world.Dup()
    ep = Endpoint.of(comm)
    v = ep.verdict([rank, 0xFFFF_FFFF_FFFF_FFFF - rank, 1 << 63], None, "a test round")
    want = np.array([[r, 0xFFFF_FFFF_FFFF_FFFF - r, 1 << 63] for r in range(size)], dtype=np.uint64)
    agree(world, np.array_equal(v.words, want) and not v.failed, f"rank {rank}: {v}")
    local = Refusal("usage", "this rank's argument is wrong") if rank == size - 1 else None
    v = ep.verdict([], local, "a test round")
    agree(world, v.failed == [size - 1] and v.codes[size - 1] == "usage", f"rank {rank}: {v}")
    try:
        v.raise_failures(local, "testing")
        got = None
    except Refusal as e:
        got = (e.code, e.context.get("peer"), e.context.get("peer_code"))
    want = ("usage", None, None) if rank == size - 1 else ("peer-refused", size - 1, "usage")
    agree(world, got == want, f"rank {rank}: {got}")
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_a_rank_out_of_step_is_named_on_every_rank_and_a_reset_realigns(world):
    """The last rank skipped a round (its round counter is one ahead): the next round names it on
    every rank alike (`executor-identity-mismatch`, `ranks` the last), nobody hangs; after
    `execution.reset` on every rank the rounds pair again."""
    from alpha_mpi.execution import reset

    size, rank = world.Get_size(), world.Get_rank()
    comm = world.Dup()
    ep = Endpoint.of(comm)
    if rank == size - 1:
        ep.rounds += 1
    try:
        ep.verdict([7], None, "a test round")
        got = None
    except Refusal as e:
        got = (e.code, e.context.get("ranks"))
    agree(world, got == ("executor-identity-mismatch", (size - 1,)), f"rank {rank}: {got}")
    reset(comm)
    v = ep.verdict([rank], None, "a test round")
    agree(world, list(v.words[:, 0]) == list(range(size)), "the round after the reset")
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_a_reset_drains_what_a_failed_call_left_and_the_job_ends_cleanly(world):
    """A convenience call that only the last rank makes (a frame of it, and its flag, are left
    on the others' side; the last rank times out): `execution.reset(comm)` on every rank drains
    it, clears the failure for the exit (abort.forgive) and the next call gives the oracle's
    bits."""
    from alpha_mpi.execution import abort, reset

    size, rank = world.Get_size(), world.Get_rank()
    comm = world.Dup()
    tree = pairwise(range(size), size)
    data = {s: np.full(2, 3.0**s) for s in range(size)}
    allreduce(comm, tree, {rank: data[rank]}, timeout=SHORT)
    code = None
    if rank == size - 1:
        code = _code(lambda: allreduce(comm, tree, {rank: data[rank]}, timeout=2))
    agree(world, code == ("peer-timeout" if rank == size - 1 else None), f"rank {rank}: {code}")
    ep = Endpoint.of(comm)
    agree(world, abort.owns_failures(ep) == (rank == size - 1), "the failure is recorded where it happened")
    reset(comm)
    agree(world, not abort.owns_failures(ep), "the reset forgave it: no abort at exit")
    got = allreduce(comm, tree, {rank: data[rank]}, timeout=SHORT)
    agree(world, np.array_equal(bits(got), bits(_oracle(tree, data))), "the call after the reset")
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_a_freed_communicator_s_endpoint_is_forgotten_and_the_next_one_gets_its_own(world):
    """The Endpoint's lookup memo (the communicator object last asked about) is cleared by the
    communicator's Free, so a communicator made after it (MPI may hand out the freed handle
    again) never meets the freed one's Endpoint; two communicators alternating keep their own."""
    size, rank = world.Get_size(), world.Get_rank()
    data = {r: order_sensitive(np.random.default_rng(r), 3) for r in range(size)}
    x = data[rank]
    want = bits(
        np.array(oracle.evaluate(pairwise(range(size), size), {r: v.tolist() for r, v in data.items()}))
    )
    first = world.Dup()
    allreduce(first, x)
    old = Endpoint.existing(first)
    agree(world, old is not None and Endpoint.of(first) is old, "the first communicator's endpoint")
    first.Free()
    with pytest.raises(MPI.Exception):  # as MPI says of a freed communicator: never the old endpoint
        allreduce(first, x)
    second = world.Dup()
    agree(world, Endpoint.existing(second) is None, "a new communicator has no endpoint yet")
    got = allreduce(second, x)
    ep = Endpoint.existing(second)
    agree(world, ep is not None and ep is not old and ep.user is second, "its own endpoint")
    third = world.Dup()
    for _ in range(3):  # alternating: each lookup finds its own communicator's endpoint
        a, b = allreduce(third, x), allreduce(second, x)
        agree(
            world, Endpoint.existing(second) is ep and Endpoint.existing(third).user is third, "alternating"
        )
        agree(world, np.array_equal(bits(a), want) and np.array_equal(bits(b), want), "the oracle's bits")
    agree(world, np.array_equal(bits(got), want), "the oracle's bits")
    second.Free()
    third.Free()
