"""What a slot's loss is: a declared sum with its mass, or a module's own loss (`ModuleLoss`).

The combine adds, over the slots, the gradient numerator, the loss and the mass, and the step
divides once: `.grad = Σ numerator / Σ mass`, loss = Σ loss / Σ mass. What a slot contributes is
declared, never guessed, because a mean where a sum was meant trains with a wrongly scaled
gradient and nothing in the numbers shows it. The forms (`slot_loss` evaluates each):

- `loss_fn(output, target)` returns a scalar tensor, the SUM of the slot's per-sample losses,
  declared so: a torch loss with `reduction="sum"`, `functools.partial(F.cross_entropy,
  reduction="sum")`, a function wrapped by `summed`, or any callable with
  `step(..., reduction="sum")`. Its mass is the slot's sample count (len of its batch). A callable
  that says nothing is refused (`torch-loss-undeclared`); a declared mean is `torch-loss-invalid`.
- `loss_fn(output, target)` returns a pair `(loss_sum, mass)`: the pair is the declaration (the
  sum over whatever the mass counts: tokens, say, `(target != -100).sum()` with
  `ignore_index=-100`). The mass is a finite number >= 0 (a tensor or a Python number).
- `ModuleLoss(mass=...)`: the module computes its loss itself (nanoGPT's `model(x, y)`,
  Hugging Face's `model(**batch)` with `labels`), a MEAN over `mass(X_s, y_s)` items. The
  step differentiates the mean and scales in binary64: numerator = mass ⊗ WidenBinary32(∇mean),
  loss = mass ⊗ WidenBinary32(mean). Both products are exact when the mass is an integer below
  2^29 (a 24-bit float32 significand times a 29-bit integer fits binary64's 53 bits); the only
  rounding is the module's own float32 mean. A slot of mass 0 (all padding) contributes nothing
  and runs no backward (the module's mean over nothing is 0/0).

The result of every form is a `SlotLoss`: the tensor the slot's backward differentiates, its
value, mass and the gradient's scale.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..refusals import Refusal
from ._env import require_torch

if TYPE_CHECKING:
    import torch
else:
    torch = require_torch()

__all__ = ["summed", "ModuleLoss", "SlotLoss", "loss_reduction", "slot_loss", "call_module"]


class summed:  # noqa: N801 - used like a function: summed(fn)
    """Declare that `fn(output, target)` returns the SUM of the slot's per-sample losses:
    `dp.step(X, y, alpha_mpi.torch.summed(my_loss))`. The declaration is the caller's word;
    alpha_mpi cannot see inside `fn`."""

    reduction = "sum"

    def __init__(self, fn: Callable[..., Any]) -> None:
        if not callable(fn):
            raise Refusal("usage", f"summed() needs a callable loss, got {type(fn).__name__}")
        self.fn = fn
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, output: torch.Tensor, target: Any) -> torch.Tensor:
        """fn(output, target)."""
        return self.fn(output, target)


def call_module(module, X: Any, y: Any = None, with_targets: bool = False):
    """module(**X) for a mapping batch (its targets are among its keys), else module(X), or
    module(X, y) when `with_targets` and y is given."""
    if isinstance(X, Mapping):
        return module(**X)
    return module(X, y) if with_targets and y is not None else module(X)


def _pick_loss(out):
    """The loss in a module's output: a scalar tensor itself, `.loss` (a Hugging Face ModelOutput),
    a mapping's "loss", or the second of a (logits, loss) pair (nanoGPT). None: not found."""
    if isinstance(out, torch.Tensor):
        return out if out.numel() == 1 else None
    found = getattr(out, "loss", None)
    if isinstance(found, torch.Tensor):
        return found
    if isinstance(out, Mapping) and isinstance(out.get("loss"), torch.Tensor):
        return out["loss"]
    if isinstance(out, (tuple, list)) and len(out) == 2 and isinstance(out[1], torch.Tensor):
        return out[1]
    return None


class ModuleLoss:
    """Declare that the module computes its own loss, the MEAN over `mass(X_s, y_s)` items:
    `dp.step(x, y, ModuleLoss(mass=lambda x, y: (y != -1).sum()))` for nanoGPT's
    `logits, loss = model(x, y)`; `dp.step(batch, None, ModuleLoss(mass=lambda b, _:
    (b["labels"][:, 1:] != -100).sum()))` for a Hugging Face causal LM called as
    `model(**batch)` (its loss is the mean over the shifted labels that are not -100).

    Arguments:
        mass: `mass(X_s, y_s)` -> a finite number >= 0 (a tensor or a Python number): the items
            the module's mean is over, for that slot.
        reduction: "mean" (default: the module returns a mean; the step scales its gradient and
            value by the mass, exactly for integer masses below 2^29) or "sum" (the module
            returns the sum over the mass's items).
        pick: `pick(output)` -> the loss tensor; default: the output itself when it is a scalar
            tensor, `output.loss`, `output["loss"]`, or `output[1]` of a (logits, loss) pair.

    The module is called `module(X_s, y_s)` when the step is given targets (y not None),
    `module(**X_s)` for a mapping batch with y None, else `module(X_s)`.
    """

    def __init__(
        self,
        mass: Callable[[Any, Any], Any],
        *,
        reduction: str = "mean",
        pick: Callable[[Any], Any] | None = None,
    ) -> None:
        if not callable(mass):
            raise Refusal(
                "usage", f"ModuleLoss(mass=) needs a callable mass(X, y), got {type(mass).__name__}"
            )
        if reduction not in ("mean", "sum"):
            raise Refusal("usage", f"ModuleLoss(reduction=) is 'mean' or 'sum', got {reduction!r}")
        if pick is not None and not callable(pick):
            raise Refusal("usage", f"ModuleLoss(pick=) needs a callable, got {type(pick).__name__}")
        self.mass, self.reduction, self.pick = mass, reduction, pick

    def __repr__(self) -> str:
        return f"ModuleLoss(mass={getattr(self.mass, '__name__', self.mass)!r}, reduction={self.reduction!r})"


