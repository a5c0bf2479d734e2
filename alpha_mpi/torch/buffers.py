"""A module's buffers in a step (BatchNorm's running statistics, counters): `StepBuffers`.

Apart from the step because it is one rule with three moments, each a named call:

- `snapshot()` before the slots (slot-mean mode): the step-start values, which every slot's
  forward starts from (`restore(start)` before each slot) and which a refused step leaves in
  place (`restore(start)` again);
- `write_mean(summed)` after the combine: a floating buffer's new value is the mean over all
  slots of the values each slot's forward left, Σ_s b_s / S, the sum evaluated by the slot tree
  in binary64 (float32 widened exactly), one true division by S, then rounded once to the
  buffer's dtype; an integer buffer (a counter) keeps the value the slot forwards left, which is
  the same for every slot.

With `buffers="refuse"` (the default) a module has no buffers and every call does nothing.
"""

from __future__ import annotations

import numpy as np

from ._env import require_torch
from .convert import from64

torch = require_torch()

__all__ = ["StepBuffers"]


class StepBuffers:
    """The buffers of one DataParallel: `float_buffers` and `other_buffers` ((name, tensor)
    each, module_check.ModuleParts), the rule (`"refuse"` or `"slot-mean"`), the slot count S."""

    def __init__(self, float_buffers: list, other_buffers: list, rule: str, slots: int) -> None:
        self.float_buffers, self.other_buffers = float_buffers, other_buffers
        self.rule, self.slots = rule, slots
        self._mean = np.empty(sum(b.numel() for _, b in float_buffers))

    @property
    def tensors(self) -> list:
        """Every buffer, floating then integer."""
        return [b for _, b in self.float_buffers + self.other_buffers]

    def snapshot(self) -> list | None:
        """The step-start values (clones) in slot-mean mode; None otherwise (nothing to keep)."""
        if self.rule != "slot-mean":
            return None
        return [b.detach().clone() for b in self.tensors]

    def restore(self, start: list | None) -> None:
        """Every buffer back to its step-start value (`start`: `snapshot()`; None: nothing kept)."""
        if start is None:
            return
        with torch.no_grad():
            for b, b0 in zip(self.tensors, start):
                b.copy_(b0)

    def write_mean(self, summed: np.ndarray) -> None:
        """Each floating buffer = RoundBinary64(Σ_s b_s / S) from `summed`, the combined words."""
        if not self._mean.size:
            return
        np.divide(summed, float(self.slots), out=self._mean)
        at = 0
        with torch.no_grad():
            for _, t in self.float_buffers:
                from64(t, self._mean[at : at + t.numel()])
                at += t.numel()
