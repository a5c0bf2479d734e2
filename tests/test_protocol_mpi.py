"""The protocol under mistakes (issue 22): size-safe receives, executor identity agreed at
construction, flags that reach every rank, validated timeouts, the convenience calls' cache.

Run under `mpiexec -n 2` and `-n 5` (MPICH) and under Open MPI with CMA on (the default), where
a receive posted smaller than the message used to be overrun. Every verdict is gathered, so a
failure fails on every rank.
"""

import numpy as np
import pytest

from alpha_mpi import Branch, DeliverTo, Leaf, Refusal, ReplicateAll, oracle, plan, star
from alpha_mpi.execution import Allreducer, Combiner, allreduce
from alpha_mpi.execution import frames as fr

from conftest import agree, bits, refusal_code, slot_data

SHORT = 3.0


def _sum_tree(size):
    return star(range(size), size)


def _want(tree, data):
    return np.array(oracle.evaluate(tree, {s: v.tolist() for s, v in data.items()}))


# -- size-safe receives -------------------------------------------------------------------------
# A message of another size can arrive on a frame's tag: from user traffic where it can reach the
# executor's channel (dup=False on a user communicator), and from a buggy or hostile rank on the
# library's duplicate too (tests/test_overrun_mpi.py). The executor matches every frame first and
# receives it only into a buffer of its size (execution/receives.py); ALPHA_MPI_RECEIVES=posted
# (measurement only) lets an executor alone on its tag block post its receives instead.


@pytest.mark.mpi(min_size=2)
def test_every_channel_matches_frames_first(world, monkeypatch):
    """dup=True (a tag block of the executor's own on the endpoint's duplicate), dup=False on a
    user communicator, and the convenience calls' shared stream block: every frame matched first
    (probe). With ALPHA_MPI_RECEIVES=posted only the executor alone on its block posts."""
    from alpha_mpi.execution.convenience import cached_executors

    size, rank = world.Get_size(), world.Get_rank()
    p = plan(Branch(Leaf(0, 0), Leaf(1, 1), 0), DeliverTo(0), 4, size=size)
    own = Combiner(world, p, timeout=SHORT)
    comm = world.Dup()
    user = Combiner(comm, p, timeout=SHORT, dup=False)
    allreduce(comm, _sum_tree(size), {rank: np.ones(3)}, timeout=SHORT)
    conv = next(iter(cached_executors(comm).values())).executor
    monkeypatch.setenv("ALPHA_MPI_RECEIVES", "posted")
    posted = Combiner(world, p, timeout=SHORT)
    shared = Combiner(comm, p, timeout=SHORT, dup=False)
    got = (own.probe, user.probe, conv.probe, posted.probe, shared.probe)
    agree(world, got == (True, True, True, False, True), f"{got}")
    for e in (own, user, posted, shared):
        e.free()
    comm.Free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("n, extra", [(600, 8192), (600, 3), (20000, 8192)])
