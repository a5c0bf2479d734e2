"""The constants Python and C share, checked against csrc/kernel/abi.h at import.

abi.h is the one place each constant is written in C; the kernel module carries its values (the
header is part of its cdef: build.py). A module that keeps a Python name for one of them
(frames.py the frame layout and flags, engine_build.py the op kinds, the round's results and
bad-frame kinds here, arrays/fast.py the arrays' merge flags) calls `check` with them at its
import: an edit on one side only, or a kernel built from older sources, is an ImportError
naming each constant that differs, never a silent disagreement. The engine's round
(execution/native.py) is compiled from the same header and checked against these values when it
is loaded.
"""

from __future__ import annotations

from .compiled import lib as _lib

#: op kinds of a Program (planning/program.py OP_KINDS) -> abi.h AN_OP_*
OP_CODE = {"P": 1, "S": 2, "W": 3, "D": 4, "E": 5, "C": 6, "F": 7, "M": 8, "A": 9, "R": 10}
_OP_NAMES = {
    "P": "POST",
    "S": "SEND",
    "W": "WAIT",
    "D": "DONE",
    "E": "EVAL",
    "C": "COPY",
    "F": "CHECK",
    "M": "MERGE",
    "A": "SUMMARY",
    "R": "ROOT",
}

#: an_run / an_resume results
DONE, AGAIN, HOOK, BAD_FRAME, TIMEOUT, MPI_ERROR, KERNEL_ERROR, STOP, UNMATCHED = range(9)
#: what was wrong with a bad frame (an_run_state.bad_kind)
BAD_HEADER, BAD_SIZE, BAD_PAYLOAD_SIZE, BAD_CRC = 1, 2, 3, 4
NO_BUFFER = -1

ROUND = {
    **{f"AN_OP_{_OP_NAMES[k]}": v for k, v in OP_CODE.items()},
    "AN_DONE": DONE,
    "AN_AGAIN": AGAIN,
    "AN_HOOK": HOOK,
    "AN_BAD_FRAME": BAD_FRAME,
    "AN_TIMEOUT": TIMEOUT,
    "AN_MPI_ERROR": MPI_ERROR,
    "AN_KERNEL_ERROR": KERNEL_ERROR,
    "AN_STOP": STOP,
    "AN_UNMATCHED": UNMATCHED,
    "AN_BAD_HEADER": BAD_HEADER,
    "AN_BAD_SIZE": BAD_SIZE,
    "AN_BAD_PAYLOAD_SIZE": BAD_PAYLOAD_SIZE,
    "AN_BAD_CRC": BAD_CRC,
    "AN_NO_BUFFER": NO_BUFFER,
}


def check(expected: dict, where: str, lib=_lib) -> None:
    """ImportError unless every NAME in `expected` has its value in `lib` (the kernel module,
    built from csrc/kernel/abi.h; or the engine's round)."""
    differs = {k: (getattr(lib, k, None), v) for k, v in expected.items() if getattr(lib, k, None) != v}
    if differs:  # pragma: no cover - a stale build or an edit on one side only
        raise ImportError(
            f"csrc/kernel/abi.h and {where} disagree (name: (C, Python)): {differs}; "
            "rebuild the kernel (pip install -e .) or fix the side that was edited"
        )


check(ROUND, "alpha_mpi/kernel/abi.py")

__all__ = ["OP_CODE", "ROUND", "STOP", "check"]
