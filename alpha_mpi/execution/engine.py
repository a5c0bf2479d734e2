"""The one executor: runs any realization's Program (planning/program.py) over mpi4py (layer 4).

An Engine is an Endpoint plus a Program: every rank builds an Engine for the same Program, and
the build ends in the endpoint's build agreement (endpoint.py: one verdict round): every rank
built the same executor, as the same executor of its communicator (its sequence, carried in
every frame), with the same tag block, or every rank refuses by name. No communicator is
duplicated here (the endpoint holds alpha_mpi's one duplicate of each user communicator). Work
buffers, frame headers, the MPI requests and the C records of every op are built once
(engine_build.py; the requests once the agreement gave the tags); a run binds the caller's contributions
and `out` (engine_bind.py) and is then ONE call into C (csrc/round/native.c, built by the MPI's own
mpicc: native.py) that interprets the rank's ops: P posts a receive, S writes a header (the
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

from ..planning.flag_rounds import with_flag_rounds
from ..planning.program import Program
from ..refusals import PlanRefusal, Refusal
from . import engine_bind as bind
from . import engine_walk as walk
from . import frames as fr
from .abort import mark_broken
from .endpoint import Endpoint
from .engine_bind import Chunk
from .engine_build import compile_program, open_exec, payload_check_from_env
from .engine_walk import RunState
from .log import debug_enabled
from .receives import matched_first
from .waits import DEFAULT_TIMEOUT, SIGNAL_SLICE, SLEEP_AFTER, timeout_from_env

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
        # A stream's executor on the duplicate looks, while it waits, at what the awaited peer
        # sent first (engine_walk: a peer building another executor is named at once).
        self._watch = shared_channel and not seat.shared
        self.what = what
        open_exec(self.compiled, self.comm, seat.block, self.probe)

    def _build(self, program: Program, contract: str) -> None:
        if self.payload_check:
            # a bad frame in a rank's last receive reaches nobody by frame: the flag rounds
            # after the program (in the same C call) make every rank refuse, or none
            program = with_flag_rounds(program)
        self.program = self.plan = program
        rank = self.rank
        self.timeout = self.waiter.timeout
        self.debug = debug_enabled()
        self.step = 0
        self.broken = None  # the refusal code that broke this executor
        self.contract = contract
        self.compiled = c = compile_program(program, rank, contract, self.sequence)
        self.rp, self.bufs, self.n = c.rp, c.bufs, c.n
        ex, w = c.ex, self.waiter
        ex.before_yield, ex.spin, ex.slice, ex.sleep_after = (
            w.before_yield,
            int(w.spin),
            SIGNAL_SLICE,
            SLEEP_AFTER,
        )
        ex.debug = int(self.debug)
        # ALPHA_MPI_PAYLOAD_CHECK=1 (self.payload_check, read before the build agreement, which
        # holds it equal on every rank): a CRC32C of every payload travels in its header and is
        # checked on arrival (opt-in: docs/performance.md gives its cost).
        ex.check_payload = int(self.payload_check)
        self.slots = c.rp.slots
        self.is_receiver = c.is_receiver
        self.realization = program.realization
        self._mode, self._layout = program.mode, program.layout
        self._an_run = c.native.lib.an_run
        self._out_ok = None  # (the `out` that passed its checks last run, its dtype object)
        # (out, its dtype object, the array bound to the result buffer) of the last run when a
        # run with the very same arrays may skip the binding (run()); None otherwise
        self._rebind = None
        # (slot, buffer number) of the contributions; None for programs whose leaves are pieces
        # of other lengths (the assembly binds every run)
        self._slot_bases = tuple(c.slot_base.items()) if not c.rp.inputs else None
        self._delivers = False  # the C round copies the result into the caller's `out`
        # A program with no contribution and no result in `out` (the arrays' exchanges): a run
        # with leaves {} and no `out` binds nothing.
        self._unbound = not c.rp.slots and c.internal_out is None and c.rp.result is None
        self.chunk = program.chunk(rank)  # reduce-scatter: (start, stop) of this rank's chunk
        self._state = RunState(rank)
        # per buffer number, then the delivery target: (the caller's array, its pointer)
        self._bound: list = [None] * (len(c.bases) + 1)
        self._zeros = None
        self._busy = False
        self._hook = None
        # Programs whose every possible peer program pairs its messages one to one with this one
        # (the arrays' exchanges in rank order): a foreign frame leaves nothing in flight, so
        # the executor stays usable after naming it.
        self._pairs = bool(program.details.get("foreign_frames_pair"))
        self.flags = 0  # the frame flags the last run saw (frames.FLAG_*)

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
            self.compiled.ex.hook = int(hook is not None)

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
        # The steady state of a loop: the very arrays of the last run (same objects, same dtype
        # objects) and the same `out`; their checks and binding from then still hold.
        if timeout is None and type(contributions) is dict and self._rebind is not None:
            bound = self._bound
            for slot, b in self._slot_bases:
                v = contributions.get(slot)
                e = bound[b]
                if e is None or e[0] is not v or v.dtype is not e[2]:
                    break
            else:
                if len(contributions) == len(self._slot_bases) and out is self._rebind[0]:
                    if out is None or out.dtype is self._rebind[1]:
                        return self.execute(contributions, out, _bound=True)
        try:
            leaves, local = (
                bind.check_leaves(self.compiled, contributions, self.rank, self._layout, self._bound),
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
        _bound: bool = False,
        _started: int | None = None,
    ) -> np.ndarray | None:
        """The one run of every front end (combine, assembly, arrays). `leaves`: slot -> checked
        contiguous float64 vector of its length, or None when `local` is this rank's refusal of
        its inputs (the program then runs on zeros, flagged, and `local` is raised at the end);
        `out`: the caller's (checked here); `vote` (0 or 1) rides on the frames, and afterwards
        `self.flags` holds the frame flags this rank saw (`frames.FLAG_VOTE`: any rank voted).
        (`_bound`: run() found the very leaves and `out` of the last run, bound as they are.
        `_started`: the run was begun by a C call of the caller's that ended in an_run and
        returned this status, nothing bound (native.h an_array_run: the arrays' one call, which
        set `_busy` and checked `broken` first); the run goes on here as after an_run.)"""
        if _started is None:
            if self.broken is not None:
                raise Refusal(
                    "combiner-broken",
                    f"an earlier run failed with [{self.broken}]; this executor is broken: build a new one on every rank",
                )
            if self._busy:
                raise Refusal("executor-reentrant", "run() called while a run is in progress")
        self._busy = True
        c, st, step = self.compiled, self._state, self.step
        if timeout is not None and timeout != self.timeout:  # checked before any communication
            try:  # (a bound equal to this executor's was checked when it was built; NaN is not)
                timeout = timeout_from_env(timeout)
            except Refusal as e:  # refused like a bad input
                local, leaves, timeout = local or e, None, None
        st.begin(step, timeout, local, vote)
        try:
            if _started is not None:
                outarr = None
            elif _bound:
                outarr = self._rebind[2]
            elif self._unbound and leaves is not None and out is None:
                outarr = None  # no contribution, no result buffer: nothing of the caller's to bind
            else:
                outarr = self._bind(c, st, leaves, out, local, vote)
                local = st.local
            bound = self.timeout if timeout is None else timeout
            who = st.who
            if _started is not None:
                rc = _started
            elif who is None:
                rc = self._an_run(c.ex, step, bound, st.flags, -1, 0)
            else:
                rc = self._an_run(
                    c.ex, step, bound, st.flags, who[0], int.from_bytes(fr.code_tag(who[1]), "little")
                )
            if rc:
                walk.drive(c, st, rc, self._hook, bound, self.waiter, self.comm, self._watch)
            flags = st.flags = c.ex.flags
            if flags & fr.FLAG_REFUSED:
                walk.finish(c, st)
        except Refusal as e:
            self._fail(e)
            if e.context.get("peer_round") == "verdict":
                # the peer builds another executor: answer its build round, so that every rank
                # names the mismatch at once (Endpoint.answer_build raises it)
                try:
                    self.endpoint.answer_build(
                        self.identity, self.sequence, self.seat.block.base, self.what, timeout=timeout
                    )
                except Refusal as answered:
                    raise self._hint(answered) from e
            if st.bad is not None and e is not st.bad:
                # a bad frame came first and explains what followed (a peer running another
                # program stops sending what this one waits for)
                raise self._hint(st.bad) from e
            raise self._hint(e) from None
        except BaseException as e:  # a bug or an interrupt (KeyboardInterrupt): the channel state is unknown
            self._fail(e)
            raise
        finally:
            self.step += 1
            self._busy = False
            self.flags = st.flags
        if self._delivers and not st.flags & (fr.FLAG_REFUSED | fr.FLAG_NONFINITE) and local is None:
            return out  # C copied the result into the caller's `out` (a clean run: no bad frame either)
        bad = st.bad
        if bad is not None and bad.code != "frame-payload-corrupt" and not self._pairs:
            # A frame of another program: every rank has named it by now, but that program may
            # have sent more than this one received, so the executor cannot run again.
            self._fail(bad)
        try:
            return bind.finish(c, self.program, self.rank, step, st, local, leaves, outarr, out)
        except Refusal as e:
            raise self._hint(e) from None

    def _bind(self, c, st, leaves, out, local, vote):
        """Bind this run's leaves (zeros in place of refused ones) and `out`; returns the array
        the result buffer is bound to. Records in `st.local` this rank's refusal (its inputs, or
        `out`), and in `self._rebind` what a run with the very same arrays may reuse."""
        self._rebind = None
        st.local = local
        if leaves is None:
            if self._zeros is None:
                self._zeros = bind.zeros_for(c)
            leaves = bind.zero_leaves(c, self._zeros)
        try:
            outarr, deliver = bind.bind_out(c, out, self._mode, leaves, self._out_ok)
            if out is not None:
                self._out_ok = (out, out.dtype)
        except Refusal as e:
            st.local = local = local or e
            st.begin(st.step, st.timeout, local, vote)
            outarr, deliver = (
                (
                    c.internal_out
                    if c.internal_out is not None
                    else (np.empty(self.n) if c.rp.result is not None else None)
                ),
                None,
            )
        self._delivers = deliver is not None
        bind.bind_bases(c, self._bound, leaves, outarr, deliver)
        if local is None and (out is not None or outarr is c.internal_out) and self._slot_bases is not None:
            self._rebind = (out, None if out is None else out.dtype, outarr)
        return outarr

    @property
    def shared(self) -> bool:
        """Whether user traffic can reach this executor's frames (dup=False)."""
        return self.seat is not None and self.seat.shared

    def _hint(self, e: Refusal) -> Refusal:
        """`e`, with the dup=False hint where user traffic can reach this executor's frames."""
        return self.seat.hint(e)

    def _fail(self, e: BaseException) -> None:
        code = getattr(e, "code", None) or type(e).__name__  # a refusal's code, else the exception's name
        if code in ("executor-reentrant", "combiner-broken"):
            return
        self.broken = code
        c = self.compiled
        c.native.lib.an_cancel_receives(c.ex)
        mark_broken(self.rank, code, [_PendingSends(c)], self.endpoint)
        sys.stderr.write(
            f"r{self.rank} | {self.realization} step {self.step} refused [{code}]: {getattr(e, 'message', e)}\n"
            f"  r{self.rank}: {self.rp.text()}  <-- ERROR HERE\n"
        )
        sys.stderr.flush()

    def free(self) -> None:
        """Free the requests and give the tag block back (a broken executor's stays held: frames
        of it may still be in flight). A send still in flight completes in the background;
        receives still posted are cancelled first. Local: no communication."""
        c = self.compiled
        if c is not None and c.keep:
            lib = c.native.lib
            if self.broken is not None and lib.an_pending_sends(c.ex):
                # A send of a broken executor still in flight: its requests, records and
                # buffers stay, and the caller's arrays it may read (abort.py tests them at exit;
                # a reset's drain completes them).
                lib.an_cancel_receives(c.ex)
            else:
                lib.an_free(c.ex)
                c.keep.clear()  # the records; the buffers stay with `c`
                self._bound = []
            self._rebind = None
        if self.seat is not None and self.broken is None:
            self.seat.release()


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


def _check_size(program: Program, comm) -> None:
    """`plan-rank-mismatch` unless `program` is for as many ranks as `comm` has (checked before
    the build agreement, so the rank it fails on is the one named)."""
    size = comm.Get_size()
    if program.size != size:
        raise PlanRefusal(
            "plan-rank-mismatch", f"the program is for {program.size} ranks, the communicator has {size}"
        )


__all__ = ["Engine"]
