"""Transport: mpi4py buffer point-to-point only; the one owner of waits, time bounds and the log.

Only upper-case buffer methods are used (Isend, Send_init + Start, Improbe + Message.Recv): no
MPI collective touches data and nothing is pickled. Receives always name their source and are
size-safe: a message is matched first and received only into a buffer of its own size
(`Waiter.receive`).

Waits. Every wait is bounded, per wait: a wait that sees no completion within the bound raises
`peer-timeout` naming the peer and the frame. The bound exists for dead peers, not slow ones: the
default (DEFAULT_TIMEOUT, 5 minutes, like other distributed runtimes) survives a peer that spends
minutes in evaluation or a checkpoint write; set it per job (ALPHA_MPI_TIMEOUT) or per call.
Idle policy: poll, then yield the core between polls (sched_yield returns at once on a dedicated
core and lets an oversubscribed peer run), then after SLEEP_AFTER seconds back off with sleeps up
to 1 ms, so a slow or dead peer does not cost a core. With more ranks on the node than cores,
yield from the first empty poll. ALPHA_MPI_SPIN=1 never yields or sleeps (dedicated cores only).

Failures. A send is never cancelled (MPI_Cancel of a pending send crashes some MPI libraries).
After a genuine failure (a dead peer, a broken frame) frames may still be in flight, so the job
cannot finish cleanly: `mark_broken` records it, and at interpreter exit the whole job is aborted
(MPI_Abort, exit status 70) instead of hanging in MPI_Finalize.
"""

from __future__ import annotations

import atexit
import os
import sys
import time

import numpy as np
from mpi4py import MPI

from ..refusals import FrameRefusal, PeerTimeout, Refusal

DEFAULT_TIMEOUT = 300.0
ABORT_STATUS = 70
POLLS_BEFORE_YIELD = 200
SLEEP_AFTER = 0.005
# The engine's waits run in C (csrc/native.c, the same policy); every SIGNAL_SLICE seconds of
# waiting they return to Python, which runs its signal handlers (KeyboardInterrupt) and resumes.
SIGNAL_SLICE = 0.005
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))
# Tags, one scheme for every program the engine runs (combine, assembly, arrays): the k-th
# message from one rank to another in a run uses TAG_BASE + 2k (header) and + 2k + 1 (payload).
TAG_BASE = 100


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


def debug_enabled() -> bool:
    return os.environ.get("ALPHA_MPI_DEBUG", "") not in ("", "0")


def log(rank: int, text: str) -> None:
    sys.stderr.write(f"r{rank} | {text}\n")
    sys.stderr.flush()


def library_comm(comm, exclusive: bool = True):
    """A duplicate of `comm` that only alpha_mpi uses, so user messages can never match ours.
    Dup is a communicator-management call (no user data moves). The caller keeps the result.
    It is marked (attribute "library"), so an executor knows whether user traffic can reach
    its channel (dup=False on a user communicator) and says so when a frame goes wrong; and
    "exclusive" unless several executors will share it (channel_of, the arrays' channel): an
    executor alone on its channel posts its receives at their planned size, one that shares
    it matches every frame first (engine_build, csrc/native.h)."""
    lib = comm.Dup()
    set_comm_attr(lib, "library", True)
    set_comm_attr(lib, "exclusive", bool(exclusive))
    return lib


def channel_of(comm):
    """The library channel of a user communicator: one duplicate per communicator (Dup, on the
    first use by every rank), kept as its attribute. Executors agree on it before they take a
    duplicate of their own (agreement.agree_first), and the convenience calls run on it."""
    ch = comm_attr(comm, "channel")
    if ch is None:
        ch = library_comm(comm, exclusive=False)
        set_comm_attr(comm, "channel", ch)
    return ch


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
    out = type(e)(e.code, e.message + hint, **e.context)
    return out


_KEYVAL: dict = {}


def comm_attr(comm, name: str):
    """The communicator attribute `name` of this process (None if unset). Attributes live and
    die with the communicator itself, so a cache kept there can never be read through a freed
    communicator's reused handle (a cache keyed by `py2f` can)."""
    kv = _KEYVAL.get(name)
    return None if kv is None else comm.Get_attr(kv)


def set_comm_attr(comm, name: str, value) -> None:
    """Set the communicator attribute `name` (a keyval created once per name and process)."""
    kv = _KEYVAL.get(name)
    if kv is None:
        kv = _KEYVAL[name] = MPI.Comm.Create_keyval()
    comm.Set_attr(kv, value)


def next_sequence(comm) -> int:
    """The sequence of the next executor built on `comm`: 0, 1, 2, ... in construction order
    (kept as an attribute of the communicator). Every rank's executor k on a communicator must
    be the same executor; the build agreement (agreement.py) and every frame check it."""
    seq = comm_attr(comm, "sequence") or 0
    set_comm_attr(comm, "sequence", seq + 1)
    return seq


def release_sequence(comm, seq: int) -> None:
    """Give back sequence `seq` after its build agreement failed (it was the last one taken).
    Every rank that took part in a failed agreement gives it back, and a rank that never came
    did not take it, so the ranks' counters stay aligned and a retry can pair again."""
    if comm_attr(comm, "sequence") == seq + 1:
        set_comm_attr(comm, "sequence", seq)


