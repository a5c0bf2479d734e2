"""Naming a frame the C round refused (the bad path of a W op; layer 4).

The C round (csrc/round/frames.c) receives every frame size-safely: it matches the frame first
(MPI_Improbe), compares its size with the plan's and receives it into the planned buffer only
when they agree, else whole into scratch, keeping its first bytes (receives.py: on every
channel, since any rank may send anything; a posted receive that relies on MPI_ERR_TRUNCATE is
not safe: Open MPI 5's single-copy (CMA) path for local messages above a few KiB copies the
whole message past the end of the buffer before it reports the truncation). It checks the header
with one comparison (ak_frame_check) and a payload's CRC32C when the frame carries one. What it
cannot do is say what is wrong: that is here, from the bytes it kept, by the one owner of the
format (frames.FrameSpec.check): what the header says when it arrived intact (another plan,
topology, order, step, executor), else `frame-size-mismatch` with both sizes, or
`frame-payload-corrupt`.
"""

from __future__ import annotations

from ..refusals import FrameRefusal
from . import frames as fr


def name_bad_frame(x, ex, native, rank: int, step: int) -> FrameRefusal:
    """The FrameRefusal for message `x` (an engine Msg) that the C executor refused (`ex`: its
    run state, native.h an_run_state)."""
    lib = native.lib
    kind = ex.bad_kind
    if kind == lib.AN_BAD_SIZE:
        got = ex.bad_got
        head = bytes(native.ffi.buffer(ex.bad_header))[: min(got, fr.HEADER)]
        return _wrong_size(x, head, got, step)
    if kind == lib.AN_BAD_PAYLOAD_SIZE:
        return FrameRefusal(
            "frame-size-mismatch",
            f"{x.what} from rank {x.peer} (step {step}): payload of {ex.bad_pgot} bytes, expected {8 * x.m.count}",
            edge=x.m.index,
            peer=x.peer,
            step=step,
        )
    if kind == lib.AN_BAD_CRC:
        return FrameRefusal(
            "frame-payload-corrupt",
            f"rank {rank}: the payload of {x.what} from rank {x.peer} (step {step}) fails its CRC32C",
            peer=x.peer,
            step=step,
        )
    try:
        x.spec.check(x.hbuf, step, x.nbytes, split=x.split)
    except FrameRefusal as e:
        return e
    return FrameRefusal(  # pragma: no cover - the one comparison and the field check disagree
        "frame-checksum", f"{x.what} from rank {x.peer} (step {step}): the header is not the planned one"
    )


def _wrong_size(x, head: bytes, got: int, step: int) -> FrameRefusal:
    """The refusal for a frame of `got` bytes where `x.nbytes` were planned (`head`: its first
    bytes): what its header names when it arrived intact and differs from the plan, else the
    sizes."""
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
        x.spec.check(head, step, got, split=x.split)
    except FrameRefusal as e:
        return sized if e.code == "frame-checksum" else e
    return sized


__all__ = ["name_bad_frame"]
