"""Assembly by selection over MPI: every word from exactly its owner, no arithmetic."""

import numpy as np
import pytest

from alpha_mpi import DeliverTo, Refusal, plan_assembly
from alpha_mpi.execution import Assembler
from alpha_mpi.execution import frames as fr
from alpha_mpi.planning.assembly import even_ranges

from conftest import agree, bits, order_sensitive


def even_assembler(world, full):
    """An Assembler of `full`'s words in even ranges over the world, and this rank's pieces of it."""
    size, rank, n = world.Get_size(), world.Get_rank(), len(full)
    ap = plan_assembly(even_ranges(n, size), n, size)
    return Assembler(world, ap, timeout=30), {(a, b): full[a:b].copy() for o, a, b in ap.pieces if o == rank}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("n", [1, 7, 1000, 65537])
def test_replicated_assembly_is_bit_exact_selection(world, n):
    size, rank = world.Get_size(), world.Get_rank()
    full = order_sensitive(np.random.default_rng(n), n)
    full[:3] = [np.nan, -0.0, 5e-324][: min(3, n)]  # NaN payloads and signed zeros pass untouched
    ap = plan_assembly(even_ranges(n, size), n, size)
    mine = {(a, b): full[a:b].copy() for o, a, b in ap.pieces if o == rank}
    got = Assembler(world, ap, timeout=10).run(mine)
    agree(world, np.array_equal(bits(got), bits(full)), "assembled bits")


@pytest.mark.mpi(min_size=2)
def test_uneven_multi_piece_assembly_to_one_target(world):
    size, rank = world.Get_size(), world.Get_rank()
    n = 50
    pieces = [(i % size, 5 * i, 5 * i + 5) for i in range(10)]  # several pieces per rank, interleaved
    ap = plan_assembly(pieces, n, size, DeliverTo(size - 1))
    full = np.arange(n, dtype=np.float64) * 1.25
    mine = {(a, b): full[a:b].copy() for o, a, b in pieces if o == rank}
    out = np.full(n, -3.0)
    got = Assembler(world, ap, timeout=10).run(mine, out=out)
    if rank == size - 1:
        agree(world, got is out and np.array_equal(out, full), "target")
    else:
        agree(world, got is None and np.all(out == -3.0), "others untouched")


@pytest.mark.mpi(min_size=2)
def test_assembly_piece_refusals(world):
    size, rank = world.Get_size(), world.Get_rank()
    ap = plan_assembly(even_ranges(10 * size, size), 10 * size, size)
    a = Assembler(world, ap, timeout=5)
    with pytest.raises(Refusal) as e:
        a.run({})
    assert e.value.code == "contribution-missing"
    with pytest.raises(Refusal) as e:
        a.run({(10 * rank, 10 * rank + 10): np.ones(9)})
    assert e.value.code == "contribution-shape"


@pytest.mark.mpi(min_size=2)
def test_one_ranks_bad_pieces_are_refused_on_every_rank_by_name_and_the_next_run_works(world):
    size, rank = world.Get_size(), world.Get_rank()
    n = 10 * size
    full = order_sensitive(np.random.default_rng(3), n)
    a, good = even_assembler(world, full)
    bad_rank = size - 1
    cases = [
        ({}, {}),
        ({k: v[:-1] for k, v in good.items()}, {}),
        ({k: v.astype(np.float32) for k, v in good.items()}, {}),
        ({k: v.reshape(-1, 1) for k, v in good.items()}, {}),  # the right size, not a vector
        (good, {"out": np.empty(n, dtype=np.float32)}),
        (good, {"out": np.empty(n - 1)}),
        (good, {"out": [0.0] * n}),
        (good, {"flags": 2}),  # the refusal bit is the protocol's, not the caller's
    ]
    for bad, kw in cases:
        with pytest.raises(Refusal) as e:
            a.run(bad, **kw) if rank == bad_rank else a.run(good)
        if rank == bad_rank:
            want = ("contribution-missing", "contribution-shape", "out-invalid", "usage")
            agree(world, e.value.code in want, f"own code {e.value.code}")
        else:
            ok = e.value.code == "peer-refused" and e.value.context["peer"] == bad_rank
            agree(world, ok, f"named the refusing rank: {e.value.code} {e.value}")
        got = a.run(good)  # the channel is intact
        agree(world, np.array_equal(bits(got), bits(full)), "next run's bits")
    a.free()


def _flip_payload(index, mv):
    """A send hook that flips one payload bit after the header (and its crc32) was written."""
    if len(mv) > 128:
        mv[128 + 5] ^= 0x08


@pytest.mark.mpi(min_size=2)
def test_a_flipped_payload_bit_is_refused_when_the_check_is_on(world, monkeypatch):
    """Assembly frames carry the engine's payload crc32 (ALPHA_MPI_PAYLOAD_CHECK=1): a flipped bit
    in rank 1's frames is refused where it lands, no rank returns other bits than the plan's, and
    the next run works (a payload failure does not break the executor)."""
    monkeypatch.setenv("ALPHA_MPI_PAYLOAD_CHECK", "1")
    size, rank = world.Get_size(), world.Get_rank()
    full = order_sensitive(np.random.default_rng(11), 10 * size)
    a, good = even_assembler(world, full)
    if rank == 1:
        a.send_hook = _flip_payload
    try:
        got, code = a.run(good), None
    except Refusal as e:
        got, code = None, e.code
    codes = world.allgather(code)  # test-side verdict
    ok = code in ("frame-payload-corrupt", "peer-refused") or np.array_equal(bits(got), bits(full))
    agree(world, ok and "frame-payload-corrupt" in codes and codes[1] != "frame-payload-corrupt", f"{codes}")
    a.send_hook = None
    got = a.run(good)
    agree(world, a.broken is None and np.array_equal(bits(got), bits(full)), "next run's bits")
    a.free()


