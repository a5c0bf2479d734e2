"""One Endpoint per user communicator: the library's duplicate, executor numbering, tags, waits,
the build agreement and the verdict round (layer 4).

Every executor (Engine, and through it Allreducer, Combiner, Assembler, the convenience calls,
the arrays' exchanges, the learners' combines) is an Endpoint plus a Program; none duplicates
the communicator. The Endpoint of `comm` is kept as an MPI attribute of `comm` itself (it lives
and dies with it, so no freed handle that MPI hands out again can ever meet it; never a cache
keyed by handle; the one memo in front of it is keyed by the communicator OBJECT and cleared by
the attribute's delete callback, `existing`) and holds:

- `lib`: ONE duplicate of `comm`, made once (MPI_Comm_idup, waited under the wait policy's
  bound), that only alpha_mpi uses, so user messages never match ours (as mpi4jax clones its
  communicator once). Frames and verdict rounds travel on it; an executor built with dup=False
  sends its frames on `comm` itself (user traffic can reach them; refusals then say so).
- the executor numbering: executor k of this communicator has sequence k on every rank, agreed
  when it is built and carried in every frame header, so a frame of another executor is
  refused by name.
- the tag scheme (below), the wait policy (`waiter()`: the bound, the idle policy, whether
  this node runs more ranks than cores, measured once), the build agreement (`open_seat`) and
  the verdict round (`verdict`).

Protocol: who calls what, in which order (every rank of `comm`, the same calls in the same
order; `p` = comm size):

1. First use of `comm` (any executor's constructor, a learner's first round, a convenience
   call, an array reduction): `Endpoint.of(comm)` calls MPI_Comm_idup and waits for it under
   the bound (a rank that never comes is `peer-timeout`, not a hang), then one Split_type to
   count the ranks on this node. Nothing else collective ever happens on the communicator.
2. Building an executor (Engine.__init__): every local check first (the plan, its size, the
   timeout, the kernel build of the program: a refusal is kept, not raised), then
   `open_seat`, one verdict round on `lib` (direct: each record straight to every rank, so a
   rank still running a call finds it first and answers: Streams, below): each rank says its
   refusal (if any) and its key —
   the plan's identity, the rest of the executor's identity (contract, payload check), its
   sequence, the tag allocator's position — and what it needs of the tag space (its largest
   message count per peer, the free tags from the allocator's position and from the first
   block tag). Every rank then decides alike: a refusal anywhere → that rank raises its own,
   the others `peer-refused` naming it; keys that differ → `executor-identity-mismatch`
   naming the ranks; no room in the tag space → `tag-space-exhausted`; else every rank takes
   the same sequence and tag block, and the executor creates its persistent sends with them.
   After a refusal the sequence and the allocator are as before, so the next build pairs.
3. A constructor that refuses before it has a program (an Allreducer whose planning refused)
   takes part in the same round with its refusal (`refuse_build`), so its peers are not left
   waiting. A learner's local checks travel in its first agreement round the same way.
4. Learners, checkpoints, audits: `verdict(words, local, what)`: one round, every rank's
   status and words to every rank (verdict.py), then each caller decides from the same table.
5. Runs: an executor's frames carry its sequence and use its tag block only; the payload
   check's flag round after a run uses the block's last tag (Engine).

Tags: each executor's frames use a block of tags of their own, handed out in build order by
the endpoint's TagSpace (tags.py says how); tags below TAG_BASE are the endpoint's own
(VERDICT_TAG carries its verdict rounds, RESET_TAG a reset's markers).

Streams. Calls that run one at a time in program order on every rank — the convenience calls
(`allreduce`, `combine`, `reduce_scatter`) and the array reductions — share one block per kind
(a `Stream`, agreed once when the first such call is made), as they share one failure state:
their executors are told apart by the identity and sequence in every frame, so a rank that
calls another operation than its peers meets them in the frames and is named there. A rank
that builds another executor of the stream (another realization, delivery, tree or layout)
while its peers run a warm call is named at once, by the first call's refusal: a build round is
direct (every record straight to every rank, not Bruck's rounds), an executor that waits for a
peer's frame looks at that peer's first message (Engine, engine_walk), and a build record there
makes it answer the round with the executor it runs (`answer_build`): every rank sees the keys
differ, `executor-identity-mismatch` naming the ranks. Executors of their own (an Allreducer)
are watched alike, and also for a frame of another live executor there (the peer runs its
executors in another order): the rank that finds one opens that round itself, and every rank
still waiting finds its record first and answers (issue 45).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from .._record import fields_repr
from ..refusals import Refusal
from . import recovery
from . import verdict as vd
from .abort import mark_broken, owns_failures
from .build_key import ANSWERING, build_key, refuse_different
from .recovery import Recovered
from .tags import RESET_TAG, TAG_BASE, VERDICT_TAG, TagBlock, TagSpace, block_size
from .waits import DEFAULT_TIMEOUT, POLLS_BEFORE_YIELD, Waiter, timeout_from_env

__all__ = [
    "Endpoint",
    "Seat",
    "Stream",
    "TagBlock",
    "TAG_BASE",
    "VERDICT_TAG",
    "STREAM_MESSAGES",
    "dup_false_hint",
]

STREAM_MESSAGES = 256  # messages per pair of ranks a stream's block holds (a call needing more gets its own)
_KEY = []  # the MPI keyval of the endpoint attribute (created once per process)
# [(communicator object last looked up, its Endpoint)], the pair replaced whole (threads): mpi4py's
# Get_attr costs ~1 us, most of what allreduce() adds to its Allreducer. Cleared by the Free.
_LAST: list = [(None, None)]


# Seat and Stream are written out, not dataclasses: a program's first reduction defines them
# (_record.py: a dataclass costs about 1 ms to define, the start-up budget is 20 ms).
class Seat:
    """What an executor holds of its endpoint: its agreed `sequence` and tag `block`, and the
    communicator its frames travel on (`wire`: the endpoint's duplicate, or the user's
    communicator for dup=False, where user traffic can reach them: `shared`)."""

    def __init__(
        self,
        endpoint: Endpoint,
        sequence: int,
        block: TagBlock,
        wire: object,
        shared: bool,
        owned: bool = True,  # the block is this seat's own (False: a stream's, released with it)
    ) -> None:
        self.endpoint = endpoint
        self.sequence = sequence
        self.block = block
        self.wire = wire
        self.shared = shared
        self.owned = owned

    def __repr__(self) -> str:
        return fields_repr(self, ("endpoint", "sequence", "block", "wire", "shared", "owned"))

    def release(self) -> None:
        """Give the block back (the executor was freed); a broken executor's stays held."""
        if self.owned:
            self.owned = False
            self.endpoint.tags.release(self.block.base)

    def hint(self, e: Refusal) -> Refusal:
        """`e`, with the dup=False hint where user traffic can reach this seat's frames."""
        return dup_false_hint(e) if self.shared else e


