"""The ops of the engine's walk that are not a line or two: naming a frame that is not the one
expected, and the M op (a merge of node summaries, the arrays' exchange). Plain functions over
the compiled records of engine_build; and the warning for the 0.1 keywords every executor
still accepts."""

from __future__ import annotations

import warnings

from ..refusals import FrameRefusal

# Keywords of 0.1 that no longer steer anything: accepted with a warning, so old scripts run.
_RETIRED = {
    "crossover_bytes": "auto chooses by the α–β–γ model (calibration=, ALPHA_MPI_CALIBRATION)",
    "depth": "the engine allocates its own buffers per message",
}


def warn_retired(kwargs: dict) -> None:
    """Warn (DeprecationWarning) for each retired 0.1 keyword; any other is a TypeError."""
    for k in kwargs:
        if k not in _RETIRED:
            raise TypeError(f"unexpected keyword argument {k!r}")
        warnings.warn(f"{k}= is ignored since 0.2: {_RETIRED[k]}", DeprecationWarning, stacklevel=3)


# A merged summary's flags word (arrays.tree FLAG_OVERFLOW, FLAG_INVALID).
MERGE_OVERFLOW, MERGE_INVALID = 1, 2


def merge(lib, x) -> None:
    """An M op (engine_build.MergeOp): the union of two node summaries into a third. A merge
    that fails is recorded in the result's flags (the caller's verdict names it)."""
    am, af = int(x.a_head[0]), int(x.a_head[1])
    bm, bf = int(x.b_head[0]), int(x.b_head[1])
    cap = x.capacity
    if 0 <= bm <= cap:
        m = lib.ap_merge(x.a_nodes, am, x.b_nodes, bm, x.out_nodes, cap, int(x.n_word[0]), x.k)
    else:
        m = lib.AP_ERR_INVALID
    flags = af | (bf & (MERGE_OVERFLOW | MERGE_INVALID))
    if m < 0:
        flags |= MERGE_OVERFLOW if m == lib.AP_ERR_OVERFLOW else MERGE_INVALID
        m = 0
    x.out_head[0], x.out_head[1] = m, flags


def named_check(x, step: int, got: int, truncated: FrameRefusal | None) -> int:
    """The flags of a header that is not byte for byte the expected one but passes every check,
    else the FrameRefusal naming the field that differs. `x`: the message (engine_build._Msg);
    `got`: the bytes that arrived, -1 when the frame was longer than planned (`truncated`)."""
    try:
        if got < 0:  # the header may still say whose frame it is; it raises at least the size
            x.spec.check(x.hbuf, step, x.nbytes + 8, split=x.split)
        return x.spec.check(x.hbuf, step, got, split=x.split)
    except FrameRefusal as e:
        if e.code != "frame-checksum" or got == x.nbytes:
            raise
        if truncated is not None:
            raise truncated from None
        # another size, and a header that did not arrive intact (some MPIs leave a truncated
        # receive's buffer undefined): the size is what is known
        raise FrameRefusal(
            "frame-size-mismatch",
            f"{x.what} from rank {x.peer} (step {step}): {got} bytes arrived, expected {x.nbytes}",
            peer=x.peer,
            step=step,
        ) from None
