"""One run of a compiled program: the C round (csrc/round/, native.h) and what it hands back to Python.

A prepared run (prepared.py) begins the run in C (an_run); on the good path it returns AN_DONE and nothing
here runs. Otherwise `drive` answers each status the C loop returns until the run is done:

- AN_AGAIN: a wait has lasted a slice (waits.SIGNAL_SLICE): go on. The return itself is the
  point: the interpreter runs its signal handlers between the calls, so KeyboardInterrupt and
  other signals reach a rank that waits for a peer (engine.py breaks the executor on any
  exception, as on a timeout). An executor on the endpoint's duplicate (`watch`: Engine.foreign)
  also looks at the first message the peer it waits for has sent: a verdict record, a reset
  marker or a frame of another live executor's run there, while the frame awaited was never
  matched, means that peer is not in this call (it builds another executor: it passed another
  realization, delivery, tree or layout; it reset; it runs its executors in another order),
  since MPI keeps one sender's messages in order and the peer's frame would come first. The
  probe alone does not say so: at 5 ranks on 2 cores a peer's next run's frame was found first
  while the awaited frame came after (MPICH, matched receives). So the awaited frame must not be
  there by its own tag, and then, where receives are matched first (the default), the same
  message must stay first for FOREIGN_HOLDS; where they are posted, the awaited frame may have
  been matched by the posted receive and not landed yet, so that receive is cancelled
  (an_cancel_awaited): matched, it completes and the run goes on; never matched, C returns
- AN_UNMATCHED. Either way the run ends `executor-identity-mismatch` (`peer_round` "verdict",
  "reset" or "frame") instead of waiting for the bound; nothing of the peer's is taken. One or
  two MPI_Iprobe per slice of waiting: nothing on a run that never waits a slice.
- AN_HOOK: a send's header is written and the send not started: the fault-injection hook
  (Engine.send_hook, for tests and alpha_mpi_verify) gets (message index, header memoryview).
- AN_BAD_FRAME: a received frame failed its check. C has put zeros in place of its payload and
  set the refused flag (the program goes on over zeros, and every rank the flag reaches names
  this rank); here the frame is named field by field (frames.FrameSpec.check, inbound.py), the
  first bad frame kept, and when no earlier refusal is flagged, this rank and its code.
- AN_TIMEOUT, AN_MPI_ERROR, AN_KERNEL_ERROR: raised by name (`peer-timeout`, `peer-failed` or
  `frame-size-mismatch`, `kernel-bad-argument`; a receive that timed out says what the peer
  sent meanwhile when the endpoint can tell); engine.py breaks the executor.
"""

from __future__ import annotations

import time

from mpi4py import MPI

from ..refusals import KernelRefusal, Refusal
from . import frames as fr
from .endpoint import RESET_TAG, VERDICT_TAG
from .inbound import name_bad_frame
from .waits import mpi_failure, timeout_refusal


class RunState:
    """What one run ends with (reset by `begin`): the flags seen, the refusing rank and code
    they name, the first bad frame."""

    __slots__ = ("rank", "step", "timeout", "flags", "who", "bad", "local", "foreign")

    def __init__(self, rank):
        self.rank = rank
        self.flags = 0
        self.bad = self.foreign = self.local = self.who = None

    def clean(self) -> None:
        """The state of a clean run, which skips `begin` (the steady paths: prepared.py): what
        an earlier run left is dropped, so nothing keeps it alive (a refusal of this rank's
        inputs holds its traceback, and with it the caller's arrays)."""
        self.flags = 0
        if self.local is not None or self.bad is not None or self.foreign is not None:
            self.local = self.bad = self.foreign = self.who = None

    def begin(self, step, timeout, local, vote) -> None:
        """Reset for a run; `local`: this rank's refusal of its inputs (flagged from the start)."""
        self.step, self.timeout = step, timeout
        self.flags = (fr.FLAG_REFUSED if local is not None else 0) | (fr.FLAG_VOTE if vote else 0)
        self.who = (self.rank, local.code) if local is not None else None
        self.bad = None
        self.local = local
        self.foreign = None  # (message, payload), (tag, first seen) or None: cancelled, the refusal


def drive(c, st: RunState, rc: int, hook, bound: float, waiter, comm, watch=None) -> None:
    """Answer the C run's statuses until it is done (the module docstring). `watch`: look at
    the awaited peer's first message on each AN_AGAIN (an executor on the endpoint's
    duplicate: Engine.foreign, which says whose run a tag belongs to)."""
    lib, ex = c.native.lib, c.ex
    while rc:
        if rc == lib.AN_AGAIN:  # signal handlers run here, between the two calls
            if watch is not None:
                e = _out_of_step(c, st, comm, watch)
                if e is not None:
                    raise e
        elif rc == lib.AN_UNMATCHED:  # the receive _out_of_step cancelled had not been matched
            raise st.foreign[2]
        elif rc == lib.AN_HOOK:
            x = c.by_pos[ex.run.at_msg]
            hook(x.m.index, x.hmv)
        elif rc == lib.AN_BAD_FRAME:
            _refuse_frame(c, st, c.by_pos[ex.run.at_msg])
        else:
            raise _failure(c, st, rc, bound, waiter, comm)
        rc = lib.an_resume(ex)


