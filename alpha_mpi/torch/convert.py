"""The two conversion sites between torch tensors and the binary64 payload, in one place.

`into64`: WidenBinary32 (kernel.widen_binary32, exact) for float32, a copy for float64 (and
for an integer tensor, its values, exact below 2^53).
`from64`: RoundBinary64 (kernel.round_binary64, nearest-even, refusing non-finite) for float32,
a finiteness-checked copy for float64. A tensor on a device (CUDA) is copied to the host first
(into64) or written through a host tensor (from64): the conversions run on the CPU, in the
kernel, wherever the module computes. `pack` / `unpack`: the same over a list of tensors laid
end to end in one flat binary64 vector.
"""

from __future__ import annotations

import numpy as np

from .. import kernel
from ..refusals import KernelRefusal, Refusal

__all__ = ["into64", "from64", "flat", "pack", "unpack"]


def flat(t) -> np.ndarray:
    """A writable numpy view of a contiguous CPU tensor, flattened."""
    return t.detach().numpy().reshape(-1)


def into64(out64: np.ndarray, t) -> None:
    """out64 = t exactly: WidenBinary32 for float32, a copy for float64, and for an integer or
    boolean tensor (a counter buffer such as BatchNorm's num_batches_tracked) its values, exact
    below 2^53 in magnitude (refused beyond)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    a = flat(t.contiguous())
    if a.dtype == np.float32:
        kernel.widen_binary32(out64, a)
    elif a.dtype.kind in "iub":
        if a.dtype.kind != "b" and a.size and int(np.abs(a).max()) > 2**53:
            raise Refusal(
                "torch-module-unsupported", f"an integer tensor holds {int(np.abs(a).max())}, beyond 2^53"
            )
        np.copyto(out64, a)
    else:
        np.copyto(out64, a)


def from64(t, x64: np.ndarray) -> None:
    """t = x64: RoundBinary64 (nearest-even, refuses non-finite) for float32, a copy for float64."""
    if t.device.type != "cpu":
        host = t.detach().cpu()
        from64(host, x64)
        t.data.copy_(host)
        return
    a = flat(t)
    if a.dtype == np.float32:
        kernel.round_binary64(a, x64)
    elif a.dtype.kind in "iub":  # a counter: the values are integers (exact, from into64)
        np.copyto(a, x64.astype(a.dtype))
    else:
        if not np.all(np.isfinite(x64)):
            i = int(np.flatnonzero(~np.isfinite(x64))[0])
            raise KernelRefusal("non-finite-combined", f"combined value [{i}] = {x64[i]!r} is not finite")
        np.copyto(a, x64)


def pack(tensors, out64: np.ndarray | None = None) -> np.ndarray:
    """`tensors` flattened end to end into `out64` (a new array when None) with `into64`."""
    if out64 is None:
        out64 = np.empty(sum(t.numel() for t in tensors))
    off = 0
    for t in tensors:
        into64(out64[off : off + t.numel()], t)
        off += t.numel()
    return out64


def unpack(tensors, x64: np.ndarray) -> None:
    """The inverse of `pack`: each tensor takes its range of `x64` with `from64`."""
    off = 0
    for t in tensors:
        from64(t, x64[off : off + t.numel()])
        off += t.numel()