def test_a_longer_frame_is_refused_by_name_and_never_written_past_the_buffer(world, n, extra):
    """Rank 1 sends rank 0 a message `extra` bytes longer than the planned frame (n = 20000:
    longer than the planned header message of a split frame) on the executor's channel and tag
    (a user communicator, dup=False). Rank 0 refuses `frame-size-mismatch`, and its planned
    receive buffer was not written (the message went whole into a scratch buffer): under Open
    MPI's CMA path a posted receive of the planned size used to be overrun by the whole excess
    (1,100 bytes past a 4,928-byte frame). (With the one failure path the engine itself puts
    zeros where a refused frame's payload lands, so the payload bytes read 0, never the rogue
    0xA5; the header bytes keep the test's 0x3C.)"""
    size, rank = world.Get_size(), world.Get_rank()
    p = plan(Branch(Leaf(0, 0), Leaf(1, 1), 0), DeliverTo(0), n, size=size)
    comm = world.Dup()  # a user communicator: dup=False lets user traffic reach the channel
    c = Combiner(comm, p, timeout=SHORT, dup=False)
    x = next(iter(c.compiled.msgs.values())) if rank in (0, 1) else None
    code, untouched = None, True
    if rank == 1:
        rogue = np.full(x.nbytes + extra, 0xA5, dtype=np.uint8)
        c.comm.Send(rogue, dest=0, tag=x.tag)
    elif rank == 0:
        x.hbuf[:] = 0x3C
        code = refusal_code(lambda: c.run({0: np.ones(n)}))
        untouched = bool(np.all(x.hbuf[: fr.HEADER] == 0x3C) and np.all(x.hbuf[fr.HEADER :] == 0))
    ok = code == ("frame-size-mismatch" if rank == 0 else None) and untouched
    agree(world, ok, f"rank {rank}: {code}, planned buffer untouched={untouched}")
    c.free()
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_a_longer_payload_behind_a_good_header_is_refused_and_never_written_past_its_region(world):
    """A split frame (n = 20000: header message, then the payload into its region): the header
    is the planned one, the payload 8 KiB longer (on a user communicator, dup=False). Refused
    `frame-size-mismatch`; the region the payload was planned for is not written by MPI (the
    engine puts its zeros there, in place of the refused payload, never the rogue 0xA5) and
    nothing else of its work buffer is written."""
    size, rank = world.Get_size(), world.Get_rank()
    n = 20000
    p = plan(Branch(Leaf(0, 0), Leaf(1, 1), 0), DeliverTo(0), n, size=size)
    comm = world.Dup()  # a user communicator: dup=False lets user traffic reach the channel
    c = Combiner(comm, p, timeout=SHORT, dup=False)
    code, untouched = None, True
    if rank in (0, 1):
        x = next(iter(c.compiled.msgs.values()))
    if rank == 1:
        head = np.zeros(fr.HEADER, dtype=np.uint8)
        x.spec.write(head, 0)
        c.comm.Send(head, dest=0, tag=x.tag)
        c.comm.Send(np.full(8 * n + 8192, 0xA5, dtype=np.uint8), dest=0, tag=x.tag + 1)
    elif rank == 0:
        region = x.pview  # a work-buffer region (static): never None here
        whole = next(b for b in c.compiled.bufs.values() if np.shares_memory(b, region))
        whole[:] = 2.5
        code = refusal_code(lambda: c.run({0: np.ones(n)}))
        lo = (region.__array_interface__["data"][0] - whole.__array_interface__["data"][0]) // 8
        rest = np.concatenate([whole[:lo], whole[lo + n :]])
        untouched = bool(np.all(region == 0) and np.all(rest == 2.5))
    agree(world, code == ("frame-size-mismatch" if rank == 0 else None) and untouched, f"rank {rank}: {code}")
    c.free()
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_a_longer_frame_with_another_plans_header_is_named_by_its_header(world):
    """A longer frame whose header arrived intact is named by what the header says (here:
    another plan identity), not only by its size."""
    size, rank = world.Get_size(), world.Get_rank()
    n = 600
    p = plan(Branch(Leaf(0, 0), Leaf(1, 1), 0), DeliverTo(0), n, size=size)
    comm = world.Dup()  # a user communicator: dup=False lets user traffic reach the channel
    c = Combiner(comm, p, timeout=SHORT, dup=False)
    code = None
    if rank == 1:
        x = next(iter(c.compiled.msgs.values()))
        buf = np.zeros(x.nbytes + 8192, dtype=np.uint8)
        x.spec.write(buf, 0)
        buf[40:56] ^= 0x5A  # the plan identity field: another plan
        fr.patch(memoryview(buf), 0, 0)
        c.comm.Send(buf, dest=0, tag=x.tag)
    elif rank == 0:
        code = refusal_code(lambda: c.run({0: np.ones(n)}))
    agree(world, code == ("frame-identity-mismatch" if rank == 0 else None), f"rank {rank}: {code}")
    c.free()
    comm.Free()


# -- executor identity ----------------------------------------------------------------------------
@pytest.mark.mpi(min_size=2)
def test_a_constructor_refused_on_one_rank_is_refused_on_every_rank_and_nothing_shifts(world):
    """Three fresh Allreducers; the last rank's first constructor refuses (timeout="soon"), the
    user catches it. Every rank refuses the first by name (`usage` there, `peer-refused`
    elsewhere), and the second and third give their own sums: no call pairs with another."""
    size, rank = world.Get_size(), world.Get_rank()
    tree = _sum_tree(size)
    codes = []
    for k in range(3):
        data = {s: np.full(3, float((k + 1) * 10**s)) for s in range(size)}
        bad = k == 0 and rank == size - 1
        code, got = None, None
        try:
            a = Allreducer(world, tree, 3, realization="tree", timeout="soon" if bad else SHORT)
            got = a.run({rank: data[rank]})
            a.free()
        except Refusal as e:
            code = e.code
        if k == 0:
            want_code = "usage" if bad else "peer-refused"
            agree(world, code == want_code, f"rank {rank} call {k}: {code}")
        else:
            agree(
                world,
                code is None and np.array_equal(bits(got), bits(_want(tree, data))),
                f"call {k}: {code}",
            )
        codes.append(code)


