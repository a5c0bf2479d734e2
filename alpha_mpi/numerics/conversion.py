"""The conversion site of a numerical contract, executed by the kernel (layer 3).

`convert_contribution(kinds, x)` applies `Profile.site("contribution")` to one contribution:
KeepFormat, WidenBinary32 (exact), or RoundBinary64 then WidenBinary32 (nearest-even narrowing,
then exact widening). The executor (execution/contract_combiner.py) and the conformance suites
(evidence.py) run exactly this code.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import numpy as np

from .. import kernel
from ..model.profile import ContractRefusal
from ..refusals import KernelRefusal

__all__ = ["convert_contribution"]

_F32 = np.dtype(np.float32)


def convert_contribution(
    kinds: Iterable[str],
    x: np.ndarray,
    out: np.ndarray | None = None,
    scratch32: np.ndarray | None = None,
    *,
    passthrough_nonfinite: bool = False,
) -> tuple[np.ndarray, int]:
    """Apply the conversion sequence `kinds` (Profile.site('contribution')) to one contribution.

    ('KeepFormat',): x as float64 (no copy when it already is one).
    ('WidenBinary32',): x must be float32; widened exactly into out.
    ('RoundBinary64', 'WidenBinary32'): x float64, rounded to binary32 nearest-even
      (kernel.round_binary64), widened back (kernel.widen_binary32) into out.

    With `passthrough_nonfinite`, a non-finite input or a value that rounds beyond binary32 does
    not refuse here: the IEEE result (NaN, or +-Inf) is passed on, so that the executor refuses it
    by name on every receiver after communication completes (FiniteOrRefuse without leaving a
    peer waiting). Returns (float64 array, index of the first value that overflowed or -1).
    """
    kinds = tuple(kinds)
    if kinds == ("KeepFormat",):
        return x, -1
    if kinds == ("WidenBinary32",):
        if not isinstance(x, np.ndarray) or x.dtype != _F32:
            raise KernelRefusal(
                "dtype-invalid",
                f"a WidenBinary32 site takes float32 contributions, got {getattr(x, 'dtype', type(x))}",
            )
        x32 = np.ascontiguousarray(x).reshape(-1)
        out = np.empty(x32.size) if out is None else out
        kernel.widen_binary32(out, x32)
        return out, -1
    if kinds == ("RoundBinary64", "WidenBinary32"):
        if not isinstance(x, np.ndarray) or x.dtype != np.float64:
            raise KernelRefusal(
                "dtype-invalid",
                f"a RoundBinary64 site takes float64 contributions, got {getattr(x, 'dtype', type(x))}",
            )
        x64 = np.ascontiguousarray(x).reshape(-1)
        s32 = np.empty(x64.size, dtype=_F32) if scratch32 is None else scratch32
        out = np.empty(x64.size) if out is None else out
        overflow = -1
        try:
            kernel.round_binary64(s32, x64)
        except KernelRefusal as e:
            if not passthrough_nonfinite or e.code not in ("non-finite-input", "non-finite-output"):
                raise
            # IEEE narrowing (numpy's cast is nearest-even too): NaN stays NaN, overflow -> Inf.
            # Only on this refusing path; the executor refuses the non-finite value downstream.
            with np.errstate(over="ignore", invalid="ignore"):
                s32[...] = x64.astype(np.float32)
            if e.code == "non-finite-output":
                overflow = int(cast("int", e.context.get("index", -1)))
        kernel.widen_binary32(out, s32)
        return out, overflow
    raise ContractRefusal("numerical-contract-invalid", f"conversion sequence {kinds} is not executable")
