"""The op of the engine's walk that is not a line or two: the M op (a merge of node summaries,
the arrays' exchange), a plain function over engine_build's record; and the warning for the
0.1 keywords every executor still accepts."""

from __future__ import annotations

import warnings

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