@pytest.mark.mpi(min_size=2)
def test_a_realization_another_rank_does_not_build_is_refused_on_every_rank(world):
    """Tree on every rank but the last, replicate on the last: named on every rank when built."""
    size, rank = world.Get_size(), world.Get_rank()
    tree = _sum_tree(size)
    name = "replicate" if rank == size - 1 else "tree"
    code = refusal_code(lambda: Allreducer(world, tree, 4, realization=name, timeout=SHORT))
    agree(world, code == "executor-identity-mismatch", f"rank {rank}: {code}")


@pytest.mark.mpi(min_size=2)
def test_a_rank_that_skips_a_constructor_leaves_no_rank_waiting_in_a_dup(world):
    """Three fresh Allreducers; the last rank skips the first. Its second pairs with the
    others' first: that is not detectable when both are the same executor (same plan, same
    position on the communicator; only the data differ), and it is why every rank must build
    the same executors in the same order. What the protocol guarantees: the others' third
    Allreducer, which no rank pairs with, is refused by name within the bound (its build
    agreement is a bounded verdict round; nothing is duplicated), where it used to wait in a
    collective Dup for ever."""
    import time

    size, rank = world.Get_size(), world.Get_rank()
    comm = world.Dup()
    tree = _sum_tree(size)
    codes = []
    t0 = time.monotonic()
    for k in range(3):
        if rank == size - 1 and k == 0:
            continue
        data = {s: np.full(3, float((k + 1) * 10**s)) for s in range(size)}
        codes.append(
            refusal_code(
                lambda: Allreducer(comm, tree, 3, realization="tree", timeout=SHORT).run({rank: data[rank]})
            )
        )
    elapsed = time.monotonic() - t0
    want = [None, None] if rank == size - 1 else [None, None, "peer-timeout"]
    agree(world, codes == want and elapsed < 60, f"rank {rank}: {codes} in {elapsed:.1f}s")
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_a_rank_that_skips_a_call_of_executors_sharing_a_communicator_is_refused(world):
    """Three Allreducers built on every rank on one communicator (dup=False); the last rank
    skips the first run. Each executor has its own tag block (endpoint.py), so no rank ever
    matches a frame of another executor: every rank refuses by name within the bound, none
    returns a value, and a rank whose peer sent a frame of another executor meanwhile says so."""
    size, rank = world.Get_size(), world.Get_rank()
    comm = world.Dup()
    tree = _sum_tree(size)
    execs = [Allreducer(comm, tree, 3, realization="tree", timeout=SHORT, dup=False) for _ in range(3)]
    data = {s: np.full(3, 10.0**s) for s in range(size)}
    run = execs[1:] if rank == size - 1 else execs
    try:
        run[0].run({rank: data[rank]})
        code, msg = None, ""
    except Refusal as e:
        code, msg = e.code, e.message
    found = world.allgather((code, f"executor #{execs[1].executor.sequence}" in msg))  # test-side verdict
    named = {"peer-timeout", "peer-refused"}
    agree(world, all(c in named for c, _ in found), f"{found}")
    agree(world, any(said for _, said in found), f"no rank named the other executor: {found}")
    agree(world, code is None or "dup=False" in msg, f"rank {rank}: no dup=False hint in {msg!r}")
    for a in execs:
        a.free()
    # frames may still be in flight on `comm` (the broken executors' sends): never reuse it


