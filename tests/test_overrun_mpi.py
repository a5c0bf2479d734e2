"""Memory safety against any frame any rank sends (issue 45 item 1).

An executor alone on its tag block of the library's duplicate used to post its receives at the
planned size: "nothing else can be sent there". A buggy or hostile rank can, and Open MPI 5's
single-copy path (mca_smsc_cma_copy_from) writes a longer message past the posted receive before
it reports the truncation: a heap overrun, then SIGSEGV. These tests send such frames on the
engine's own tags of its duplicate, at sizes above and below Open MPI's eager limit, and ask for
`frame-size-mismatch` named on every rank, the planned buffers untouched and no crash. They run
under MPICH and under Open MPI (tests/run-all.sh openmpi2); the sanitizer stage
(.ci/sanitize.sh) runs them under ASan, where an overrun is a report even when it does not crash.
"""

import numpy as np
import pytest
from mpi4py import MPI

from alpha_mpi import Branch, Leaf, ReplicateAll, plan, star
from alpha_mpi.execution import Allreducer, Combiner
from alpha_mpi.execution import frames as fr

from conftest import agree, refusal_code

SHORT = 5.0


def _rogue_first(c, extra):
    """A send hook that sends, before each of this rank's frames, a copy of the frame `extra`
    bytes longer (its bytes 0xA5 behind the real header) on the same tag of the executor's own
    channel (the library's duplicate): the receiver matches the rogue first (MPI keeps one
    sender's order)."""
    sent = []

    def hook(index, header):
        x = c.compiled.msgs[index]
        rogue = np.full(len(header) + extra, 0xA5, dtype=np.uint8)
        rogue[: len(header)] = np.frombuffer(header, dtype=np.uint8)
        sent.append(c.comm.Isend(rogue, dest=x.peer, tag=x.tag))
        sent.append(rogue)

    return hook, sent


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("n, extra", [(7, 8192), (600, 8192), (600, 8), (20000, 8192), (20000, 64)])
def test_a_longer_frame_on_the_executors_own_tags_is_refused_on_every_rank(world, n, extra):
    """A star over ranks 0 and 1 (ReplicateAll, dup=True: the executor's own tag block of the
    library's duplicate). Each rank sends, before each frame of its own, a rogue copy `extra`
    bytes longer on the same tag. Rank 0 receives rank 1's rogue reduce frame, rank 1 rank 0's
    rogue delivery: both name `frame-size-mismatch`, and no MPI wrote past a planned buffer
    (n = 600: one message of 4,928 bytes; n = 20000: a split frame, the rogue is longer than its
    124-byte header message). Before the fix, Open MPI overran the receive and crashed."""
    size, rank = world.Get_size(), world.Get_rank()
    p = plan(Branch(Leaf(0, 0), Leaf(1, 1), 0), ReplicateAll(), n, size=size)
    comm = world.Dup()
    c = Combiner(comm, p, timeout=SHORT)
    code, untouched, sent = None, True, []
    if rank in (0, 1):
        recv = [x for x in c.compiled.msgs.values() if x.peer != rank and x.m.dst == rank]
        for x in recv:
            x.hbuf[:] = 0x3C
        c.send_hook, sent = _rogue_first(c, extra)
        code = refusal_code(lambda: c.run({rank: np.full(n, 1.0 + rank)}))
        # The planned buffers hold the test's 0x3C where a header goes and the engine's zeros in
        # place of a refused payload; never the rogue's 0xA5 (its header bytes are the real one's).
        for x in recv:
            tail = x.hbuf[fr.HEADER :]
            untouched = untouched and bool(np.all(tail == 0) or np.all(tail == 0x3C))
    ok = code == ("frame-size-mismatch" if rank in (0, 1) else None) and untouched
    agree(world, ok, f"rank {rank}: {code}, planned buffers untouched={untouched}")
    MPI.Request.Waitall([r for r in sent if isinstance(r, MPI.Request)])
    c.free()
    comm.Free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("n", [600, 20000])
def test_an_allreducer_refuses_a_longer_frame_from_a_peer_on_every_rank(world, n):
    """The same through the Allreducer every user holds (its own tag block on the endpoint's
    duplicate, whichever realization `auto` chose): every rank sends a rogue longer copy before
    each frame; every rank that receives names `frame-size-mismatch`, and the refusal reaches
    the ranks that only send. Nothing crashes."""
    size, rank = world.Get_size(), world.Get_rank()
    comm = world.Dup()
    a = Allreducer(comm, star(range(size), size), n, timeout=SHORT)
    a.executor.send_hook, sent = _rogue_first(a.executor, 8192)
    code = refusal_code(lambda: a({rank: np.full(n, 1.0 + rank)}))
    agree(world, code == "frame-size-mismatch", f"rank {rank}: {code} ({a.realization})")
    MPI.Request.Waitall([r for r in sent if isinstance(r, MPI.Request)])
    a.free()
    comm.Free()
