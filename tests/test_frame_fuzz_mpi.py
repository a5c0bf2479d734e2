"""A seeded fuzz of frames against the engine's round (issue 45 item 4): lengths, headers, tags.

Each case builds a fresh executor on a fresh communicator (a star over ranks 0 and 1, one
message frame or a split one, on the library's duplicate: the executor's own tag block), and
rank 1 sends rank 0, before its real frame, a rogue message drawn from the case's seed: a
length from 0 to well past the planned frame (around Open MPI's eager and single-copy limits
too), a header that is the planned one, the planned one with some bytes flipped, or random
bytes, on one of the executor's tags (the header's, a split frame's payload's, another of its
block, the flag rounds') or the tag just past it; every other case with the payload check on.
What must hold on rank 0, the receiver: the run returns the oracle's bits (or a forged payload's
combination) or raises a named Refusal, and nothing crashes; under the sanitizer stage
(.ci/sanitize.sh) no ASan or UBSan report names alpha_mpi code. Whatever nobody received is
drained after the case, so every rogue send completes and nothing leaks into the next case.

ALPHA_MPI_FUZZ_CASES (default 12) and ALPHA_MPI_FUZZ_SEED (default 45) choose the cases; the
sanitizer stage runs more. A failure names its seed and case; ALPHA_MPI_FUZZ_CASE=k replays case
k alone.
"""

import os
import time

import numpy as np
import pytest
from mpi4py import MPI

from alpha_mpi import Branch, Leaf, Refusal, ReplicateAll, oracle, plan
from alpha_mpi.execution import Combiner
from alpha_mpi.execution import frames as fr

from conftest import agree

CASES = int(os.environ.get("ALPHA_MPI_FUZZ_CASES", "12"))
SEED = int(os.environ.get("ALPHA_MPI_FUZZ_SEED", "45"))
ONLY = int(os.environ["ALPHA_MPI_FUZZ_CASE"]) if os.environ.get("ALPHA_MPI_FUZZ_CASE") else None
# What a case may end in on rank 0, the receiver: the oracle's bits, a forged payload combined,
# or a frame named (frame-*); never a timeout, a crash or another exception. Rank 1 is the rogue:
# whatever it ends in is not checked (it may wait out its own bound for a frame rank 0 never
# took, which the drain below then takes).
ALLOWED = ("oracle", "combined-other")
SHORT = 5.0
# With the payload check, rank 0's flag rounds wait for rank 1's flag frame, which rank 1 sends
# only once its real frame, queued behind the rogue, completed: for a frame past the eager limit
# that is after rank 0's run. So rank 0 may end `peer-timeout` there (named, after CHECKED s).
CHECKED = 2.0  # a rogue on a tag nobody reads first leaves rank 0's frame coming: no wait that long


def _rogue(rng, x, header: bytes, flag_tag: int):
    """(bytes, tag) of one rogue message for the planned message x (rank 1 -> 0)."""
    planned = x.nbytes
    kind = rng.integers(6)
    if kind == 0:
        length = planned + int(rng.integers(1, 9))  # a few bytes longer
    elif kind == 1:
        length = int(rng.integers(0, planned))  # shorter, down to empty
    elif kind == 2:
        length = planned + int(rng.integers(4000, 70000))  # past eager and single-copy limits
    elif kind == 3:
        length = planned  # the planned size: only the header can tell
    else:
        length = int(rng.integers(0, 3 * planned + 9000))
    buf = rng.integers(0, 256, size=length, dtype=np.uint8)
    how = rng.integers(3)
    if how < 2 and length:  # the planned header, intact or with bytes flipped
        h = np.frombuffer(header, dtype=np.uint8)[: min(length, fr.HEADER)]
        buf[: len(h)] = h
        if how == 1:
            for _ in range(int(rng.integers(1, 4))):
                buf[int(rng.integers(0, len(h)))] ^= np.uint8(1 << int(rng.integers(8)))
    tags = [x.tag, x.tag, x.tag + 1, x.tag + 2, x.tag + 3, flag_tag]
    return buf, tags[int(rng.integers(len(tags)))]