def polls_before_yield(comm) -> int:
    """1 when this node runs more ranks of `comm` than it has cores, else POLLS_BEFORE_YIELD.
    Collective over `comm` the first time (a communicator-management call, no data), then kept
    as an attribute of `comm`: every rank computed it on that first executor, so a rank that
    builds one more executor on the communicator alone does not wait in a collective for ranks
    that will never join it. Never cached by handle: MPI reuses freed handles."""
    known = comm_attr(comm, "polls")
    if known is not None:
        return known
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        crowded = local.Get_size() > (os.cpu_count() or 1)
    finally:
        local.Free()
    polls = 1 if crowded else POLLS_BEFORE_YIELD
    set_comm_attr(comm, "polls", polls)
    return polls


class Waiter:
    """The wait policy of one executor: its bound, idle behaviour and error naming."""

    __slots__ = ("timeout", "spin", "before_yield", "rank", "status")

    def __init__(self, comm, timeout=None):
        self.timeout = timeout_from_env(timeout)
        self.spin = spin_from_env()
        self.before_yield = polls_before_yield(comm)
        self.rank = comm.Get_rank()
        self.status = MPI.Status()

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
                msg = self._until(lambda: comm.Improbe(peer, tag, status), peer, what, step, timeout)
            got = status.Get_count(MPI.BYTE)
            if got == memoryview(buf).nbytes:
                msg.Recv(buf)
                return got, None
            scratch = np.empty(got, dtype=np.uint8)
            msg.Recv(scratch)
            return got, scratch
        except MPI.Exception as e:
            raise mpi_failure(e, peer, what, step) from None

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


def timeout_refusal(rank: int, what: str, peer: int, bound: float, step: int) -> PeerTimeout:
    """`peer-timeout`: a wait on `what` with `peer` saw no completion within `bound` seconds."""
    return PeerTimeout(
        "peer-timeout",
        f"rank {rank}: {what} with rank {peer} did not complete within {bound:g} s at step {step} "
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


# ---------------------------------------------------------------------------------------------
_BROKEN: list = []
_ABORT_AT_EXIT = [True]
# A dead or stopped peer never lets the job end by itself (the launcher waits for every
# process): after these, the job is aborted at exit whatever this process still has pending.
_FATAL = frozenset(("peer-timeout", "peer-failed"))


def set_abort_at_exit(enabled: bool) -> None:
    """Whether a process that saw a failed combine aborts the job at exit (default True). Turn it
    off only where something else ends the job: a test harness that provokes failures on
    purpose, or an application that handles failures with a fault-tolerant MPI."""
    _ABORT_AT_EXIT[0] = bool(enabled)


def mark_broken(rank: int, code: str, pending_sends=()) -> None:
    """Record a failure that may leave frames in flight. At exit the job is aborted if the
    failure was a dead or stopped peer, or if a send of this process is still incomplete."""
    if not _BROKEN:
        atexit.register(_abort_if_broken)
    _BROKEN.append((rank, code, tuple(pending_sends)))


def _incomplete(reqs) -> bool:
    for req in reqs:
        try:
            if not req.Test():
                return True
        except Exception:
            return True
    return False


def _abort_if_broken() -> None:
    # Registered after mpi4py's own MPI_Finalize hook, so it runs first (atexit is LIFO).
    if not _ABORT_AT_EXIT[0] or not _BROKEN or not MPI.Is_initialized() or MPI.Is_finalized():
        return
    for rank, code, sends in _BROKEN:
        if code in _FATAL or _incomplete(sends):
            sys.stderr.write(
                f"r{rank} | alpha_mpi: a combine failed [{code}] and the job cannot end cleanly (a peer is "
                f"gone or frames are in flight); aborting it with exit status {ABORT_STATUS} instead of "
                "hanging in MPI_Finalize\n"
            )
            abort_job(ABORT_STATUS)
            return


# The launcher drops what a rank printed but had not yet forwarded when an Abort tears the job
# down: a loaded CI machine lost a whole job's output (every rank's refusal line) that way.
ABORT_GRACE = 0.5  # seconds


def abort_job(status: int) -> None:
    """Flush, give the launcher ABORT_GRACE seconds to forward the output, then MPI_Abort."""
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(ABORT_GRACE)
    MPI.COMM_WORLD.Abort(status)


__all__ = [
    "DEFAULT_TIMEOUT",
    "ABORT_STATUS",
    "ABORT_GRACE",
    "abort_job",
    "TAG_BASE",
    "Waiter",
    "SIGNAL_SLICE",
    "timeout_refusal",
    "timeout_from_env",
    "spin_from_env",
    "debug_enabled",
    "log",
    "library_comm",
    "channel_of",
    "dup_false_hint",
    "polls_before_yield",
    "comm_attr",
    "set_comm_attr",
    "next_sequence",
    "release_sequence",
    "mark_broken",
    "mpi_failure",
    "set_abort_at_exit",
]