class Stream:
    """A tag block shared by the executors of calls that run one at a time (see the module
    docstring), with the state they share: `seat` (its sequence and block, agreed once), what
    the calls keep (`state`: the convenience cache, the arrays' exchanges) and `broken` (the
    refusal code after which messages of a failed call may still be on the block)."""

    def __init__(
        self,
        name: str,
        seat: Seat,
        state: dict | None = None,
        broken: str | None = None,
        drop: Callable[[Stream], None] | None = None,
    ) -> None:
        self.name = name
        self.seat = seat
        self.state = {} if state is None else state
        self.broken = broken
        # what its front end forgets when a reset drops the stream (called with the stream)
        self.drop = drop

    def __repr__(self) -> str:
        return fields_repr(self, ("name", "seat", "state", "broken"))


class Endpoint:
    """alpha_mpi's state on one user communicator (see the module docstring). Use
    `Endpoint.of(comm)`: it makes the Endpoint on the first call (collective) and returns the
    same one afterwards."""

    __slots__ = (
        "user",
        "lib",
        "rank",
        "size",
        "before_yield",
        "tags",
        "rounds",
        "streams",
        "pending_reset",
        "_sequence",
    )

    @classmethod
    def of(cls, comm: MPI.Comm, timeout: float | None = None) -> Endpoint:
        """The Endpoint of `comm`, made on first use (collective then: every rank calls it).
        `timeout`: the bound of that first MPI_Comm_idup (a bad value: the default bound; it is
        refused by whoever passed it, in its own round)."""
        last = _LAST[0]
        if comm is last[0]:
            return last[1]
        if not _KEY:
            _KEY.append(MPI.Comm.Create_keyval(delete_fn=_deleted))
        ep = comm.Get_attr(_KEY[0])
        if ep is None:
            ep = cls(comm, timeout)
            comm.Set_attr(_KEY[0], ep)
        _LAST[0] = (comm, ep)
        return ep

    @staticmethod
    def existing(comm: MPI.Comm) -> Endpoint | None:
        """The Endpoint of `comm` if one was made (no communication)."""
        last = _LAST[0]
        if comm is last[0]:
            return last[1]
        return Endpoint.of(comm) if _KEY and comm.Get_attr(_KEY[0]) is not None else None

    def __init__(self, comm: MPI.Comm, timeout: float | None = None) -> None:
        self.user = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        try:
            bound = timeout_from_env(timeout)
        except Refusal:
            bound = DEFAULT_TIMEOUT
        lib, req = comm.Idup()
        try:
            Waiter(self.rank, bound).complete(req, "making alpha_mpi's duplicate of the communicator")
        except Refusal as e:
            mark_broken(self.rank, e.code, [req])
            raise
        self.lib = lib
        # Whether this node runs more ranks than cores (then waits yield from the first empty
        # poll): collective once, here, where every rank is known to be.
        local = lib.Split_type(MPI.COMM_TYPE_SHARED)
        try:
            crowded = local.Get_size() > (os.cpu_count() or 1)
        finally:
            local.Free()
        self.before_yield = 1 if crowded else POLLS_BEFORE_YIELD
        ub = lib.Get_attr(MPI.TAG_UB)
        self.tags = TagSpace(int(ub) if ub else 32767)
        self.rounds = 0
        self.streams: dict[str, Stream] = {}
        # the streams to drop in a peer's reset this rank met in a run and has not joined yet
        self.pending_reset: tuple | None = None
        self._sequence = 0

    # -- waits and rounds ----------------------------------------------------------------------
    def waiter(self, timeout=None) -> Waiter:
        """A Waiter with `timeout` (else ALPHA_MPI_TIMEOUT, else the default; refused by name
        when it is not a finite number > 0) and this node's idle policy. Local."""
        return Waiter(self.rank, timeout, self.before_yield, self._explain)

    def _round_waiter(self, timeout) -> Waiter:
        try:
            return self.waiter(timeout)
        except Refusal:  # refused by the caller in its own round; this round still ends
            return self.waiter(DEFAULT_TIMEOUT)

    def verdict(
        self, words, local: BaseException | None, what: str, *, timeout=None, direct: bool = False
    ) -> vd.Verdicts:
        """One verdict round on this communicator (collective, in the same order on every rank):
        this rank's `local` failure (or None) and `words` (uint64; the same count on every
        rank) to every rank. Returns the table (verdict.Verdicts); raises only when the round
        itself fails (a peer that never comes: peer-timeout; a rank out of step). `direct`:
        every record straight to every rank (verdict.exchange)."""
        if self.pending_reset is not None:  # a peer's reset first (recovery.py)
            self.settle(timeout=timeout)
        number = self.rounds
        self.rounds += 1
        return vd.exchange(
            self.lib,
            self._round_waiter(timeout),
            VERDICT_TAG,
            local,
            np.asarray(words, dtype=np.uint64).reshape(-1),
            number=number,
            what=what,
            owner=self,
            direct=direct,
        )

    def agree(self, local: BaseException | None, what: str, *, timeout=None) -> None:
        """A verdict round that carries only each rank's failure: returns on every rank when no
        rank failed, else raises on every rank (this rank's own, `peer-refused` elsewhere)."""
        self.verdict((), local, what, timeout=timeout).raise_failures(local, what)

    # -- executors -----------------------------------------------------------------------------
    @property
    def next_sequence(self) -> int:
        """The sequence the next build agreement gives (its frames' headers are made before)."""
        return self._sequence

    def open_seat(
        self,
        identity: str,
        local: BaseException | None,
        messages: int,
        what: str,
        *,
        timeout=None,
        dup: bool = True,
        stream: Stream | None = None,
    ) -> Seat:
        """The build agreement of one executor (step 2 of the protocol): returns its Seat on
        every rank, or raises on every rank. `identity`: what every rank must build alike
        ("plan|rest"); `local`: this rank's refusal so far; `messages`: this rank's largest
        message count per peer in the program; `stream`: share that stream's block when it is
        large enough (else the executor gets its own)."""
        sequence, (base, here, wrapped) = self._sequence, self.tags.offer()
        self._sequence += 1
        key = build_key(identity or "-", sequence, base)
        try:
            # Builds go direct: a peer still running a call of an executor finds this record
            # first from this rank and answers the round (`answer_build`), as does every rank
            # that then finds an answer first.
            v = self.verdict(
                [*key, messages, here, wrapped],
                local,
                "building an executor",
                timeout=timeout,
                direct=True,
            )
            v.raise_failures(local, f"building the {what}")
            refuse_different(v, what)
            need = int(v.words[:, 4].max())
            if stream is not None and need <= stream.seat.block.messages:
                block, owned = stream.seat.block, False
            else:
                block, owned = self.tags.place(block_size(need), v.words, what), True
        except Refusal:
            self._sequence = sequence  # nothing was built: the next build reuses the number
            raise
        if owned:
            self.tags.hold(block, sequence)
        wire = self.lib if dup else self.user
        return Seat(self, sequence, block, wire, shared=not dup, owned=owned)

    def answer_build(self, identity: str, sequence: int, base: int, what: str, *, timeout=None) -> None:
        """A rank whose warm call of a stream found a peer's build record where it waited for
        that peer's frame (Engine, `peer_round="verdict"`): it answers that build round with the
        key of the executor it was running (`identity`, `sequence`, `base`), so every rank sees
        the keys differ and raises `executor-identity-mismatch` naming the ranks, at once (the
        first call's refusal), where the builder used to wait for the bound. Always raises; the
        executor numbering and the tag allocator are left as they were on every rank."""
        key = build_key(identity or "-", sequence, base)
        v = self.verdict([*key, ANSWERING, 0, 0], None, "building an executor", timeout=timeout, direct=True)
        v.raise_failures(None, f"building the {what}")
        refuse_different(v, what)
        # Unreachable in practice (a peer's new executor has a later sequence than any running
        # one), but never go on as if something was built.
        raise Refusal(
            "executor-identity-mismatch",
            f"a peer built a {what} while this rank ran one of its calls; no rank built it",
        )

    def refuse_build(self, local: Refusal, what: str, *, timeout=None, stream: Stream | None = None) -> None:
        """Take part in the build agreement of the executor the peers are building, with this
        rank's refusal `local` (step 3 of the protocol); always raises. `stream`: the stream the
        peers build on (its builds go direct: open_seat)."""
        self.open_seat("", local, 0, what, timeout=timeout, stream=stream)
        raise local  # pragma: no cover - open_seat raises `local` itself

    def stream(self, name: str, *, timeout=None, drop=None) -> Stream:
        """The stream `name` ("calls": the convenience calls, "arrays": the array reductions),
        agreed on first use (collective then: one build round). `drop(stream)`: what its front
        end forgets when a reset drops it (recovery.py)."""
        st = self.streams.get(name)
        if st is None:
            from .engine_build import payload_check_from_env

            identity = f"alpha_mpi stream {name}|{int(payload_check_from_env())}"
            seat = self.open_seat(identity, None, STREAM_MESSAGES, f"{name} stream", timeout=timeout)
            st = self.streams[name] = Stream(name, seat, drop=drop)
        return st

    def drop_streams(self, names) -> None:
        """Forget the streams `names` (local): each one's front end drops what it keeps, and the
        next call of that kind agrees a fresh stream."""
        for name in names:
            st = self.streams.pop(name, None)
            if st is not None and st.drop is not None:
                st.drop(st)

    # -- recovery ------------------------------------------------------------------------------
    def recover(self, *, drop=(), joined: bool = False, timeout=None) -> Recovered:
        """Bring this endpoint back to a clean state after a failed call (collective: every
        rank, while no executor of this communicator runs on another thread): recovery.py's
        protocol. `drop`: the streams this rank's reset drops; `joined`: this rank joins a
        peer's reset from a call it was running. Returns what it found (`Recovered`); raises
        `executor-identity-mismatch` on a rank that reset while a peer ran a call (once every
        rank has reset: the next call works)."""
        return recovery.recover(self, drop=drop, joined=joined, timeout=timeout)

    def settle(self, *, timeout=None) -> None:
        """Join the reset a peer made while this rank ran a call, if one is pending (collective
        with it): where this rank's next operation on the communicator begins."""
        names, self.pending_reset = self.pending_reset, None
        if names is not None:
            self.recover(drop=names, joined=True, timeout=timeout)

    def round_waiter(self, timeout) -> Waiter:
        """The waiter of a round (the default bound where `timeout` is refused by its caller)."""
        return self._round_waiter(timeout)

    def _explain(self, comm, peer: int, tag: int) -> str | None:
        """For a receive of `tag` from `peer` that timed out: what `peer` sent first instead (a
        look at its next message, which stays where it is), or None."""
        status = MPI.Status()
        if not comm.Iprobe(peer, MPI.ANY_TAG, status) or status.Get_tag() == tag:
            return None
        t = status.Get_tag()
        what = f"a message with tag {t}" + (
            "" if comm is self.lib else " on this user communicator (dup=False)"
        )
        if comm is self.lib and t == VERDICT_TAG:
            what = "a verdict record (it is building an executor, or in a learner's, checkpoint's or audit's round)"
        elif comm is self.lib and t == RESET_TAG:
            what = "a reset marker (it called reset)"
        for st in self.streams.values():
            if st.seat.block.base <= t < st.seat.block.base + st.seat.block.size:
                what = f"a frame of the {st.name} stream (another call of that kind)"
        seq = self.tags.holder(t)
        if seq is not None:
            what = f"a frame of executor #{seq} of this communicator"
        return (
            f"meanwhile rank {peer} sent {what}: the ranks are out of step (a rank skipped, repeated or "
            "reordered a call, or passed other arguments)"
        )