class _InPlace(Exception):
    """Rank 1 leaves its run after sending the rogue in place of its frame (same tag)."""


def _drain(comm, source):
    """Receive whatever `source` sent on `comm` that nobody took (into scratch: no size trusted)."""
    status = MPI.Status()
    while True:
        msg = comm.Improbe(source, MPI.ANY_TAG, status)
        if msg is None:
            return
        msg.Recv(np.empty(max(status.Get_count(MPI.BYTE), 1), dtype=np.uint8))


@pytest.mark.mpi(min_size=2)
def test_seeded_rogue_frames_are_named_or_harmless_never_a_crash(world, monkeypatch):
    size, rank = world.Get_size(), world.Get_rank()
    failures, codes, t0 = [], {}, time.monotonic()
    for case in range(CASES):
        if ONLY is not None and case != ONLY:
            continue
        rng = np.random.default_rng([SEED, case])
        n = (7, 600, 20000)[case % 3]  # a small frame, one message past 4 KiB, a split frame
        # every other case with the payload check (a payload CRC, and the flag rounds on the
        # block's flag tag after the program), the same on every rank
        check = case % 2 == 1
        monkeypatch.setenv("ALPHA_MPI_PAYLOAD_CHECK", "1" if check else "0")
        p = plan(Branch(Leaf(0, 0), Leaf(1, 1), 0), ReplicateAll(), n, size=size)
        comm = world.Dup()
        c = Combiner(comm, p, timeout=CHECKED if check else SHORT)
        sent, outcome = [], "idle"
        if rank in (0, 1):
            data = {s: np.random.default_rng([SEED, case, s]).standard_normal(n) for s in (0, 1)}
            want = np.array(oracle.evaluate(p.tree, {s: v.tolist() for s, v in data.items()}))

            def hook(index, header, rng=rng, sent=sent):
                x = c.compiled.msgs[index]
                if rank == 1 and not sent:
                    buf, tag = _rogue(rng, x, bytes(header), c.seat.block.flag_tag)
                    sent.append((c.comm.Isend(buf, dest=x.peer, tag=tag), buf))
                    if tag == x.tag and not x.split:
                        # the rogue is the frame: rank 1 sends nothing else (a split frame's
                        # payload still goes, so a rogue that passes as its header is not left
                        # waiting for one)
                        raise _InPlace

            c.send_hook = hook
            try:
                got = c.run({rank: data[rank]})
                same = got is not None and np.array_equal(got.view(np.uint64), want.view(np.uint64))
                # a rogue payload of the planned size on the payload's tag is combined: the
                # header CRC covers the header only (the threat model: corruption, not forgery)
                outcome = "oracle" if same else "combined-other"
            except Refusal as e:
                outcome = e.code
            except _InPlace:
                outcome = "sent-in-place"
        # What nobody took is received into scratch until every rank is here: rank 1's frames
        # that came after a rogue, rank 0's delivery to a rank 1 that left its run.
        if rank == 1:
            MPI.Request.Waitall([r for r, _ in sent])
        done = world.Ibarrier()
        while not done.Test():
            if rank in (0, 1):
                _drain(c.comm, 1 - rank)
        if rank in (0, 1):
            _drain(c.comm, 1 - rank)
        codes[outcome] = codes.get(outcome, 0) + 1
        allowed = ALLOWED + (("peer-timeout",) if check else ())
        if rank == 0 and outcome not in allowed and not outcome.startswith("frame-"):
            failures.append(f"seed {SEED} case {case}: {outcome}")
        c.free()
        comm.Free()
    took = time.monotonic() - t0
    agree(world, not failures, f"rank {rank}: {failures[:5]} (outcomes {codes}, {took:.1f} s)")
