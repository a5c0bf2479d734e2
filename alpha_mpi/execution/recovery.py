"""The reset of one endpoint: bring every rank's channel back to a clean state (layer 4).

A reset is collective (`alpha_mpi.execution.reset`, `alpha_mpi.arrays.reset`: every rank calls
it). One rank that calls it alone, while its peers run a call, used to split the outcome: the
peers named the reset marker they met (`executor-identity-mismatch`), the resetting rank waited
for their markers until the bound (`peer-timeout`). Now a rank that meets a peer's reset marker
while it runs a call refuses that call and resets with the peer where its next operation on the
communicator begins (engine.py, `peer_round` "reset"; Endpoint.pending_reset): a reset it calls
next is that reset (as before: every rank resets after a failure), a call it makes next joins it
first (`joined`) and then runs. Every rank refuses by name — the ranks in the call that call, the
resetting rank its reset when a rank joined — and every rank has reset alike, so the next call
works.

Protocol (every rank; `drop`: the streams this rank's reset drops, `joined`: it came from a
call):
1. Drop this rank's `drop` streams (Endpoint.drop_streams: each stream's front end forgets its
   executors, so the next call agrees a fresh stream).
2. Send a marker (RESET_TAG: two words, this rank and its `mask`: the streams it dropped, one
   bit each (STREAM_BITS), and JOINED) to every other rank; receive whatever each peer sent on
   the duplicate, in order, up to its marker, and drop it (the failed call's frames and verdict
   records: MPI keeps one sender's messages in order for a receive of any tag, so nothing sent
   before the marker is left). Every rank then drops the streams any rank dropped, so the
   ranks' streams stay alike.
3. One verdict round says each rank's counters: the round counter takes the largest (a rank
   whose round failed went one further); ranks whose executor numbering or tag allocator differ
   built different executors, which no reset mends (`executor-identity-mismatch`).
4. The failures recorded for the endpoint are forgiven (abort.forgive): every rank is alive
   and nothing of them is in flight, so the job may end cleanly.
5. A rank that did not join, where some rank joined from a call, refuses its reset by name
   (`executor-identity-mismatch`): a reset on one rank is a mistake even once mended.
Executors that broke stay broken (build new ones); their blocks are never handed out.
"""

from __future__ import annotations

import numpy as np

from .._record import Record
from ..refusals import Refusal
from . import verdict as vd
from .abort import forgive
from .tags import RESET_TAG, VERDICT_TAG

__all__ = ["JOINED", "STREAM_BITS", "Recovered", "recover"]

STREAM_BITS = {"calls": 1, "arrays": 2}  # the streams a reset drops, as its marker says them
JOINED = 1 << 8  # the marker's rank joined the reset from a call


class Recovered(Record):
    """What a reset found: `dropped`, the stale messages this rank drained; `joined`, the ranks
    that joined it from a call (their call refused). A Record: the endpoint imports this module
    on a program's first call (_record.py: the start-up budget)."""

    __slots__ = ("dropped", "joined")

    def __init__(self, dropped: int, joined: tuple) -> None:
        _set = object.__setattr__
        _set(self, "dropped", dropped)
        _set(self, "joined", joined)


def recover(ep, *, drop=(), joined: bool = False, timeout=None) -> Recovered:
    """The reset protocol of the module docstring on endpoint `ep` (collective)."""
    waiter = ep.round_waiter(timeout)
    me, p = ep.rank, ep.size
    if ep.pending_reset is not None:  # a peer's reset met in a run: this is that reset
        drop, ep.pending_reset = (*drop, *ep.pending_reset), None
    mask = _mask(drop) | (JOINED if joined else 0)
    ep.drop_streams(drop)
    marker = np.array([me, mask], dtype="<u8")
    sent = [ep.lib.Isend(marker, dest=q, tag=RESET_TAG) for q in range(p) if q != me]
    dropped, union, who = 0, mask, [me] if joined else []
    for q in range(p):
        while q != me:
            tag, body = waiter.receive_any(ep.lib, q, "draining the channel for a reset")
            if tag == RESET_TAG:
                theirs = int(np.frombuffer(body, dtype="<u8")[1]) if body.nbytes == 16 else 0
                union |= theirs
                if theirs & JOINED:
                    who.append(q)
                break
            dropped += 1
    ep.drop_streams([name for name, bit in STREAM_BITS.items() if union & bit])
    for req in sent:
        waiter.wait(req, None, -1, "a reset marker", 0)
    words = [ep.rounds, ep.next_sequence, ep.tags.next]
    v = vd.exchange(ep.lib, waiter, VERDICT_TAG, None, words, number=0, what="resetting the endpoint")
    if len({(int(w[1]), int(w[2])) for w in v.words}) > 1:
        shown = "; ".join(f"rank {r}: executor #{int(w[1])}, tag {int(w[2])}" for r, w in enumerate(v.words))
        raise Refusal(
            "executor-identity-mismatch",
            f"the ranks built different executors on this communicator ({shown}); a reset cannot mend that",
        )
    ep.rounds = int(v.words[:, 0].max())
    forgive(ep)
    done = Recovered(dropped, tuple(sorted(who)))
    if done.joined and not joined:
        raise Refusal(
            "executor-identity-mismatch",
            f"rank {me} reset while {vd.ranks_text(done.joined)} ran a call (a reset is collective: every "
            "rank calls it, at the same point); they refused that call and reset with this rank, so every "
            "rank's channel is clean and the next call works",
            ranks=done.joined,
        )
    return done


def _mask(names) -> int:
    m = 0
    for name in names:
        m |= STREAM_BITS.get(name, 0)
    return m