@dataclass(frozen=True)
class SlotLoss:
    """One slot's declared loss: `graph` is what its backward differentiates (None: mass 0 under
    a mean, no backward), `value` the slot's loss sum, `mass` its mass, and `scale` the factor
    its widened gradient is multiplied by in binary64 (1, or the mass of a mean)."""

    graph: torch.Tensor | None
    value: float
    mass: float
    scale: float


def _said(loss_fn) -> object:
    """The reduction `loss_fn` declares: its `reduction` attribute, a partial's keyword, or None."""
    said = getattr(loss_fn, "reduction", None)
    if said is None and isinstance(loss_fn, functools.partial):
        said = loss_fn.keywords.get("reduction")
    return said


def _name(loss_fn) -> str:
    return getattr(loss_fn, "__name__", type(loss_fn).__name__)


def loss_reduction(loss_fn: Callable[..., Any], reduction: str | None = None) -> bool:
    """Whether `loss_fn` is declared to return a sum (True), or says nothing (False: only a
    `(loss_sum, mass)` pair will then be accepted from it); a declared mean is refused."""
    if isinstance(loss_fn, ModuleLoss):
        return True
    if not callable(loss_fn):
        raise Refusal("torch-loss-invalid", f"loss_fn must be callable, got {type(loss_fn).__name__}")
    if reduction is not None:
        if reduction != "sum":
            raise Refusal(
                "torch-loss-invalid",
                f"step(reduction={reduction!r}); the slot loss must be a sum, declared as reduction='sum'",
            )
        return True
    said = _said(loss_fn)
    if said is not None and said != "sum":
        raise Refusal(
            "torch-loss-invalid", f"{_name(loss_fn)} has reduction={said!r}; the slot loss must be a sum"
        )
    return said == "sum"


def _scalar(loss, what: str) -> torch.Tensor:
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
        raise Refusal(
            "torch-loss-invalid",
            f"{what} {type(loss).__name__} {tuple(getattr(loss, 'shape', ()))}; "
            "it must be a scalar tensor with a graph",
        )
    return loss


def _mass(m, what: str) -> float:
    try:
        v = float(m.detach()) if isinstance(m, torch.Tensor) else float(m)
    except (TypeError, ValueError, RuntimeError):
        raise Refusal("torch-loss-invalid", f"{what} gave a mass of {type(m).__name__}; it must be a number")
    if not math.isfinite(v) or v < 0:
        raise Refusal("torch-loss-invalid", f"{what} gave the mass {v!r}; a mass is a finite number >= 0")
    return v


def slot_loss(loss_fn, module, X: Any, y: Any, count: int, declared: bool) -> SlotLoss:
    """Run slot (X, y) of `count` samples through `module` and `loss_fn` (a declared callable,
    or `declared` False: it must return a pair), into its SlotLoss (see the module docstring)."""
    if isinstance(loss_fn, ModuleLoss):
        out = call_module(module, X, y, with_targets=True)
        loss = (loss_fn.pick or _pick_loss)(out)
        if loss is None:
            raise Refusal(
                "torch-loss-invalid",
                f"ModuleLoss found no loss in the module's output ({type(out).__name__}): a scalar "
                "tensor, .loss, ['loss'] or a (logits, loss) pair; say where with ModuleLoss(pick=...)",
            )
        loss = _scalar(loss, "the module's loss is")
        mass = _mass(loss_fn.mass(X, y), "ModuleLoss(mass=)")
        if loss_fn.reduction == "sum":
            return SlotLoss(loss, float(loss.detach()), mass, 1.0)
        if mass == 0.0:
            return SlotLoss(None, 0.0, 0.0, 0.0)
        return SlotLoss(loss, float(loss.detach()) * mass, mass, mass)
    out = loss_fn(call_module(module, X), y)
    if isinstance(out, tuple):
        if len(out) != 2:
            raise Refusal(
                "torch-loss-invalid",
                f"loss_fn returned a tuple of {len(out)}; return the loss tensor or (loss_sum, mass)",
            )
        loss = _scalar(out[0], "loss_fn returned the loss")
        return SlotLoss(loss, float(loss.detach()), _mass(out[1], "loss_fn"), 1.0)
    loss = _scalar(out, "loss_fn returned")
    if not declared:
        raise Refusal(
            "torch-loss-undeclared",
            f"loss_fn {_name(loss_fn)} does not say whether it returns the sum or the mean of the slot's "
            "losses (a lambda or function may return either, and a mean would scale the gradient wrongly)",
        )
    return SlotLoss(loss, float(loss.detach()), float(count), 1.0)