# -- flags that reach every rank ------------------------------------------------------------------
@pytest.mark.mpi(min_size=2)
def test_a_corrupt_payload_in_the_last_receive_is_refused_on_every_rank(world, monkeypatch):
    """DeliverTo(0): rank 1 sends its frame and receives nothing. A bit flipped after its crc
    was written is found by rank 0 in its last receive; the flag round after the run makes
    rank 1 (and every other rank) refuse too, and the next run works."""
    monkeypatch.setenv("ALPHA_MPI_PAYLOAD_CHECK", "1")
    size, rank = world.Get_size(), world.Get_rank()
    p = plan(Branch(Leaf(0, 0), Leaf(1, 1), 0), DeliverTo(0), 8, size=size)
    c = Combiner(world, p, timeout=SHORT)

    def flip(index, mv):
        if len(mv) > fr.HEADER:  # the data frame (the flag rounds' frames carry no payload)
            mv[fr.HEADER + 2] ^= 0x04

    if rank == 1:
        c.send_hook = flip
    data = slot_data(2, 8, seed=3)
    mine = {s: data[s] for s in p.slots_of(rank)}
    code = refusal_code(lambda: c.run(mine))
    want = "frame-payload-corrupt" if rank == 0 else "peer-refused"
    agree(world, code == want, f"rank {rank}: {code}")
    c.send_hook = None
    try:
        got, code = c.run(mine), None
    except Refusal as e:
        got, code = None, e.code
    ok = code is None and (rank != 0 or np.array_equal(bits(got), bits(_want(p.tree, data))))
    agree(world, ok, f"rank {rank}: next run {code}")
    c.free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("realization", ["butterfly", "tree", "halving"])
def test_with_the_payload_check_every_rank_names_the_lowest_refusing_rank(world, monkeypatch, realization):
    """Ranks 1 and p - 1 refuse their inputs in the same run. Each rank's frames name the first
    refusal it saw, which differs from rank to rank; the flag rounds after the program (payload
    check on) carry the lowest refusing rank to every rank, so every other rank names rank 1
    (`peer-refused`, peer 1, its code), and the next run works."""
    monkeypatch.setenv("ALPHA_MPI_PAYLOAD_CHECK", "1")
    size, rank = world.Get_size(), world.Get_rank()
    tree = _sum_tree(size)
    a = Allreducer(world, tree, 5, realization=realization, timeout=SHORT)
    data = slot_data(size, 5, seed=9)
    bad = {1, size - 1}
    mine = {rank: data[rank][:3] if rank in bad else data[rank]}
    try:
        a.run(mine)
        got = None
    except Refusal as e:
        got = (e.code, e.context.get("peer"), e.context.get("peer_code"))
    want = ("contribution-shape", None, None) if rank in bad else ("peer-refused", 1, "contribution-shape")
    agree(world, got == want, f"rank {rank}: {got}")
    out = a.run({rank: data[rank]})
    agree(world, np.array_equal(bits(out), bits(_want(tree, data))), f"rank {rank}: the next run")
    a.free()


# -- timeouts -------------------------------------------------------------------------------------
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("bad", ["soon", -1, 0, float("nan"), float("inf")])
def test_a_bad_run_timeout_on_one_rank_is_refused_on_every_rank_and_the_next_run_works(world, bad):
    size, rank = world.Get_size(), world.Get_rank()
    tree = _sum_tree(size)
    a = Allreducer(world, tree, 3, realization="tree", timeout=SHORT)
    data = slot_data(size, 3, seed=2)
    code = refusal_code(lambda: a.run({rank: data[rank]}, timeout=bad if rank == size - 1 else None))
    want = "usage" if rank == size - 1 else "peer-refused"
    agree(world, code == want and a.broken is None, f"rank {rank}: {code}, broken={a.broken}")
    got = a.run({rank: data[rank]}, timeout=SHORT)
    agree(world, np.array_equal(bits(got), bits(_want(tree, data))), "next run")
    a.free()


@pytest.mark.mpi(min_size=2)
def test_an_exception_inside_a_run_marks_the_executor_broken_and_says_so(world):
    size, rank = world.Get_size(), world.Get_rank()
    p = plan(Branch(Leaf(0, 0), Leaf(1, 1), 0), DeliverTo(0), 4, size=size)
    c = Combiner(world, p, timeout=SHORT)

    def boom(index, mv):
        raise KeyError("a bug in a send hook")

    if rank == 1:
        c.send_hook = boom
    try:
        c.run({s: np.ones(4) for s in p.slots_of(rank)})
        code = None
    except KeyError:
        code = "KeyError"
    except Refusal as e:
        code = e.code
    if rank == 1:
        later = refusal_code(lambda: c.run({1: np.ones(4)}))
        agree(
            world,
            code == "KeyError" and c.broken == "KeyError" and later == "combiner-broken",
            f"{code} {later}",
        )
    else:
        agree(world, code in (None, "peer-timeout"), f"rank {rank}: {code}")
    c.free()


