"""The one executor: runs any realization's Program (planning/program.py) over mpi4py (layer 4).

An Engine is an Endpoint plus a Program: every rank builds an Engine for the same Program, and
the build ends in the endpoint's build agreement (endpoint.py: one verdict round): every rank
built the same executor, as the same executor of its communicator (its sequence, carried in
every frame), with the same tag block, or every rank refuses by name. No communicator is
duplicated here (the endpoint holds alpha_mpi's one duplicate of each user communicator). Work
buffers, frame headers, the MPI requests and the C records of every op are built once
(engine_build.py; the requests once the agreement gave the tags); a run binds the caller's
contributions and `out` (its PreparedRun, prepared.py: the one door of every front end) and is
then ONE call into C (csrc/round/, built by the MPI's own mpicc: native.py) that
interprets the rank's ops: P posts a receive, S writes a header (the
flags seen so far) and starts a send, W waits for a frame and checks it (one comparison of its
header; the field-by-field naming only on a mismatch, back in Python), D completes a send, E is
one fused kernel pass, C a copy, F a finiteness check, M a merge of node summaries (the arrays).
The C loop returns to Python only when there is something Python must do (engine_walk.py): a
bad frame to name, the send hook of tests, a wait long enough that signals must be handled, a
failure. docs/design.md "The round in C" records why the run is C and what it costs.

Failure semantics (the protocol, not an afterthought):
- A local refusal (a bad contribution, `out` or `timeout=`) does not leave peers waiting: this
  rank runs the whole program on zeros in place of its data, its frames flagged `refused` with
  its rank and code; every rank completes the run, then the refusing rank raises its refusal
  and every rank the flag reached raises `peer-refused` naming it. The next run works.
- With the payload check on (ALPHA_MPI_PAYLOAD_CHECK=1, held equal by the build agreement) the
  flag rounds at the end of the program (planning/flag_rounds.py: header-only frames on the
  block's flag tag, in the same C call) reach the ranks no later frame reaches: a bad frame
  found in a rank's last receive is named on every rank (the lowest refusing rank), or none
  refuses. With the check off a bad header
  found in a rank's last receive is refused on that rank only (docs/allreduce.md says why).
- FiniteOrRefuse: a non-finite value makes the combined value non-finite; the ranks that check
  it (F) flag their later frames, and every rank the flag reaches refuses after communication
  completed (`non-finite-contribution` where the bad slot is, else `non-finite-combined`).
- A bad frame (a header that is not the one planned, another size, a payload failing its
  check) is refused on the rank that finds it and flagged onwards like a local refusal: the
  program goes on over zeros in its place, every rank names it. A payload failure leaves the
  engine usable; a frame of another program marks it broken after the run (that program may
  have sent more), except where the Program says every peer program pairs one to one.
- A genuine failure (timeout, a dead peer) may leave frames in flight: the engine is broken
  (`combiner-broken` on later runs; build a new one on every rank), its tag block is never
  handed out again, and the job aborts at exit instead of hanging (abort.mark_broken). Sends
  are never cancelled. Any other exception
  inside a run (a bug, an interrupt) breaks the engine too, and later runs say which.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import numpy as np

from ..planning.flag_rounds import needs_flag_rounds, with_flag_rounds
from ..planning.program import Program
from ..refusals import PlanRefusal, Refusal
from .abort import mark_broken
from .endpoint import RESET_TAG, VERDICT_TAG, Endpoint
from .engine_bind import Chunk
from .engine_build import compile_program, open_exec, payload_check_from_env
from .log import debug_enabled
from .prepared import PreparedRun
from .receives import matched_first
from .waits import DEFAULT_TIMEOUT, SIGNAL_SLICE, SLEEP_AFTER

if TYPE_CHECKING:
    from mpi4py import MPI

    from .contributions import Contributions
    from .endpoint import Seat, Stream


class Engine:
    """Executes one Program repeatedly on one communicator. Build it on every rank of `comm`.

    The build ends in the endpoint's build agreement (endpoint.py). `dup`: True (default) runs
    the frames on alpha_mpi's duplicate of `comm` (made once per communicator, shared by every
    executor on it; each executor has its own tags); False runs them on `comm` itself, where a
    message of the user's can take or replace a frame (refusals then say so). `what` names the
    executor in refusals ("Allreducer"). `stream`: a Stream whose tag block this executor
    shares (the convenience calls). `seat`: an agreed Seat to run on without a round of its own
    (the arrays' exchanges, built lazily on their stream: endpoint.py). Subclasses that take
    another kind of plan (Combiner: a tree Plan; ScatterCombiner: a scatter program) say how it
    becomes the Program they run, in `_program_of`."""

    def __init__(
        self,
        comm: MPI.Comm,
        program: Program,
        *,
        timeout: float | None = None,
        contract: str = "",
        dup: bool = True,
        what: str = "executor",
        stream: Stream | None = None,
        seat: Seat | None = None,
    ) -> None:
        # Everything that can refuse on one rank is decided before the build agreement, and
        # every rank takes part in it with its verdict: every rank built the same executor, or
        # every rank refuses by name and no later call pairs with the wrong one.
        self.payload_check = payload_check_from_env()
        self.compiled, self.seat, self.broken = None, None, None
        self._hook, self._prepared = None, None
        self.endpoint = ep = Endpoint.of(comm, timeout)
        self.rank = ep.rank
        self.comm = (ep.lib if dup else comm) if seat is None else seat.wire
        self.sequence = ep.next_sequence if seat is None else seat.sequence
        given_seat = seat is not None
        local, identity = None, ""
        try:
            self.waiter = ep.waiter(timeout)
        except Refusal as e:  # a bad timeout=: refused on every rank by the agreement
            local, self.waiter = e, ep.waiter(DEFAULT_TIMEOUT)
        try:
            if local is not None:
                raise local
            program = self._program_of(program)
            _check_size(program, comm)
            identity = f"{program.identity}|{contract}|{int(self.payload_check)}"
            self._build(program, contract)
        except Refusal as e:
            if given_seat:
                raise
            local = e
        if not given_seat:
            need = self.compiled.messages_per_peer if self.compiled is not None else 0
            seat = ep.open_seat(identity, local, need, what, timeout=timeout, dup=dup, stream=stream)
        elif self.compiled.messages_per_peer > seat.block.messages:
            raise Refusal(
                "tag-space-exhausted",
                f"this program sends {self.compiled.messages_per_peer} messages to one peer; its stream's tag "
                f"block holds {seat.block.messages}",
            )
        self.seat, self.identity = seat, identity
        # Every frame is matched first (size-safe, csrc/round/native.h): any rank may send
        # anything on the duplicate too (receives.py, the threat model).
        shared_channel = seat.shared or given_seat or not seat.owned
        self.probe = matched_first(shared_channel)
        # An executor on the duplicate looks, after each slice of a wait, at what the awaited
        # peer sent first (engine_walk: a peer building another executor or running another
        # one is named at once, not at the bound). Off on a user communicator (user traffic).
        self.watch = None if seat.shared else self.foreign
        self.streamed = given_seat or not seat.owned  # one of a stream's executors (endpoint.py)
        self.what = what
        open_exec(self.compiled, self.comm, seat.block, self.probe)

    def _build(self, program: Program, contract: str) -> None:
        if needs_flag_rounds(program, self.payload_check):
            # a bad frame in a rank's last receive, and any refusal of a run delivered to one
            # rank, reach some ranks by no frame: the flag rounds after the program (in the
            # same C call) make every rank refuse, or none
            program = with_flag_rounds(program)
        self.program = self.plan = program
        rank = self.rank
        self.timeout = self.waiter.timeout
        self.debug = debug_enabled()
        self.broken = None  # the refusal code that broke this executor
        self.contract = contract
        self.compiled = c = compile_program(program, rank, contract, self.sequence)
        self.rp, self.bufs, self.n = c.rp, c.bufs, c.n
        policy, w = c.ex.policy, self.waiter
        policy.before_yield, policy.spin, policy.slice, policy.sleep_after = (
            w.before_yield,
            int(w.spin),
            SIGNAL_SLICE,
            SLEEP_AFTER,
        )
        policy.debug = int(self.debug)
        # ALPHA_MPI_PAYLOAD_CHECK=1 (self.payload_check, read before the build agreement, which
        # holds it equal on every rank): a CRC32C of every payload travels in its header and is
        # checked on arrival (opt-in: docs/performance.md gives its cost).
        c.ex.program.check_payload = int(self.payload_check)
        self.slots = c.rp.slots
        self.is_receiver = c.is_receiver
        self.realization = program.realization
        self.chunk = program.chunk(rank)  # reduce-scatter: (start, stop) of this rank's chunk
        # Programs whose every possible peer program pairs its messages one to one with this one
        # (the arrays' exchanges in rank order): a foreign frame leaves nothing in flight, so
        # the executor stays usable after naming it.
        self.pairs = bool(program.details.get("foreign_frames_pair"))

    @property
    def send_hook(self):
        """Fault injection for tests and verification tools (alpha_mpi_verify, tests/): when set,
        called as send_hook(message index, header memoryview) after a header is written and
        before it is sent (the C round stops there for it). None in production: then the round
        never leaves C for it."""
        return self._hook

    @send_hook.setter
    def send_hook(self, hook) -> None:
        self._hook = hook
        if self.compiled is not None:
            self.compiled.ex.policy.hook = int(hook is not None)

    def _program_of(self, plan: object) -> Program:
        """The Program this executor runs for `plan` (`plan-kind-mismatch` for another kind)."""
        if not isinstance(plan, Program):
            raise PlanRefusal(
                "plan-kind-mismatch", f"Engine runs a Program (planning.realize), got {type(plan).__name__}"
            )
        return plan

    def prepare(self) -> PreparedRun:
        """The prepared run of this executor (prepared.py): the one door every front end runs
        it through. An executor has one (its C records have one buffer table)."""
        if self._prepared is None:
            self._prepared = PreparedRun(self)
        return self._prepared

    def run(
        self, contributions: Contributions, out: np.ndarray | None = None, *, timeout: float | None = None
    ) -> np.ndarray | None:
        """Run the program once with this rank's contributions (slot -> float64 payload):
        PreparedRun.run. Returns the combined payload where the delivery reaches this rank, else
        None (`out`, if given, is then left as it was); reduce-scatter mode: the values of this
        rank's chunk, coordinates `self.chunk`. `timeout` overrides the per-wait bound."""
        return self.prepare().run(contributions, out, timeout=timeout)

    def reduce_scatter_run(
        self, contributions: Contributions, out: np.ndarray | None = None, *, timeout: float | None = None
    ) -> Chunk:
        """Reduce-scatter programs only: run once and return Chunk(start, stop, values). `out`:
        an array of the chunk's length, or of the whole payload (written at out[start:stop])."""
        return self.prepare().reduce_scatter_run(contributions, out, timeout=timeout)

    @property
    def step(self) -> int:
        """The frame step of the next run."""
        return self.prepare().step

    @property
    def flags(self) -> int:
        """The frame flags the last run saw (frames.FLAG_*)."""
        return self.prepare().flags

    def foreign(self, tag: int) -> int | None:
        """For the first message an awaited peer sent on this executor's channel, with `tag`:
        what says the peer is not in this run (engine_walk), else None: VERDICT_TAG or
        RESET_TAG themselves (it builds, answers or resets), or the sequence of the other
        executor whose run the frame belongs to (a live one's block, not this executor's,
        where no run failed). Looked at only after a wait's slice, never on the fast path."""
        # Executors run at once from several threads send their messages in any order, so one
        # of another run first proves nothing there: only a process of one Python thread, whose
        # runs and builds follow one another, says the peer is elsewhere. (A stream's calls and
        # builds run one at a time by definition: its records and markers always count.)
        import threading  # here, not at import: a first reduction need not load it (start-up)

        alone = threading.active_count() == 1
        if tag in (VERDICT_TAG, RESET_TAG):
            return tag if alone or self.streamed else None
        block = self.seat.block
        if not alone or block.base <= tag < block.base + block.size:
            return None
        return self.endpoint.tags.running(tag)

    def failed(self, e: Refusal, st, timeout) -> Refusal:
        """A run ended in refusal `e`: break the executor and return what to raise (PreparedRun)."""
        self.fail(e)
        if e.context.get("peer_round") == "reset":
            return self._join_reset(e, timeout)
        if e.context.get("peer_round") in ("verdict", "frame"):
            # the peer builds another executor, or runs another one: answer (or open) a build
            # round straight to every rank, so that every rank names the mismatch at once
            # (Endpoint.answer_build raises it; a rank still waiting in this run finds this
            # rank's record first and answers in turn)
            try:
                self.endpoint.answer_build(
                    self.identity, self.sequence, self.seat.block.base, self.what, timeout=timeout
                )
            except Refusal as answered:
                if e.context.get("peer_round") == "frame":
                    answered = Refusal(
                        answered.code, f"{e.message}; every rank: {answered.message}", **answered.context
                    )
                return self.hint(answered)
        if st.bad is not None and e is not st.bad:
            # a bad frame came first and explains what followed (a peer running another
            # program stops sending what this one waits for)
            return self.hint(st.bad)
        return self.hint(e)

    def _join_reset(self, e: Refusal, timeout) -> Refusal:
        """A peer reset while this rank ran (recovery.py): what to raise. The first time, this
        rank's reset with it is left pending (Endpoint.pending_reset, with the stream this run
        belongs to), so that a reset this rank makes next pairs with the peer's as before, and
        its next call on the communicator joins it instead; a run that meets the marker again
        joins it now."""
        ep = self.endpoint
        names = tuple(st.name for st in ep.streams.values() if st.seat.block == self.seat.block)
        if ep.pending_reset is None:
            ep.pending_reset = names
            return Refusal(
                e.code,
                f"{e.message}; this rank resets with it where its next call on this communicator begins (or "
                "in the reset it calls next): every rank's channel is then clean, and that call works",
                **e.context,
            )
        ep.pending_reset += names
        try:
            ep.settle(timeout=timeout)
        except Refusal as failed:
            return self.hint(failed)
        return Refusal(
            e.code,
            f"{e.message}; this rank has reset with it (a reset is collective), so every rank's channel is "
            "clean: the next call works",
            **e.context,
        )

    @property
    def shared(self) -> bool:
        """Whether user traffic can reach this executor's frames (dup=False)."""
        return self.seat is not None and self.seat.shared

    def hint(self, e: Refusal) -> Refusal:
        """`e`, with the dup=False hint where user traffic can reach this executor's frames."""
        return self.seat.hint(e)

    def fail(self, e: BaseException) -> None:
        """Break the executor after `e` (a run that may have left frames in flight)."""
        code = getattr(e, "code", None) or type(e).__name__  # a refusal's code, else the exception's name
        if code in ("executor-reentrant", "combiner-broken"):
            return
        self.broken = code
        self.endpoint.tags.spoil(self.seat.block.base)  # frames of this run may wait on its tags
        c = self.compiled
        rc = c.native.lib.an_cancel_receives(c.ex)
        mark_broken(self.rank, code, [_PendingSends(c)], self.endpoint)
        also = f"  r{self.rank}: cancelling its receives failed in MPI too: {_mpi_error(rc)}\n" if rc else ""
        sys.stderr.write(
            f"r{self.rank} | {self.realization} step {self.step} refused [{code}]: {getattr(e, 'message', e)}\n"
            f"  r{self.rank}: {self.rp.text()}  <-- ERROR HERE\n{also}"
        )
        sys.stderr.flush()

    def free(self) -> None:
        """Free the requests and give the tag block back (a broken executor's stays held: frames
        of it may still be in flight). A send still in flight completes in the background;
        receives still posted are cancelled first. Local: no communication."""
        c, rc = self.compiled, 0
        if c is not None and c.keep:
            lib = c.native.lib
            if self.broken is not None and lib.an_pending_sends(c.ex):
                # A send of a broken executor still in flight: its requests, records and
                # buffers stay, and the caller's arrays it may read (abort.py tests them at exit;
                # a reset's drain completes them).
                rc = lib.an_cancel_receives(c.ex)
            else:
                rc = lib.an_free(c.ex)
                c.keep.clear()  # the records; the buffers stay with `c`
                self.prepare().release()
        if self.seat is not None and self.broken is None:
            self.seat.release()
        if rc:  # freed all the same; MPI said something is wrong with the channel
            raise Refusal(
                "peer-failed",
                f"rank {self.rank}: freeing the {self.what}'s requests failed in MPI: {_mpi_error(rc)}",
            )


class _PendingSends:
    """What abort.mark_broken tests at exit for a broken executor: its sends (in C).
    Holds the compiled program, so buffers a send in flight still reads stay alive."""

    def __init__(self, compiled):
        self.compiled = compiled

    def Test(self) -> bool:
        c = self.compiled
        if not c.keep:  # freed: Engine.free frees a broken executor only once its sends completed
            return True
        return c.native.lib.an_pending_sends(c.ex) == 0


def _mpi_error(rc: int) -> str:
    """The MPI library's words for error code `rc`."""
    from mpi4py import MPI

    return MPI.Exception(rc).Get_error_string().strip()


def _check_size(program: Program, comm) -> None:
    """`plan-rank-mismatch` unless `program` is for as many ranks as `comm` has (checked before
    the build agreement, so the rank it fails on is the one named)."""
    size = comm.Get_size()
    if program.size != size:
        raise PlanRefusal(
            "plan-rank-mismatch", f"the program is for {program.size} ranks, the communicator has {size}"
        )


__all__ = ["Engine"]
