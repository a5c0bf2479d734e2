"""The C round under MPI: signals reach a rank that waits in it, and a rank that cannot build it
is named on every rank (its refusal rides the build agreement), after which the next build works."""

import signal
import time

import numpy as np
import pytest

from alpha_mpi import Branch, DeliverTo, Leaf, plan, star
from alpha_mpi.execution import Allreducer, Combiner, native

from conftest import agree, refusal_code


@pytest.mark.mpi(min_size=2)
def test_an_interrupt_reaches_a_rank_that_waits_for_its_peer_and_breaks_the_executor(world):
    """Rank 0 waits in the C round for rank 1's frame, which never comes (rank 1 waits in a
    barrier); a SIGALRM handler raising KeyboardInterrupt fires after 0.3 s. The round returns
    to Python every few ms of waiting, so the interrupt is raised within a second (the bound is
    60 s), the executor is broken by it and says so on the next run."""
    size, rank = world.Get_size(), world.Get_rank()
    p = plan(Branch(Leaf(0, 0), Leaf(1, 1), 0), DeliverTo(0), 4, size=size)
    c = Combiner(world, p, timeout=60)
    what, elapsed, later = None, 0.0, None
    if rank == 0:

        def interrupt(signum, frame):
            raise KeyboardInterrupt

        old = signal.signal(signal.SIGALRM, interrupt)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        t0 = time.monotonic()
        try:
            c.run({0: np.ones(4)})
        except KeyboardInterrupt:
            what = "KeyboardInterrupt"
        elapsed = time.monotonic() - t0
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        later = refusal_code(lambda: c.run({0: np.ones(4)}))
    world.Barrier()  # test-side: rank 1 never sends its frame
    if rank == 0:
        ok = what == "KeyboardInterrupt" and 0.25 < elapsed < 5 and c.broken == "KeyboardInterrupt"
        ok = ok and later == "combiner-broken"
    else:
        ok = True
    agree(world, ok, f"rank {rank}: {what} after {elapsed:.2f}s, broken={c.broken}, later={later}")
    c.free()


@pytest.mark.mpi(min_size=2)
def test_a_rank_that_cannot_build_the_c_round_is_named_on_every_rank_and_the_next_build_works(
    world, monkeypatch, tmp_path
):
    """The last rank has no MPI compiler and no cached C round: its Allreducer refuses
    `native-build-failed` inside the build agreement, every other rank `peer-refused` naming
    it, within the bound; once it has its compiler back, the next Allreducer combines."""
    size, rank = world.Get_size(), world.Get_rank()
    tree = star(range(size), size)
    last = rank == size - 1
    if last:
        monkeypatch.setenv(native.ENV_MPICC, str(tmp_path / "no-mpicc"))
        monkeypatch.setenv(native.ENV_CACHE, str(tmp_path / "cache"))
        monkeypatch.delitem(native._LOADED, "module", raising=False)
    code = refusal_code(lambda: Allreducer(world, tree, 3, realization="tree", timeout=30))
    want = "native-build-failed" if last else "peer-refused"
    agree(world, code == want, f"rank {rank}: {code}")
    monkeypatch.undo()
    a = Allreducer(world, tree, 3, realization="tree", timeout=30)
    got = a.run({rank: np.full(3, 1.0)})
    agree(world, np.array_equal(got, np.full(3, float(size))), f"rank {rank}: {got}")
    a.free()
