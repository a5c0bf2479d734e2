"""`abort_on_exception()`: one rank's uncaught exception ends the whole MPI job at once.

Without it, a rank that raises simply exits while its peers wait in their next combine until the
peer bound (ALPHA_MPI_TIMEOUT, 300 s by default) and only then refuse with `peer-timeout`.
`python -m mpi4py script.py` does the right thing (it aborts the job on an uncaught exception);
this is for scripts that cannot be started that way (a notebook, an entry point, a launcher that
adds its own wrapper):

    alpha_mpi.abort_on_exception()          # installs sys.excepthook for the rest of the process
    with alpha_mpi.abort_on_exception():    # or only around a block
        train()

Either prints the traceback with the rank and then calls MPI_Abort with ABORT_STATUS (70) through
`transport.abort_job` (which first gives the launcher a moment to forward the output).
SystemExit and KeyboardInterrupt pass through untouched: `sys.exit(99)` after a preemption
checkpoint is an ordinary, agreed exit on every rank.
"""

from __future__ import annotations

import sys
import traceback
from types import TracebackType

from .transport import ABORT_STATUS, abort_job

__all__ = ["abort_on_exception", "AbortOnException"]


def _report(kind, value, tb) -> None:
    from mpi4py import MPI

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
