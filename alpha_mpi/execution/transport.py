"""Moved: kept so that scripts written against 0.2 keep working.

transport.py held seven concerns; each now lives in its own module: the waits, their bound and
idle policy in waits.py; the abort at exit and the broken-job bookkeeping in abort.py; the debug
log in log.py; the library duplicate, the executor numbering, the tags and the agreement in
endpoint.py (one Endpoint per communicator). Import from those.
"""

from __future__ import annotations

from .abort import ABORT_GRACE, ABORT_STATUS, abort_job, mark_broken, set_abort_at_exit
from .log import debug_enabled, log
from .waits import DEFAULT_TIMEOUT, Waiter, cancel_receives, mpi_failure, spin_from_env, timeout_from_env

__all__ = [
    "ABORT_GRACE",
    "ABORT_STATUS",
    "DEFAULT_TIMEOUT",
    "Waiter",
    "abort_job",
    "cancel_receives",
    "debug_enabled",
    "log",
    "mark_broken",
    "mpi_failure",
    "set_abort_at_exit",
    "spin_from_env",
    "timeout_from_env",
]
