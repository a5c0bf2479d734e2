"""Waits: the one wait policy of every MPI request alpha_mpi completes (its bound, idle behaviour
and how a failed wait is named).

Only upper-case buffer methods are used (Isend, Send_init + Start, Improbe + Message.Recv): no
MPI collective touches data and nothing is pickled. Receives always name their source and are
size-safe: a message is matched first and received only into a buffer of its own size
(`Waiter.receive`).

Bound. Every wait is bounded, per wait: a wait that sees no completion within the bound raises
`peer-timeout` naming the peer and the frame. The bound exists for dead peers, not slow ones: the
default (DEFAULT_TIMEOUT, 5 minutes, like other distributed runtimes) survives a peer that spends
minutes in evaluation or a checkpoint write; set it per job (ALPHA_MPI_TIMEOUT) or per call.

Idle policy: poll, then yield the core between polls (sched_yield returns at once on a dedicated
core and lets an oversubscribed peer run), then after SLEEP_AFTER seconds back off with sleeps up
to 1 ms, so a slow or dead peer does not cost a core. With more ranks on the node than cores,
yield from the first empty poll (the endpoint measures that once per communicator:
endpoint.py). ALPHA_MPI_SPIN=1 never yields or sleeps (dedicated cores only).

A send is never cancelled (MPI_Cancel of a pending send crashes some MPI libraries); receives
still pending after a failure are (`cancel_receives`). What a failure that may leave frames in
flight means for the end of the job is abort.py's concern.
"""

from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI

from ..refusals import FrameRefusal, PeerTimeout, Refusal

DEFAULT_TIMEOUT = 300.0
POLLS_BEFORE_YIELD = 200
SLEEP_AFTER = 0.005
# The engine's waits run in C (csrc/round/waits.c, the same policy); every SIGNAL_SLICE seconds of
# waiting they return to Python, which runs its signal handlers (KeyboardInterrupt) and resumes.
SIGNAL_SLICE = 0.005
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))


def timeout_from_env(timeout=None) -> float:
    """Seconds one wait may take: the argument, else ALPHA_MPI_TIMEOUT, else DEFAULT_TIMEOUT. A
    bad value is refused rather than replaced, so a job never runs with a bound nobody chose."""
    source = "timeout" if timeout is not None else "ALPHA_MPI_TIMEOUT"
    value = timeout if timeout is not None else os.environ.get("ALPHA_MPI_TIMEOUT", "") or DEFAULT_TIMEOUT
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise Refusal("usage", f"{source} must be a finite number of seconds > 0, got {value!r}")
    return seconds


def spin_from_env() -> bool:
    """ALPHA_MPI_SPIN=1: waits never yield or sleep (benchmarks on dedicated cores)."""
    return os.environ.get("ALPHA_MPI_SPIN", "") not in ("", "0")


