"""The foreign-message probe (execution/engine_walk.py `_out_of_step`): a rank that waits for a
peer's frame and finds another run's message of that peer first refuses
`executor-identity-mismatch` only when the awaited frame was never matched; a frame already
matched by this rank's posted receive (landed or not) lets the run go on.

Two ranks of the world (the rest split off and wait). Executor A's owner is rank 1 (rank 0
waits for its result), executor B's owner rank 0 (rank 1 sends its contribution first), so rank
1 can finish A and send B's first frame while rank 0 still waits in A."""

import time

import numpy as np
import pytest

from alpha_mpi import Branch, Leaf, Refusal, ReplicateAll, oracle
from alpha_mpi.execution import Allreducer, engine_walk

from conftest import agree, bits

N = 5


def _pair(world):
    """A communicator of world ranks 0 and 1 (None on the others)."""
    comm = world.Split(0 if world.Get_rank() < 2 else 1)
    if world.Get_rank() >= 2:
        comm.Free()
        return None
    return comm


def _trees():
    return Branch(Leaf(0, 0), Leaf(1, 1), 1), Branch(Leaf(0, 0), Leaf(1, 1), 0)


def _data(rank):
    # magnitudes far apart: the other order of the two adds gives other bits only where a
    # wrong frame is combined (a peer's value from the other executor's layout)
    return {rank: np.array([1e16, -3.5, 2.0**-40, 7.25, 1e-300][:N]) * (rank + 1) + rank}


def _want(tree, rank_data):
    return np.array(oracle.evaluate(tree, {s: v.tolist() for s, v in rank_data.items()}))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("receives", ["matched", "posted"])
def test_a_peers_next_run_sent_while_its_frame_was_awaited_is_no_refusal(world, monkeypatch, receives):
    """Rank 0 waits in A past a slice and is held outside MPI (a sleep at its first AN_AGAIN)
    while rank 1 finishes A (its result frame to rank 0) and sends B's frame. No refusal; A's
    and B's results are the oracle's bits on both ranks. Posted receives: the awaited receive is
    then cancelled as if the probe had found B's frame first (the probe's own progress matches
    A's frame into it, so the probe cannot be made to see it here): a receive already matched
    completes as usual, the run goes on (C answers AN_UNMATCHED only for an unmatched one)."""
    if receives == "posted":
        monkeypatch.setenv("ALPHA_MPI_RECEIVES", "posted")
    comm = _pair(world)
    outcome = (None, True)
    if comm is not None:
        rank = comm.Get_rank()
        ta, tb = _trees()
        a = Allreducer(comm, ta, N, ReplicateAll(), realization="tree", timeout=20)
        b = Allreducer(comm, tb, N, ReplicateAll(), realization="tree", timeout=20)
        mode_ok = a.executor.probe == (receives == "matched")
        x = _data(rank)
        peer = {1 - rank: _data(1 - rank)[1 - rank]}
        held = []
        real = engine_walk._out_of_step

        def hold(c, st, comm_, foreign):
            if held:
                return real(c, st, comm_, foreign)
            held.append(True)
            time.sleep(0.5)  # rank 1 finishes A and sends B's frame meanwhile
            if receives == "matched":
                return real(c, st, comm_, foreign)
            comm_.Iprobe()  # progress: A's frame is matched into the posted receive
            run = c.ex.run
            assert c.native.lib.an_cancel_awaited(c.ex) == 0
            st.foreign = (
                (run.at_msg, run.at_payload),
                None,
                Refusal("executor-identity-mismatch", "unmatched"),
            )
            return None

        if rank == 0:
            monkeypatch.setattr(engine_walk, "_out_of_step", hold)
        else:
            time.sleep(0.15)  # rank 0 waits in A past a slice first
        try:
            ga, gb = a.run(x), b.run(x)
            code = None
        except Refusal as e:
            code, ga, gb = e.code, None, None
        monkeypatch.setattr(engine_walk, "_out_of_step", real)
        ok = (
            code is None
            and np.array_equal(bits(ga), bits(_want(ta, {**x, **peer})))
            and np.array_equal(bits(gb), bits(_want(tb, {**x, **peer})))
        )
        outcome = (code, ok and mode_ok and (rank == 1 or bool(held)))
        a.free()
        b.free()
        comm.Free()
    agree(world, outcome[0] is None and outcome[1], f"rank {world.Get_rank()}: {outcome}")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("receives", ["matched", "posted"])
def test_a_peer_that_runs_its_executors_in_another_order_is_named_at_once(world, monkeypatch, receives):
    """Rank 1 runs B then A, rank 0 A then B: rank 0 waits in A for a frame rank 1 has not sent
    and finds B's frame first. Every rank refuses `executor-identity-mismatch` well within the
    bound (20 s) — posted receives: the awaited receive is cancelled, unmatched — and nothing
    is combined."""
    if receives == "posted":
        monkeypatch.setenv("ALPHA_MPI_RECEIVES", "posted")
    comm = _pair(world)
    outcome = ("executor-identity-mismatch", 0.0)
    if comm is not None:
        rank = comm.Get_rank()
        ta, tb = _trees()
        a = Allreducer(comm, ta, N, ReplicateAll(), realization="tree", timeout=20)
        b = Allreducer(comm, tb, N, ReplicateAll(), realization="tree", timeout=20)
        x = _data(rank)
        order = (a, b) if rank == 0 else (b, a)
        t = time.monotonic()
        try:
            order[0].run(x)
            code = None
        except Refusal as e:
            code = e.code
        outcome = (code, time.monotonic() - t)
        a.free()
        b.free()
        # frames may still be in flight on `comm` (the broken executors'): never reuse it
    agree(world, outcome[0] == "executor-identity-mismatch" and outcome[1] < 10, f"{outcome}")
