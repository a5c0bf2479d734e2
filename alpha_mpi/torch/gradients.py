"""How a step's combined gradient reaches `.grad`: overwrite or accumulate, and unused parameters.

Apart from data_parallel.py because it is the one place `.grad` is written, with its rules:

- A step writes `.grad = RoundBinary64(g)` (float32; a copy for float64), g = Σ gradients / Σ
  samples of the step's global batch in binary64, into views of one flat tensor.
- `accumulate=True` (or a step inside / right after `DataParallel.no_sync()`) adds instead:
  `.grad = RoundBinary64(WidenBinary32(.grad) + g)`, one binary64 addition and one rounding per
  call and coordinate, in call order. Every rank holds the same `.grad` before and the same g,
  so the sum is the same on every rank and every rank count.
- A parameter no slot of the step gave a gradient (unused in the forward on every slot: the
  slots' `used` words, combined like the gradients, are all 0) keeps `.grad = None`, as DDP with
  `find_unused_parameters` leaves it (AdamW then skips it: no decay); with accumulation it keeps
  the `.grad` it had. `unused="zeros"` gives it zeros instead (the earlier behaviour).
"""

from __future__ import annotations

import math

import numpy as np

from ..refusals import Refusal
from ._env import require_torch
from .convert import from64, into64

torch = require_torch()

__all__ = ["GradientWriter", "UNUSED_RULES"]

UNUSED_RULES = ("none", "zeros")
"""The values of DataParallel's `unused=`: `.grad` of a parameter without a gradient in a step."""


class GradientWriter:
    """Writes a step's binary64 gradient into `.grad` of `params` (laid out at `offsets`)."""

    def __init__(self, params: list, offsets: list, dtype, unused: str = "none") -> None:
        if unused not in UNUSED_RULES:
            raise Refusal("usage", f"unused must be one of {', '.join(UNUSED_RULES)}, got {unused!r}")
        self.params, self.offsets, self.unused = params, offsets, unused
        n = offsets[-1][1] if offsets else 0
        device = params[0].device if params else torch.device("cpu")
        on_host = device.type == "cpu"
        # The rounding runs on the host; a module on a device takes the result in one copy from
        # a pinned host tensor into the device tensor the .grad views live in.
        self.flat = torch.empty(n, dtype=dtype, pin_memory=not on_host)
        self.device_flat = self.flat if on_host else torch.empty(n, dtype=dtype, device=device)
        self.views = [self.device_flat[a:b].view(p.shape) for p, (a, b) in zip(params, offsets)]
        self._prev = np.empty(n)
        self.g = np.empty(n)  # the step's binary64 gradient (write_mean)
        # the loss scale the gradient held here carries (step.py sets it, a ShardedGradScaler's
        # unscaling clears it, and a sharded opt.step() refuses a scaled one: shard_step.py)
        self.scale = 1.0

    def write_mean(self, numerator: np.ndarray, mass: float, used: np.ndarray, accumulate: bool) -> None:
        """`.grad` from g = numerator / mass (`g`), normalised once in binary64 after the combine."""
        np.divide(numerator, mass, out=self.g)
        self.write(self.g, used, accumulate)

    def write(self, g64: np.ndarray, used: np.ndarray, accumulate: bool) -> None:
        """`.grad` from g64 (modified in place when accumulating) and the per-parameter `used` flags."""
        held = [accumulate and p.grad is not None for p in self.params]
        for p, (a, b), h in zip(self.params, self.offsets, held):
            if not h:
                continue
            if p.grad.shape != p.shape or p.grad.dtype != p.dtype or p.grad.device != p.device:
                raise Refusal(
                    "usage",
                    f"accumulate=True adds into .grad, which holds {p.grad.dtype} {tuple(p.grad.shape)}; "
                    f"the parameter is {p.dtype} {tuple(p.shape)} (clear it with optimizer.zero_grad())",
                )
            into64(self._prev[a:b], p.grad)  # read every held .grad before the flat tensor is rewritten
        for (a, b), h in zip(self.offsets, held):
            if h:
                g64[a:b] += self._prev[a:b]
        from64(self.flat, g64)  # RoundBinary64@gradient for float32, one call
        if self.device_flat is not self.flat:
            self.device_flat.copy_(self.flat)
        for p, view, u, h in zip(self.params, self.views, used, held):
            if u or h or self.unused == "zeros":
                p.grad = view  # an unused parameter's held .grad comes back exactly (0 + prev)
            else:
                p.grad = None

    # what a sharded optimizer's shard tensors see (shard_optimizer.py) ------------------------
    def piece_grad(self, piece):
        """The `.grad` of the shard tensor of `piece` (sharding.Piece): the matching view of its
        parameter's `.grad` (nothing copied), None where that is None."""
        g = self.params[piece.index].grad
        return None if g is None else g.reshape(-1)[piece.lo : piece.hi]

    def clear(self) -> None:
        """No gradient (a refused step): every `.grad` None."""
        self.scale = 1.0
        for p in self.params:
            p.grad = None

    def overflow(self) -> None:
        """A scaled gradient overflowed in some slot (scaling.py): every `.grad` +inf, so that a
        GradScaler's own check finds it on every rank."""
        for p in self.params:
            p.grad = torch.full_like(p, math.inf)

    def held(self) -> list:
        """The gradient tensors this rank holds (what a ShardedGradScaler unscales): every `.grad`."""
        return [p.grad for p in self.params if p.grad is not None]

    def zero(self, set_to_none: bool = True) -> None:
        """`optimizer.zero_grad(set_to_none)` on the parameters' `.grad` (what the step adds into)."""
        self.scale = 1.0
        for p in self.params:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()

    def free(self) -> None:
        """Nothing to free (the shard writer frees its clipping's exchange)."""
