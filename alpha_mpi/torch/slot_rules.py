"""What runs around each slot's forward and backward in `DataParallel.step`: the loss must be a
declared sum, no autocast, and torch's random-number generators seeded from (seed, step, slot).

Apart from data_parallel.py because these are rules about the user's callables and torch's
process-wide state, checked or set per slot; the step itself only calls them.

- `loss_reduction(loss_fn, reduction)`: a slot's loss must be the SUM of its per-sample losses
  (the combine adds sums and divides once by the global sample count). A torch loss says so
  (`reduction="sum"`), `functools.partial(F.cross_entropy, reduction="sum")` says so, a function
  wrapped by `summed` says so, and `step(..., reduction="sum")` declares it for any callable.
  A callable that says nothing (a lambda, a plain function: they may well return a mean) is
  refused by name (`torch-loss-undeclared`): a mean would train with a wrongly scaled gradient,
  silently.
- `check_precision()`: autocast (CPU or CUDA) changes which kernels and formats a forward uses;
  it is refused by name (`torch-autocast-refused`) around the step, and so is a loss in a
  reduced format (autocast entered inside the module).
- `step_rng()` around a step's slot loop and `seed_slot(seed, step, slot)` before each slot:
  the caller's generator states are saved once per step and restored after it (also after a
  refusal), and each slot seeds torch's CPU generator (and every CUDA device's, where CUDA is
  initialised) with `alpha_mpi.learning.rng.slot_seed(seed, step, slot)`, so dropout and every
  random op draw the same numbers on whichever rank runs the slot, and the caller's own random
  stream is untouched by the step. `slot_rng(seed, step, slot)` is both for one slot.
  Not `torch.manual_seed`: it also seeds (or queues seeding of) every CUDA, MPS, XPU and
  custom-backend generator and was ~30% of a small slot's time; a slot only draws from the
  generators seeded here (the module is on the CPU; a CUDA generator counts once initialised).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..learning.rng import slot_seed
from ..refusals import Refusal
from ._env import require_torch

if TYPE_CHECKING:
    import torch
else:
    torch = require_torch()

__all__ = [
    "summed",
    "loss_reduction",
    "check_precision",
    "step_rng",
    "seed_slot",
    "slot_rng",
    "AUTOCAST_DEVICES",
]

AUTOCAST_DEVICES = ("cpu", "cuda")
"""The device types whose autocast state `check_precision` reads."""


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


def _said(loss_fn) -> object:
    """The reduction `loss_fn` declares: its `reduction` attribute, a partial's keyword, or None."""
    said = getattr(loss_fn, "reduction", None)
    if said is None and isinstance(loss_fn, functools.partial):
        said = loss_fn.keywords.get("reduction")
    return said


def loss_reduction(loss_fn: Callable[..., Any], reduction: str | None = None) -> None:
    """Refuse unless `loss_fn` is declared to return a sum (see the module docstring)."""
    name = getattr(loss_fn, "__name__", type(loss_fn).__name__)
    if reduction is not None:
        if reduction != "sum":
            raise Refusal(
                "torch-loss-invalid",
                f"step(reduction={reduction!r}); the slot loss must be a sum, declared as reduction='sum'",
            )
        return
    said = _said(loss_fn)
    if said == "sum":
        return
    if said is not None:
        raise Refusal("torch-loss-invalid", f"{name} has reduction={said!r}; the slot loss must be a sum")
    raise Refusal(
        "torch-loss-undeclared",
        f"loss_fn {name} does not say whether it returns the sum or the mean of the slot's losses "
        "(a lambda or function may return either, and a mean would scale the gradient wrongly)",
    )


def check_precision(loss: torch.Tensor | None = None) -> None:
    """Refuse autocast around the step, or a slot loss in a reduced format (`torch-autocast-refused`)."""
    on = [d for d in AUTOCAST_DEVICES if torch.is_autocast_enabled(d)]
    if on:
        raise Refusal(
            "torch-autocast-refused",
            f"torch.autocast is active for {', '.join(on)} around DataParallel.step; "
            "its kernel and format choices are not in the contract",
        )
    if loss is not None and loss.dtype not in (torch.float32, torch.float64):
        raise Refusal(
            "torch-autocast-refused",
            f"the slot loss is {str(loss.dtype).replace('torch.', '')}; "
            "a forward in a reduced format (autocast inside the module?) is not in the contract",
        )


def _cuda_devices() -> list[int]:
    """CUDA devices whose generators a slot must fork (none where CUDA is absent or unused)."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return []
    return list(range(torch.cuda.device_count()))


@contextlib.contextmanager
def step_rng() -> Iterator[list[int]]:
    """The caller's generator states saved on entry and restored on exit (a refusal included);
    yields the CUDA devices whose generators `seed_slot` must seed (forked here)."""
    devices = _cuda_devices()
    with torch.random.fork_rng(devices=devices):
        yield devices


def seed_slot(seed: int, step: int, slot: int, devices: list[int]) -> None:
    """Seed the CPU generator and those of `devices` (CUDA) for slot `slot` of step `step`;
    inside `step_rng`, which restores what this overwrites."""
    s = slot_seed(seed, step, slot)
    torch.default_generator.manual_seed(s)
    for d in devices:
        torch.cuda.default_generators[d].manual_seed(s)


@contextlib.contextmanager
def slot_rng(seed: int, step: int, slot: int) -> Iterator[None]:
    """torch's generators seeded from (seed, step, slot) inside, the caller's state restored after."""
    with step_rng() as devices:
        seed_slot(seed, step, slot, devices)
        yield
