"""What `DataParallel.step` returns: `StepValue`, the global batch's mean loss.

A DDP script's loss is a tensor: it logs `loss.item()` and calls `loss.backward()`. A ported
script gets the step's value instead, the same binary64 number on every rank, and keeps its
logging: `StepValue` is a Python float (`float()`, arithmetic, comparisons, f-strings, JSON)
with a tensor's `.item()`. `.backward()` is refused by name (`torch-backward-refused`): the step
already ran every slot's backward and wrote `.grad`, and a second one has nothing to act on.
"""

from __future__ import annotations

from ..refusals import Refusal

__all__ = ["StepValue"]


class StepValue(float):
    """The step's mean loss Σ loss / Σ mass: a float with a loss tensor's `.item()`."""

    __slots__ = ()

    def item(self) -> float:
        """The value as a plain Python float (what `tensor.item()` gives a logging line)."""
        return float(self)

    def detach(self) -> StepValue:
        """Itself: the value carries no graph."""
        return self

    def backward(self, *args, **kwargs) -> None:
        """Refused: `dp.step` already ran the backward."""
        raise Refusal(
            "torch-backward-refused",
            "backward() on the value dp.step returned: the step already ran each slot's backward "
            "and wrote the combined .grad; delete loss.backward() (DDP's habit) and call opt.step()",
        )
