"""How a job ends after a failure: the broken-job bookkeeping, the abort at exit, and
`abort_on_exception()`.

Failures that leave frames in flight. After a genuine failure (a dead peer, a broken frame)
frames may still be in flight, so the job cannot finish cleanly: `mark_broken` records it, and
at interpreter exit the whole job is aborted (MPI_Abort, exit status ABORT_STATUS = 70) instead
of hanging in MPI_Finalize. `set_abort_at_exit(False)` turns that off for harnesses that end the
job themselves.

An uncaught exception of one rank ends the whole MPI job at once (`abort_on_exception`).
Without it, a rank that raises simply exits while its peers wait in their next combine until the
peer bound (ALPHA_MPI_TIMEOUT, 300 s by default) and only then refuse with `peer-timeout`.
`python -m mpi4py script.py` does the right thing (it aborts the job on an uncaught exception);
this is for scripts that cannot be started that way (a notebook, an entry point, a launcher that
adds its own wrapper):

    alpha_mpi.abort_on_exception()          # installs sys.excepthook for the rest of the process
    with alpha_mpi.abort_on_exception():    # or only around a block
        train()

Either prints the traceback with the rank and then calls MPI_Abort with ABORT_STATUS (70) through
`abort_job` (which first gives the launcher a moment to forward the output).
SystemExit and KeyboardInterrupt pass through untouched: `sys.exit(99)` after a preemption
checkpoint is an ordinary, agreed exit on every rank.
"""

from __future__ import annotations

import atexit
import sys
import time
from types import TracebackType

from mpi4py import MPI

__all__ = [
    "ABORT_GRACE",
    "ABORT_STATUS",
    "AbortOnException",
    "abort_job",
    "abort_on_exception",
    "forgive",
    "owns_failures",
    "mark_broken",
    "set_abort_at_exit",
]

ABORT_STATUS = 70
# The launcher drops what a rank printed but had not yet forwarded when an Abort tears the job
# down: a loaded CI machine lost a whole job's output (every rank's refusal line) that way.
ABORT_GRACE = 0.5  # seconds

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


def mark_broken(rank: int, code: str, pending_sends=(), owner: object = None) -> None:
    """Record a failure that may leave frames in flight. At exit the job is aborted if the
    failure was a dead or stopped peer, or if a send of this process is still incomplete.
    `owner`: the endpoint whose channel it concerns (`forgive` clears its records once a reset
    has shown every rank alive and drained its channel)."""
    if not _BROKEN:
        atexit.register(_abort_if_broken)
    _BROKEN.append((rank, code, tuple(pending_sends), owner))


def owns_failures(owner: object) -> bool:
    """Whether failures are recorded for `owner` (its channel may have frames in flight)."""
    return any(item[3] is owner for item in _BROKEN)


def forgive(owner: object) -> int:
    """Drop the failures recorded for `owner` whose sends have all completed (an endpoint's
    reset drained its channel on every rank, so no peer is gone and nothing of it is in
    flight); returns how many are left for it (sends still incomplete)."""
    keep, left = [], 0
    for item in _BROKEN:
        if item[3] is owner and owner is not None:
            if not _incomplete(item[2]):
                continue
            left += 1
        keep.append(item)
    _BROKEN[:] = keep
    return left


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
    for rank, code, sends, _ in _BROKEN:
        if code in _FATAL or _incomplete(sends):
            sys.stderr.write(
                f"r{rank} | alpha_mpi: a combine failed [{code}] and the job cannot end cleanly (a peer is "
                f"gone or frames are in flight); aborting it with exit status {ABORT_STATUS} instead of "
                "hanging in MPI_Finalize\n"
            )
            abort_job(ABORT_STATUS)
            return


def abort_job(status: int) -> None:
    """Flush, give the launcher ABORT_GRACE seconds to forward the output, then MPI_Abort."""
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(ABORT_GRACE)
    MPI.COMM_WORLD.Abort(status)


def _report(kind, value, tb) -> None:
    import traceback  # here: only a failing job prints one (start-up, issue 42)

    rank = MPI.COMM_WORLD.Get_rank()
    sys.stderr.write(f"alpha_mpi: rank {rank}: uncaught exception; aborting the MPI job\n")
    traceback.print_exception(kind, value, tb, file=sys.stderr)


class AbortOnException:
    """What `abort_on_exception()` returns: installed as sys.excepthook at once; also a context
    manager that aborts on an exception leaving its block (and restores the previous hook)."""

    def __init__(self, status: int = ABORT_STATUS) -> None:
        self.status = status
        self.previous = sys.excepthook
        sys.excepthook = self._hook

    def _hook(self, kind, value, tb) -> None:
        if issubclass(kind, (SystemExit, KeyboardInterrupt)):
            self.previous(kind, value, tb)
            return
        _report(kind, value, tb)
        abort_job(self.status)

    def restore(self) -> None:
        """Put back the sys.excepthook that was there before."""
        if sys.excepthook == self._hook:
            sys.excepthook = self.previous

    def __enter__(self) -> AbortOnException:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is not None and not issubclass(kind, (SystemExit, KeyboardInterrupt)):
            _report(kind, value, tb)
            abort_job(self.status)
        self.restore()


def abort_on_exception(status: int = ABORT_STATUS) -> AbortOnException:
    """Make an uncaught exception on any rank abort the whole job (MPI_Abort(status)) after
    printing its traceback; see the module docstring. Returns the hook (a context manager too)."""
    return AbortOnException(status)