class Waiter:
    """The wait policy of one executor (or one round): its bound, idle behaviour and error
    naming. `before_yield`: empty polls before the first yield (the endpoint's measure of
    this node: 1 when it runs more ranks than cores). Making one is local: no communication."""

    __slots__ = ("timeout", "spin", "before_yield", "rank", "status", "explain")

    def __init__(self, rank: int, timeout=None, before_yield: int = POLLS_BEFORE_YIELD, explain=None):
        self.timeout = timeout_from_env(timeout)
        self.spin = spin_from_env()
        self.before_yield = before_yield
        self.rank = rank
        self.status = MPI.Status()
        # explain(comm, peer, tag) -> text or None: what the peer sent instead, for a receive
        # that timed out (the endpoint's; looked at only then, never on the hot path)
        self.explain = explain

    def wait(self, req, status, peer: int, what: str, step: int, timeout: float | None = None) -> None:
        """Complete `req` or raise peer-timeout after `timeout` seconds without completion.
        `what` names the frame ("exchange frame 3"); MPI errors are named (truncation: the peer
        runs another plan; anything else: the peer failed). Used for sends: every receive goes
        through `receive`, which never posts a buffer smaller than the message."""
        try:
            if req.Test(status):
                return
            self._until(lambda: req.Test(status), peer, what, step, timeout)
        except MPI.Exception as e:
            raise mpi_failure(e, peer, what, step) from None

    def receive(
        self, comm, buf, peer: int, tag: int, what: str, step: int, timeout: float | None = None
    ) -> tuple[int, np.ndarray | None]:
        """Receive the next message from `peer` with `tag`, size-safely: match it first
        (Improbe, under this Waiter's bound and idle policy), compare its size with `buf`, then
        receive it (Mrecv) into `buf` when the sizes are equal, else whole into a scratch
        buffer of its own size, so no MPI ever writes past `buf` (Open MPI 5's single-copy
        path copies a longer message past the end of a posted receive before it reports the
        truncation). Returns (bytes, None) or (bytes, scratch); the caller refuses the latter
        by name (`frame-size-mismatch`, or what the scratch header says)."""
        status = self.status
        try:
            msg = comm.Improbe(peer, tag, status)
            if msg is None:
                try:
                    msg = self._until(lambda: comm.Improbe(peer, tag, status), peer, what, step, timeout)
                except PeerTimeout as e:
                    raise self.explained(e, comm, peer, tag) from None
            got = status.Get_count(MPI.BYTE)
            if buf is not None and got == memoryview(buf).nbytes:
                msg.Recv(buf)
                return got, None
            scratch = np.empty(got, dtype=np.uint8)
            msg.Recv(scratch)
            return got, scratch
        except MPI.Exception as e:
            raise mpi_failure(e, peer, what, step) from None

    def receive_any(self, comm, peer: int, what: str, timeout: float | None = None) -> tuple[int, np.ndarray]:
        """Receive the next message from `peer` whatever its tag (matched first, received whole
        into a buffer of its own size): (its tag, its bytes). For draining a channel."""
        _, scratch = self.receive(comm, None, peer, MPI.ANY_TAG, what, 0, timeout)
        return self.status.Get_tag(), scratch

    def complete(self, req, what: str, timeout: float | None = None) -> None:
        """Complete a request that no single peer answers (a nonblocking communicator
        operation): peer-timeout naming no rank after the bound."""
        try:
            if not req.Test():
                self._until(req.Test, -1, what, 0, timeout)
        except MPI.Exception as e:
            raise mpi_failure(e, -1, what, 0) from None

    def _until(self, poll, peer: int, what: str, step: int, timeout: float | None):
        """Call `poll` until it returns something true (returned), with the idle policy of the
        module docstring; peer-timeout after the bound without one."""
        bound = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + bound
        polls, sleep_from, pause = 0, None, 5e-5
        spin, before = self.spin, self.before_yield
        while True:
            got = poll()
            if got:
                return got
            polls += 1
            if polls < before:
                continue
            if spin:
                if polls & 4095 or time.monotonic() <= deadline:
                    continue
            else:
                now = time.monotonic()
                if now <= deadline:
                    if sleep_from is None:
                        sleep_from = now + SLEEP_AFTER
                    if now < sleep_from:
                        _yield()
                    else:
                        time.sleep(pause)
                        pause = min(pause * 2, 1e-3)
                    continue
            raise timeout_refusal(self.rank, what, peer, bound, step)

    def explained(self, e: PeerTimeout, comm, peer: int, tag: int) -> PeerTimeout:
        """`e` (a receive of `tag` from `peer` on `comm` that timed out), with what the peer
        sent meanwhile instead when the endpoint can tell."""
        instead = self.explain(comm, peer, tag) if self.explain is not None else None
        if instead is None:
            return e
        return PeerTimeout(e.code, f"{e.message}; {instead}", **e.context)


def timeout_refusal(rank: int, what: str, peer: int, bound: float, step: int) -> PeerTimeout:
    """`peer-timeout`: a wait on `what` with `peer` (-1: every rank of the communicator) saw no
    completion within `bound` seconds."""
    who = f"with rank {peer}" if peer >= 0 else "(every rank of the communicator takes part)"
    return PeerTimeout(
        "peer-timeout",
        f"rank {rank}: {what} {who} did not complete within {bound:g} s at step {step} "
        "(the peer is stopped, dead or far behind)",
        peer=peer,
        step=step,
    )


def mpi_failure(e, peer: int, what: str, step: int) -> Refusal:
    """Name an MPI error on a frame: a truncated receive means the peer sent a longer frame than
    planned (another plan); any other error means the peer or the transport failed."""
    text = e.Get_error_string().strip()
    if e.Get_error_class() == MPI.ERR_TRUNCATE:
        return FrameRefusal(
            "frame-size-mismatch",
            f"{what} from rank {peer} (step {step}): longer than planned ({text}); the peer runs "
            "another plan, realization or layout",
            peer=peer,
            step=step,
        )
    return Refusal(
        "peer-failed",
        f"{what} with rank {peer} (step {step}) failed in MPI: {text} (the peer died "
        "or the interconnect failed)",
        peer=peer,
        step=step,
    )


def cancel_receives(reqs) -> None:
    """Cancel receives still pending after a failure (never sends: cancelling a pending send
    crashes some MPI libraries)."""
    for req in reqs:
        try:
            if req != MPI.REQUEST_NULL and not req.Test():
                req.Cancel()
                req.Test()
        except Exception:
            pass


__all__ = [
    "DEFAULT_TIMEOUT",
    "POLLS_BEFORE_YIELD",
    "SIGNAL_SLICE",
    "SLEEP_AFTER",
    "Waiter",
    "cancel_receives",
    "mpi_failure",
    "spin_from_env",
    "timeout_from_env",
    "timeout_refusal",
]