def _deleted(comm, keyval, ep) -> None:
    """The user's communicator is being freed (MPI_Comm_free, or MPI_Finalize for the
    predefined ones): free the endpoint's duplicate with it, unless a failure may have left
    frames of it in flight (then the job aborts at exit anyway)."""
    if _LAST[0][1] is ep:
        _LAST[0] = (None, None)
    try:
        if ep.lib != MPI.COMM_NULL and not owns_failures(ep):
            ep.lib.Free()
    except Exception:  # never raise out of an MPI callback
        pass


def dup_false_hint(e: Refusal) -> Refusal:
    """`e` with a hint that user traffic may be the cause: for frame refusals and timeouts of
    an executor that runs on a user communicator (dup=False), and for `peer-refused` naming a
    peer's frame refusal (the one failure path flags a bad frame onwards to every rank)."""
    relayed = e.code == "peer-refused" and str(e.context.get("peer_code") or "").startswith("frame-")
    if not (e.code.startswith("frame-") or e.code == "peer-timeout" or relayed):
        return e
    hint = (
        " (this executor shares a user communicator, dup=False: a message of yours with the same tag, or a "
        "receive of yours with ANY_TAG/ANY_SOURCE, may have taken or replaced a frame; build it with dup=True)"
    )
    return type(e)(e.code, e.message + hint, **e.context)
