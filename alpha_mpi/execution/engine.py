"""The one executor: runs any realization's Program (planning/program.py) over mpi4py (layer 4).

An Engine is an Endpoint plus a Program: every rank builds an Engine for the same Program, and
the build ends in the endpoint's build agreement (endpoint.py: one verdict round): every rank
built the same executor, as the same executor of its communicator (its sequence, carried in
every frame), with the same tag block, or every rank refuses by name. No communicator is
duplicated here (the endpoint holds alpha_mpi's one duplicate of each user communicator). Work
buffers, frame headers, persistent send requests,
kernel pointer arrays and the op table are built once; a run binds the caller's contributions
and `out`, then walks the rank's ops: S starts a send (its header carries the flags seen so
far), W matches a frame, compares its size with the plan's and only then receives it
(inbound.py: never into a buffer smaller than the message) and checks its header (one bytes
comparison; the field-by-field naming only on a mismatch), D completes a send, E is one fused
kernel pass, C a copy, F a finiteness check, M a merge of node summaries (the arrays). The
planner's P ops (post a receive) post nothing. By composition: engine_build compiles the rank's
program once into a frozen Compiled (named op records), engine_bind's functions bind each run,
engine_walk has one function per op kind; this class holds them and the run's bookkeeping.

Failure semantics (the protocol, not an afterthought):
- A local refusal (a bad contribution, `out` or `timeout=`) does not leave peers waiting: this
  rank runs the whole program on zeros in place of its data, its frames flagged `refused` with
  its rank and code; every rank completes the run, then the refusing rank raises its refusal
  and every rank the flag reaches raises `peer-refused` naming it. The next run works.
- With the payload check on (ALPHA_MPI_PAYLOAD_CHECK=1, held equal by the build agreement) one
  flag round after the run (a verdict round on the block's flag tag) reaches the ranks no later
  frame reaches: a bad frame found in a
  rank's last receive is named on every rank, or none refuses. With the check off a bad header
  found in a rank's last receive is refused on that rank only (docs/allreduce.md says why).
- FiniteOrRefuse: a non-finite value makes the combined value non-finite; the ranks that check
  it (F) flag their later frames, and every rank the flag reaches refuses after communication
  completed (`non-finite-contribution` where the bad slot is, else `non-finite-combined`).
- A bad frame (a header that is not the planned one, another size, a payload failing its
  check) is refused on the rank that finds it and flagged onwards like a local refusal: the
  program goes on over zeros in its place, every rank names it. A payload failure leaves the
  engine usable; a frame of another program marks it broken after the run (that program may
  have sent more), except where the Program says every peer program pairs one to one.
- A genuine failure (timeout, a dead peer) may leave frames in flight: the engine is broken
  (`combiner-broken` on later runs; build a new one on every rank), its tag block is never
  handed out again, and the job aborts at exit instead of hanging (abort.mark_broken). Sends
  are never cancelled. Any other exception inside a run (a bug, an interrupt) breaks the
  engine too, and later runs say which.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import numpy as np

from .. import kernel
from ..planning.program import Program
from ..refusals import PlanRefusal, Refusal
from . import engine_bind as bind
from . import frames as fr
from . import verdict
from .abort import mark_broken
from .endpoint import Endpoint
from .engine_bind import Chunk
from .engine_build import compile_program, open_sends, payload_check_from_env
from .engine_ops import warn_retired
from .engine_walk import RunState
from .log import debug_enabled
from .waits import DEFAULT_TIMEOUT, cancel_receives, timeout_from_env

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
        **retired: object,
    ) -> None:
        warn_retired(retired)
        # Everything that can refuse on one rank is decided before the build agreement, and
        # every rank takes part in it with its verdict: every rank built the same executor, or
        # every rank refuses by name and no later call pairs with the wrong one.
        self.payload_check = payload_check_from_env()
        self.compiled, self.seat, self.broken = None, None, None
        self.endpoint = ep = Endpoint.of(comm, timeout)
        self.rank = ep.rank
        self.comm = (ep.lib if dup else comm) if seat is None else seat.wire
        self.sequence = ep.next_sequence if seat is None else seat.sequence
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
            if seat is not None:
                raise
            local = e
        if seat is None:
            need = self.compiled.messages_per_peer if self.compiled is not None else 0
            seat = ep.open_seat(identity, local, need, what, timeout=timeout, dup=dup, stream=stream)
        elif self.compiled.messages_per_peer > seat.block.messages:
            raise Refusal(
                "tag-space-exhausted",
                f"this program sends {self.compiled.messages_per_peer} messages to one peer; its stream's tag "
                f"block holds {seat.block.messages}",
            )
        self.seat = seat
        open_sends(self.compiled, self.comm, self.rank, seat.block.base)

    def _build(self, program: Program, contract: str) -> None:
        self.program = self.plan = program
        rank = self.rank
        self.timeout = self.waiter.timeout
        self.debug = debug_enabled()
        self.step = 0
        self.broken = None  # the refusal code that broke this executor
        self.contract = contract
        self.compiled = c = compile_program(program, rank, contract, self.sequence)
        self.rp, self.bufs, self.n = c.rp, c.bufs, c.n
        self._table = c.table  # (function, record) per op; emptied by free()
        self.slots = c.rp.slots
        self.is_receiver = c.is_receiver
        self.realization = program.realization
        self.chunk = program.chunk(rank)  # reduce-scatter: (start, stop) of this rank's chunk
        self._state = RunState(self.comm, self.waiter, rank, kernel.lib, kernel.ffi, self.debug)
        self._darr = kernel.ffi.typeof("double[]")
        self._names = {s: f"L{s}" for s in self.slots}
        self._bound: dict = {}  # buffer name -> the caller's array its pointer was made from
        self._zeros = None
        self._busy = False
        # Fault injection for tests and verification tools (alpha_mpi_verify, tests/): when set,
        # called as send_hook(message index, header memoryview) after a header is written and
        # before it is sent. None in production (one attribute test per send).
        self.send_hook = None
        # ALPHA_MPI_PAYLOAD_CHECK=1 (self.payload_check, read before the build agreement, which
        # holds it equal on every rank): a crc32 of every payload travels in its header and is
        # checked on arrival (opt-in: it costs a pass over every payload at both ends; README).
        # Programs whose every possible peer program pairs its messages one to one with this one
        # (the arrays' exchanges in rank order): a foreign frame leaves nothing in flight, so
        # the executor stays usable after naming it.
        self._pairs = bool(program.details.get("foreign_frames_pair"))
        self.flags = 0  # the frame flags the last run saw (frames.FLAG_*)

    def _program_of(self, plan: object) -> Program:
        """The Program this executor runs for `plan` (`plan-kind-mismatch` for another kind)."""
        if not isinstance(plan, Program):
            raise PlanRefusal(
                "plan-kind-mismatch", f"Engine runs a Program (planning.realize), got {type(plan).__name__}"
            )
        return plan

    def run(
        self, contributions: Contributions, out: np.ndarray | None = None, *, timeout: float | None = None
    ) -> np.ndarray | None:
        """Run the program once with this rank's contributions (slot -> float64 payload).

        Returns the combined payload (a float64 vector) where the delivery reaches this rank,
        else None (`out`, if given, is then left as it was). Reduce-scatter mode: the values of
        this rank's chunk, coordinates `self.chunk` (`reduce_scatter_run` adds the bounds).
        `timeout` overrides the per-wait bound for this run."""
        try:
            leaves, local = (
                bind.check_leaves(self.compiled, contributions, self.rank, self.program.layout),
                None,
            )
        except Refusal as e:
            leaves, local = None, e
        return self.execute(leaves, out, local=local, timeout=timeout)

    def reduce_scatter_run(
        self, contributions: Contributions, out: np.ndarray | None = None, *, timeout: float | None = None
    ) -> Chunk:
        """Reduce-scatter programs only: run once and return Chunk(start, stop, values). `out`:
        an array of the chunk's length, or of the whole payload (written at out[start:stop])."""
        if self.program.mode != "reduce-scatter":
            raise PlanRefusal(
                "plan-delivery-mismatch",
                "this executor delivers the whole result; build it with mode='reduce-scatter'",
            )
        values = self.run(contributions, out=out, timeout=timeout)
        return Chunk(self.chunk[0], self.chunk[1], values)

    def execute(
        self,
        leaves: dict | None,
        out: np.ndarray | None = None,
        *,
        local: Refusal | None = None,
        timeout: float | None = None,
        vote: int = 0,
    ) -> np.ndarray | None:
        """The one run of every front end (combine, assembly, arrays). `leaves`: slot -> checked
        contiguous float64 vector of its length, or None when `local` is this rank's refusal of
        its inputs (the program then runs on zeros, flagged, and `local` is raised at the end);
        `out`: the caller's (checked here); `vote` (0 or 1) rides on the frames, and afterwards
        `self.flags` holds the frame flags this rank saw (`frames.FLAG_VOTE`: any rank voted)."""
        if self.broken is not None:
            raise Refusal(
                "combiner-broken",
                f"an earlier run failed with [{self.broken}]; this executor is broken: build a new one on every rank",
            )
        if self._busy:
            raise Refusal("executor-reentrant", "run() called while a run is in progress")
        self._busy = True
        c, st, step = self.compiled, self._state, self.step
        if timeout is not None:  # checked before any communication; refused like a bad input
            try:
                timeout = timeout_from_env(timeout)
            except Refusal as e:
                local, leaves, timeout = local or e, None, None
        st.begin(step, timeout, local, vote, self.payload_check, self.send_hook)
        try:
            if leaves is None:
                if self._zeros is None:
                    self._zeros = bind.zeros_for(c)
                leaves = bind.zero_leaves(c, self._zeros)
            try:
                outarr = bind.bind_out(c, out, self.program.mode)
                if (
                    outarr is not None
                    and outarr is not c.internal_out
                    and (c.small or bind.aliased(outarr, leaves))
                ):
                    outarr = c.internal_out  # copied to the caller's `out` only on success
            except Refusal as e:
                local = local or e
                st.begin(step, timeout, local, vote, self.payload_check, self.send_hook)
                outarr = (
                    c.internal_out
                    if c.internal_out is not None
                    else (np.empty(self.n) if c.rp.result is not None else None)
                )
            bind.bind_pointers(st, self._names, self._bound, self._darr, leaves, outarr)
            for fn, rec in self._table:
                fn(st, rec)
            if self.payload_check:
                # A bad frame in a rank's last receive reaches nobody by frame: one agreement
                # round (paid only with the check on) makes every rank refuse or none.
                self._flag_round(st)
        except Refusal as e:
            self._fail(e)
            if st.bad is not None and e is not st.bad:
                # a bad frame came first and explains what followed (a peer running another
                # program stops sending what this one waits for)
                raise self._hint(st.bad) from e
            raise self._hint(e) from None
        except Exception as e:  # not a refusal: a bug or an interrupt; the channel state is unknown
            self._fail(e)
            raise
        finally:
            self.step += 1
            self._busy = False
            self.flags = st.flags
        bad = st.bad
        if bad is not None and bad.code != "frame-payload-corrupt" and not self._pairs:
            # A frame of another program: every rank has named it by now, but that program may
            # have sent more than this one received, so the executor cannot run again.
            self._fail(bad)
        try:
            return bind.finish(c, self.program, self.rank, step, st, local, leaves, outarr, out)
        except Refusal as e:
            raise self._hint(e) from None

    @property
    def shared(self) -> bool:
        """Whether user traffic can reach this executor's frames (dup=False)."""
        return self.seat is not None and self.seat.shared

    def _hint(self, e: Refusal) -> Refusal:
        """`e`, with the dup=False hint where user traffic can reach this executor's frames."""
        return self.seat.hint(e)

    def _flag_round(self, st) -> None:
        """The flag round of a run with the payload check on (a verdict round on the block's
        flag tag): every rank learns every rank's word on the lowest rank it knows refused or
        found a bad frame (its code), and names the lowest of them."""
        heard = st.who if st.flags & fr.FLAG_REFUSED else None
        words = (0, 0) if heard is None else (heard[0] + 1, int.from_bytes(fr.code_tag(heard[1]), "little"))
        v = verdict.exchange(
            self.comm,
            self.waiter,
            self.seat.block.flag_tag,
            None,
            words,
            number=st.step,
            what=f"the flag round of executor #{self.sequence}",
            timeout=st.timeout,
        )
        found = sorted((int(w[0]) - 1, int(w[1])) for w in v.words if w[0])
        if found:
            who, tag = found[0]
            st.flags |= fr.FLAG_REFUSED
            st.code = tag.to_bytes(4, "little")
            st.who = (who, fr.code_of_tag(st.code))
            st.refused = who

    def _fail(self, e: Exception) -> None:
        code = getattr(e, "code", None) or type(e).__name__  # a refusal's code, else the exception's name
        if code in ("executor-reentrant", "combiner-broken"):
            return
        self.broken = code
        mine = list(self.compiled.msgs.values())
        cancel_receives([r for x in mine if x.m.dst == self.rank for r in (x.hreq, x.preq) if r is not None])
        mark_broken(
            self.rank,
            code,
            [r for x in mine if x.m.src == self.rank for r in (x.hreq, x.preq) if r is not None],
            self.endpoint,
        )
        sys.stderr.write(
            f"r{self.rank} | {self.realization} step {self.step} refused [{code}]: {getattr(e, 'message', e)}\n"
            f"  r{self.rank}: {self.rp.text()}  <-- ERROR HERE\n"
        )
        sys.stderr.flush()

    def free(self) -> None:
        """Free the persistent requests and give the tag block back (a broken executor's stays
        held: frames of it may still be in flight). Local: no communication."""
        msgs = self.compiled.msgs.values() if self.compiled is not None else ()
        for x in msgs:
            for req in (x.hreq, x.preq if not x.dyn else None):
                if req is not None:
                    try:
                        req.Free()
                    except Exception:
                        pass
        self._table = ()
        if self.compiled is not None:
            self._bound.clear()
            self._state.bases.clear()
            self._state.arrays.clear()
        if self.seat is not None and self.broken is None:
            self.seat.release()


def _check_size(program: Program, comm) -> None:
    """`plan-rank-mismatch` unless `program` is for as many ranks as `comm` has (checked before
    the build agreement, so the rank it fails on is the one named)."""
    size = comm.Get_size()
    if program.size != size:
        raise PlanRefusal(
            "plan-rank-mismatch", f"the program is for {program.size} ranks, the communicator has {size}"
        )


__all__ = ["Engine", "warn_retired"]
