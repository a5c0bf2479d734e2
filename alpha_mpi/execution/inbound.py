"""Receiving one planned frame, size-safely (the W op of the engine; layer 4).

No frame is ever received into a buffer smaller than the message: the frame is matched first
(waits.Waiter.receive: Improbe under the one wait policy), its size compared with the
planned one, and only then received, into the planned buffer when the sizes agree or whole into
a scratch buffer when they do not. A posted receive that relies on MPI_ERR_TRUNCATE is not safe:
Open MPI 5's single-copy (CMA) path for local messages above a few KiB copies the whole message
past the end of the buffer before it reports the truncation. A frame of another size is refused
by name: by what its header says when the header arrived intact (another plan, topology, order,
step, executor), else `frame-size-mismatch` with both sizes. The refusal is raised here and
handled by the engine's one failure path (engine_walk.wait: refused where it lands, zeros in its
place, flagged onwards).
"""

from __future__ import annotations

from ..refusals import FrameRefusal
from . import frames as fr


def receive_header(comm, waiter, x, step: int, timeout) -> int:
    """Receive the header message of `x` (an engine Msg; with its payload, for frames under the
    split size) into its planned buffer and check it (one bytes comparison; field by field only
    on a mismatch); return its flags, else raise the FrameRefusal that names what differs.
    `x.got` is then the size that arrived."""
    got, scratch = waiter.receive(comm, x.hbuf, x.peer, x.tag, x.what, step, timeout)
    x.got = got
    if scratch is not None:
        raise _wrong_size(x, scratch, got, step)
    f = x.spec.fast_check(x.hmv, step)
    if f < 0:
        f = x.spec.check(x.hbuf, step, got, split=x.split)
    return f


def receive_payload(comm, waiter, x, step: int, timeout, view) -> None:
    """Receive the payload message of split frame `x` into `view` (its region), size-safely."""
    pgot, scratch = waiter.receive(comm, view, x.peer, x.tag + 1, x.what + " payload", step, timeout)
    if scratch is not None:
        raise FrameRefusal(
            "frame-size-mismatch",
            f"{x.what} from rank {x.peer} (step {step}): payload of {pgot} bytes, expected {8 * x.m.count}",
            edge=x.m.index,
            peer=x.peer,
            step=step,
        )


def _wrong_size(x, scratch, got: int, step: int) -> FrameRefusal:
    """The refusal for a frame of `got` bytes where `x.nbytes` were planned (held in `scratch`):
    what its header names when it arrived intact and differs from the plan, else the sizes."""
    sized = FrameRefusal(
        "frame-size-mismatch",
        f"{x.what} from rank {x.peer} (step {step}): {got} bytes arrived, expected {x.nbytes} (the peer "
        "runs another plan, realization or payload layout)",
        edge=x.m.index,
        peer=x.peer,
        step=step,
    )
    if got < fr.HEADER:
        return sized
    try:
        x.spec.check(scratch[: fr.HEADER], step, got, split=x.split)
    except FrameRefusal as e:
        return sized if e.code == "frame-checksum" else e
    return sized


__all__ = ["receive_header", "receive_payload"]