# -- the convenience calls ------------------------------------------------------------------------
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mistake", ["short", "list", "float32", "extra-slot"])
def test_one_ranks_mistake_in_allreduce_is_refused_on_every_rank_fast_and_the_next_call_works(world, mistake):
    """The cache is keyed only on what must agree, so the mistaken rank finds its peers'
    executor (no lone build, no collective alone), and its mistake is refused inside the run."""
    import time

    from alpha_mpi.execution.convenience import cached_executors

    size, rank = world.Get_size(), world.Get_rank()
    comm = world.Dup()
    tree = _sum_tree(size)
    data = slot_data(size, 6, seed=9)
    good = {rank: data[rank]}
    got = allreduce(comm, tree, good, realization="tree", timeout=30)
    bad = dict(good)
    if rank == size - 1:
        bad = {
            "short": {rank: data[rank][:-1].copy()},
            "list": {rank: list(data[rank])},
            "float32": {rank: data[rank].astype(np.float32)},
            "extra-slot": {rank: data[rank], rank + 100: data[rank]},
        }[mistake]
    t0 = time.monotonic()
    code = refusal_code(lambda: allreduce(comm, tree, bad, realization="tree", timeout=30))
    elapsed = time.monotonic() - t0
    want = {"list": "dtype-invalid", "float32": "dtype-invalid"}
    want = want.get(mistake, "contribution-unexpected") if rank == size - 1 else "peer-refused"
    if mistake == "short":  # a size the others did not pass: the Sizes round names it everywhere
        want = "contribution-size-mismatch"
    agree(world, code == want and elapsed < 20, f"rank {rank}: {code} after {elapsed:.1f}s")
    got = allreduce(comm, tree, good, realization="tree", timeout=30)
    agree(world, np.array_equal(bits(got), bits(_want(tree, data))), "next call")
    agree(world, len(cached_executors(comm)) == 1, f"{len(cached_executors(comm))} executors")
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_the_convenience_cache_lives_on_the_communicator(world):
    """Freeing a communicator drops its executors; a new communicator (which may reuse the freed
    handle) starts with none: nothing is found by handle."""
    from alpha_mpi.execution.convenience import cached_executors

    size, rank = world.Get_size(), world.Get_rank()
    tree = _sum_tree(size)
    data = slot_data(size, 4, seed=1)
    handles, ok = [], True
    for _ in range(3):
        comm = world.Dup()
        handles.append(comm.py2f())
        ok &= len(cached_executors(comm)) == 0
        got = allreduce(comm, tree, {rank: data[rank]}, layout=4)
        ok &= np.array_equal(bits(got), bits(_want(tree, data))) and len(cached_executors(comm)) == 1
        comm.Free()
    agree(world, ok, f"handles {handles}")


@pytest.mark.mpi(min_size=2)
def test_another_size_on_every_rank_without_layout_is_combined(world):
    """The payload size is each call's: every rank passing 5 after 4 gets the 5-element sum (the
    refused run at the old size, the Sizes round, the build); layout= still names a size."""
    size, rank = world.Get_size(), world.Get_rank()
    comm = world.Dup()
    tree = _sum_tree(size)
    allreduce(comm, tree, {rank: np.ones(4)}, timeout=30)
    got = allreduce(comm, tree, {rank: np.ones(5)}, timeout=30)
    agree(world, np.array_equal(got, np.full(5, float(size))), f"rank {rank}: {got}")
    got = allreduce(comm, tree, {rank: np.ones(6)}, layout=6, timeout=30)
    agree(world, np.array_equal(got, np.full(6, float(size))), "with layout=")
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_a_rank_with_no_contributions_on_the_first_call_is_refused_on_every_rank(world):
    size, rank = world.Get_size(), world.Get_rank()
    comm = world.Dup()
    tree = _sum_tree(size)
    mine = {} if rank == size - 1 else {rank: np.ones(3)}
    code = refusal_code(lambda: allreduce(comm, tree, mine, timeout=30))
    want = "contribution-missing" if rank == size - 1 else "peer-refused"
    agree(world, code == want, f"rank {rank}: {code}")
    got = allreduce(comm, tree, {rank: np.ones(3)}, timeout=30)
    agree(world, np.array_equal(got, np.full(3, float(size))), "next call")
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_replicate_everywhere_still_runs(world):
    """The agreement rounds do not disturb a healthy run of every realization on this tree."""
    size, rank = world.Get_size(), world.Get_rank()
    tree = _sum_tree(size)
    data = slot_data(size, 7, seed=4)
    for name in ("tree", "replicate", "scatter"):
        a = Allreducer(world, tree, 7, ReplicateAll(), realization=name, timeout=SHORT)
        got = a.run({rank: data[rank]})
        agree(world, np.array_equal(bits(got), bits(_want(tree, data))), name)
        a.free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("argument", ["realization", "layout", "delivery", "tree"])