def finish(c, st: RunState) -> None:
    """Take the refusal the flags name from the C run into `st` (the refused flag is set)."""
    run = c.ex.run
    if run.refused >= 0:
        st.who = (run.refused, fr.code_of_tag(bytes(c.native.ffi.buffer(run.code))))


def _refuse_frame(c, st: RunState, x) -> None:
    """Name the bad frame C found; record the first; flag this rank and its code if no earlier
    refusal is flagged (C has zeroed its payload and set the refused flag)."""
    run = c.ex.run
    bad = name_bad_frame(x, run, c.native, st.rank, st.step)
    if st.bad is None:
        st.bad = bad
    if run.refused < 0:
        run.refused = st.rank
        c.native.ffi.memmove(run.code, fr.code_tag(bad.code), 4)


FOREIGN_HOLDS = 0.25  # seconds another run's message must stay first, where nothing is posted to cancel


def _out_of_step(c, st: RunState, comm, foreign):
    """`executor-identity-mismatch` when the peer this rank waits to receive from has sent a
    verdict record, a reset marker or a frame of another executor's run before the frame
    awaited, else None (see the module docstring). With posted receives the refusal is kept
    in `st.foreign` and the awaited receive cancelled (C answers AN_UNMATCHED); matched first,
    the same message must stay first for FOREIGN_HOLDS. Only receives: a send's completion can
    lag behind a peer that has moved on."""
    run = c.ex.run
    x, at = c.by_pos[run.at_msg], (run.at_msg, run.at_payload)
    if x.m.src == st.rank:
        return None
    if st.foreign is not None and st.foreign[0] != at:
        st.foreign = None  # the wait moved on (a cancelled receive had been matched: the run went on)
    if st.foreign is not None and st.foreign[1] is None:
        return None  # the cancel is not answered yet
    status = MPI.Status()
    if not comm.Iprobe(x.peer, MPI.ANY_TAG, status) or foreign(status.Get_tag()) is None:
        st.foreign = None
        return None
    tag = status.Get_tag()
    # MPI keeps one sender's order, so a peer in this call sent the awaited frame before
    # another run's message; yet the other came first at 5 ranks on 2 cores (the docstring):
    # the awaited frame may be there behind it (looked for by its own tag), or matched by a
    # posted receive and not landed yet (cancelling that receive tells, below).
    if comm.Iprobe(x.peer, x.tag + run.at_payload):
        st.foreign = None
        return None
    e = _mismatch(x, st, tag, foreign(tag))
    if not c.ex.program.probe:
        if c.native.lib.an_cancel_awaited(c.ex) == 0:  # else an MPI that cannot: the bound ends the wait
            st.foreign = at, None, e
        return None
    now = time.monotonic()
    if st.foreign is None or st.foreign[1][0] != tag:
        st.foreign = at, (tag, now), e
        return None
    return e if now - st.foreign[1][1] >= FOREIGN_HOLDS else None


def _mismatch(x, st: RunState, tag: int, other: int) -> Refusal:
    """The refusal a peer's message of another run (`tag`; executor `other`) means."""
    if tag not in (VERDICT_TAG, RESET_TAG):
        return Refusal(
            "executor-identity-mismatch",
            f"rank {st.rank}: waiting for {x.what} from rank {x.peer} at step {st.step}, rank {x.peer} sent a "
            f"frame of executor #{other} of this communicator instead (tag {tag}): it runs another executor "
            "than this rank (the ranks call their executors in another order, or one rank rebuilt one)",
            peer=x.peer,
            step=st.step,
            peer_round="frame",
        )
    building = tag == VERDICT_TAG
    sent = "a verdict record (it builds another executor)" if building else "a reset marker (it called reset)"
    return Refusal(
        "executor-identity-mismatch",
        f"rank {st.rank}: waiting for {x.what} from rank {x.peer} at step {st.step}, rank {x.peer} sent {sent} "
        "instead: it is not in this call (it passed another realization, delivery, tree or layout, or "
        "skipped, repeated or reordered a call)",
        peer=x.peer,
        step=st.step,
        peer_round="verdict" if building else "reset",
    )


def _failure(c, st: RunState, rc: int, bound: float, waiter, comm):
    """The refusal a run that cannot go on raises (AN_TIMEOUT, AN_MPI_ERROR, AN_KERNEL_ERROR)."""
    lib, ex = c.native.lib, c.ex.run
    if rc == lib.AN_KERNEL_ERROR:
        return KernelRefusal(
            "kernel-bad-argument",
            f"rank {st.rank}: the kernel refused an evaluation (status {ex.kernel_status})",
        )
    x = c.by_pos[ex.at_msg]
    what = x.what + (" payload" if ex.at_payload else "")
    if rc == lib.AN_TIMEOUT:
        e = timeout_refusal(st.rank, what, x.peer, bound, st.step)
        if x.m.src == st.rank:  # a send that did not complete: its receiver is not there
            return e
        return waiter.explained(e, comm, x.peer, x.tag + ex.at_payload)
    if rc == lib.AN_MPI_ERROR:
        return mpi_failure(MPI.Exception(ex.mpi_error), x.peer, what, st.step)
    return KernelRefusal(  # pragma: no cover - native.h has no other status
        "kernel-bad-argument", f"rank {st.rank}: the C round returned status {rc}"
    )


__all__ = ["RunState", "drive", "finish"]