@pytest.mark.mpi(min_size=2)
def test_a_tampered_assembly_header_is_refused_by_name_before_out_is_written(world):

    size, rank = world.Get_size(), world.Get_rank()
    n = 4 * size
    full = np.arange(n, dtype=np.float64)
    a, good = even_assembler(world, full)

    def tamper(index, mv):  # another plan identity, with a valid header crc
        mv[40] ^= 0xFF
        fr.seal(mv)

    if rank == 0:
        a.send_hook = tamper
    out = np.full(n, -7.0)
    try:
        got, code = a.run(good, out=out), None
    except Refusal as e:
        got, code = None, e.code
    if rank == 0:
        ok = code is None and np.array_equal(got, full)  # its own receives were all intact
    else:
        ok = code == "frame-identity-mismatch" and np.all(out == -7.0) and a.broken is not None
    agree(world, ok, f"rank {rank}: {code}")


@pytest.mark.mpi(min_size=2)
def test_an_assembler_of_another_plan_on_one_rank_is_refused_at_build_on_every_rank(world):
    """The build agreement covers the Assembler (it runs on the one engine): the last rank builds
    an Assembler for another delivery; every rank refuses `executor-identity-mismatch` while
    building, and the next Assembler, the same on every rank, gives the right bits."""
    size, rank = world.Get_size(), world.Get_rank()
    n = 3 * size + 1
    full = order_sensitive(np.random.default_rng(5), n)
    ranges = even_ranges(n, size)
    other = rank == size - 1
    ap = plan_assembly(ranges, n, size, DeliverTo(0) if other else None)
    try:
        Assembler(world, ap, timeout=30)
        code = None
    except Refusal as e:
        code = e.code
    agree(world, code == "executor-identity-mismatch", f"rank {rank}: {code}")
    ap = plan_assembly(ranges, n, size)
    a = Assembler(world, ap, timeout=30)
    got = a.run({(a_, b): full[a_:b].copy() for o, a_, b in ap.pieces if o == rank})
    agree(world, np.array_equal(bits(got), bits(full)), f"rank {rank}: the next Assembler's bits")
    a.free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("n", [600, 20000])
def test_a_longer_assembly_frame_is_refused_and_never_written_past_the_buffer(world, n):
    """Assembly receives are size-safe too: rank 1 sends rank 0, on the Assembler's channel (a
    user communicator, dup=False: user traffic can reach it) and tag, a message 8 KiB longer than
    the planned frame (n = 20000: longer than the header message of a split frame). Rank 0
    refuses `frame-size-mismatch`, and the header bytes of its planned buffer keep the test's
    pattern (the message went whole into a scratch buffer); its payload bytes hold the engine's
    zeros in place of the refused frame, never the rogue 0xA5."""

    size, rank = world.Get_size(), world.Get_rank()
    ap = plan_assembly([(0, 0, n // 2), (1, n // 2, n)], n, size, DeliverTo(0))
    comm = world.Dup()
    a = Assembler(comm, ap, timeout=10, dup=False)
    msgs = list(a.engine.compiled.msgs.values())
    code, untouched = None, True
    if rank == 1:
        x = msgs[0]
        a.comm.Send(np.full(x.nbytes + 8192, 0xA5, dtype=np.uint8), dest=0, tag=x.tag)
    elif rank == 0:
        x = next(m for m in msgs if m.m.src == 1)
        x.hbuf[:] = 0x3C
        try:
            a.run({(0, n // 2): np.ones(n // 2)})
        except Refusal as e:
            code = e.code
        untouched = bool(np.all(x.hbuf[: fr.HEADER] == 0x3C) and np.all(x.hbuf[fr.HEADER :] == 0))
    want = "frame-size-mismatch" if rank == 0 else None
    agree(world, code == want and untouched, f"rank {rank}: {code}, header untouched={untouched}")
    a.free()
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_an_assembly_plan_for_another_size_on_one_rank_is_named_on_every_rank(world):
    """The last rank passes a plan for one more rank: it refuses `plan-rank-mismatch` inside the
    build agreement, every other rank `peer-refused` naming it (within the bound, not a wait
    for a build that never comes), and the next Assembler works."""
    size, rank = world.Get_size(), world.Get_rank()
    n = 2 * size + 2
    other = rank == size - 1
    q = size + 1 if other else size
    try:
        Assembler(world, plan_assembly(even_ranges(n, q), n, q), timeout=30)
        code, peer = None, None
    except Refusal as e:
        code, peer = e.code, e.context.get("peer")
    want = "plan-rank-mismatch" if other else "peer-refused"
    agree(world, code == want and (other or peer == size - 1), f"rank {rank}: {code} (peer {peer})")
    full = np.arange(n, dtype=np.float64) - 0.5
    a, good = even_assembler(world, full)
    got = a.run(good)
    agree(world, np.array_equal(bits(got), bits(full)), f"rank {rank}: the next Assembler's bits")
    a.free()
