"""Transport: mpi4py buffer point-to-point only, with bounded waits and a debug log.

Only upper-case buffer methods are used (Isend/Irecv, Send_init/Recv_init + Startall): no MPI
collective touches data and nothing is pickled. Receives always name their source. Every wait is
bounded: `wait_one` polls and gives up with `peer-timeout`, naming the peer, edge and step.
"""

from __future__ import annotations

import os
import sys
import time

from mpi4py import MPI

from ..refusals import PeerTimeout, Refusal

DEFAULT_TIMEOUT = 30.0
# Tags separate phases, so a deliver frame can never match a reduce receive. Within a phase,
# frames between two ranks are sent and their receives posted in increasing edge order, and MPI's
# non-overtaking rule (same source, tag and communicator) then pairs them exactly.
TAG = {"r": 11, "d": 12, "a": 13}
# The scatter realization shares the tree realization's tags on purpose (scatter with reduce,
# gather with deliver): a peer that runs the other realization of the same order then meets a
# frame it did not plan and refuses it by name, instead of both sides waiting for a timeout.
TAG.update({"s": 11, "g": 12})


def timeout_from_env(timeout=None) -> float:
    """Seconds a wait may take: the argument, else ALPHA_MPI_TIMEOUT, else 30. A bad value is
    refused rather than replaced, so a job never runs with a bound nobody chose."""
    source = "timeout" if timeout is not None else "ALPHA_MPI_TIMEOUT"
    value = timeout if timeout is not None else os.environ.get("ALPHA_MPI_TIMEOUT", "") or DEFAULT_TIMEOUT
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise Refusal("usage", f"{source} must be a finite number of seconds > 0, got {value!r}")
    return seconds


def debug_enabled() -> bool:
    return os.environ.get("ALPHA_MPI_DEBUG", "") not in ("", "0")


def log(rank: int, text: str) -> None:
    sys.stderr.write(f"r{rank} | {text}\n")
    sys.stderr.flush()


def library_comm(comm):
    """A duplicate of `comm` that only alpha_mpi uses, so user messages can never match ours.

    Dup is a communicator-management call (no user data moves). The caller keeps the result.
    """
    return comm.Dup()


def wait_one(req, status, deadline: float, what) -> None:
    """Complete `req` or raise PeerTimeout at `deadline`. Spins briefly, then backs off.

    Sleeping matters: alpha_mpi runs oversubscribed (5 ranks on 2 cores in CI), where pure
    spinning starves the very peer being waited for.
    """
    if req.Test(status):
        return
    spins = 0
    pause = 2e-5
    while True:
        if req.Test(status):
            return
        spins += 1
        if spins > 200:
            now = time.monotonic()
            if now > deadline:
                peer, edge, phase, step, timeout = what
                raise PeerTimeout(
                    "peer-timeout",
                    f"no {phase} frame for edge {edge} from rank {peer} at step {step} within {timeout:g} s",
                    peer=peer,
                    edge=edge,
                    step=step,
                )
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)


def cancel_all(requests) -> None:
    """Best effort: cancel and free outstanding requests after a refusal."""
    for req in requests:
        try:
            if req != MPI.REQUEST_NULL and not req.Test():
                req.Cancel()
                req.Test()
        except Exception:
            pass