def test_one_rank_passing_another_agreed_argument_is_named_everywhere_then_reset_recovers(world, argument):
    """After a warm call, one rank passes another realization (or layout=, delivery, tree) to
    allreduce() than its peers: it builds another executor while they run the cached one.
    Every rank refuses `executor-identity-mismatch` at once, as on a first call (issue 36 item
    8): a peer that waits for that rank's frame finds its build record first and answers its
    build round, and so on down the ranks that wait (engine_walk, Endpoint.answer_build); it
    used to be `peer-timeout` after the whole bound (SHORT here: the refusal names the round,
    never the bound). Later calls refuse `combiner-broken` on every rank (messages of the failed
    call may be on the channel) until reset(comm) on every rank, after which the call works."""
    from alpha_mpi import DeliverTo
    from alpha_mpi.execution import Endpoint, reset
    from alpha_mpi.execution.abort import owns_failures

    size, rank = world.Get_size(), world.Get_rank()
    comm = world.Dup()
    tree = _sum_tree(size)
    n = 4
    good = {rank: np.full(n, float(rank + 1))}
    want = np.full(n, float(size * (size + 1) // 2))
    allreduce(comm, tree, good, realization="tree", timeout=SHORT)
    args, kw = (comm, tree, good), {"realization": "tree"}
    if rank == size - 1:
        if argument == "realization":
            kw = {"realization": "replicate"}
        elif argument == "layout":
            args, kw = (comm, tree, {rank: np.ones(n + 1)}), {"realization": "tree", "layout": n + 1}
        elif argument == "delivery":
            args = (comm, tree, good, DeliverTo(0))
        else:
            args = (comm, star(list(reversed(range(size))), size), good)
    try:
        allreduce(*args, timeout=30, **kw)
        code, ranks = None, None
    except Refusal as e:
        code, ranks = e.code, e.context.get("ranks")
    agree(
        world, code == "executor-identity-mismatch" and ranks == (size - 1,), f"rank {rank}: {code} {ranks}"
    )
    later = refusal_code(lambda: allreduce(comm, tree, good, realization="tree", timeout=SHORT))
    agree(world, later == "combiner-broken", f"rank {rank}: later call {later}")
    reset(comm)
    # nothing recorded for the abort at exit: the job ends with 0 (test_launch_mpi checks the
    # exit status itself under MPICH)
    agree(world, not owns_failures(Endpoint.existing(comm)), f"rank {rank}: a failure is still recorded")
    got = allreduce(comm, tree, good, realization="tree", timeout=SHORT)
    agree(world, np.array_equal(got, want), "after reset")
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_a_peer_that_resets_during_a_warm_call_is_named_at_once(world):
    """The last rank calls reset(comm) while the others make a warm call: a rank waiting for its
    frame finds its reset marker first and refuses `executor-identity-mismatch` at once (not
    `peer-timeout` after the bound; 30 s here), and so on down the ranks that wait for that
    one once it resets too; after every rank's reset the call works."""
    from alpha_mpi.execution import reset

    size, rank = world.Get_size(), world.Get_rank()
    comm = world.Dup()
    tree = _sum_tree(size)
    good = {rank: np.full(3, float(rank + 1))}
    allreduce(comm, tree, good, realization="tree", timeout=30)
    code = None
    if rank != size - 1:
        code = refusal_code(lambda: allreduce(comm, tree, good, realization="tree", timeout=30))
    reset(comm, timeout=30)
    agree(world, rank == size - 1 or code == "executor-identity-mismatch", f"rank {rank}: {code}")
    got = allreduce(comm, tree, good, realization="tree", timeout=30)
    agree(world, np.array_equal(got, np.full(3, float(size * (size + 1) // 2))), "after reset")
    comm.Free()
