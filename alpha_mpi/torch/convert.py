"""The two conversion sites between torch tensors and the binary64 payload, in one place.

`into64`: WidenBinary32 (kernel.widen_binary32, exact) for float32, a copy for float64.
`from64`: RoundBinary64 (kernel.round_binary64, nearest-even, refusing non-finite) for float32,
a finiteness-checked copy for float64.
"""

from __future__ import annotations

import numpy as np

from .. import kernel
from ..refusals import KernelRefusal

__all__ = ["into64", "from64", "flat"]


def flat(t) -> np.ndarray:
    """A writable numpy view of a contiguous CPU tensor, flattened."""
    return t.detach().numpy().reshape(-1)


def into64(out64: np.ndarray, t) -> None:
    """out64 = t exactly: WidenBinary32 for float32, a copy for float64."""
    a = flat(t.contiguous())
    if a.dtype == np.float32:
        kernel.widen_binary32(out64, a)
    else:
        np.copyto(out64, a)


def from64(t, x64: np.ndarray) -> None:
    """t = x64: RoundBinary64 (nearest-even, refuses non-finite) for float32, a copy for float64."""
    a = flat(t)
    if a.dtype == np.float32:
        kernel.round_binary64(a, x64)
    else:
        if not np.all(np.isfinite(x64)):
            i = int(np.flatnonzero(~np.isfinite(x64))[0])
            raise KernelRefusal("non-finite-combined", f"combined value [{i}] = {x64[i]!r} is not finite")
        np.copyto(a, x64)
