"""What runs around each slot's forward and backward in `DataParallel.step`: the declared
precision (autocast or none), and torch's random-number generators seeded from (seed, step, slot).

Apart from data_parallel.py because these are rules about the user's callables and torch's
process-wide state, checked or set per slot; the step itself only calls them.

- `precision(autocast, device, dtype)`: the forward's precision DataParallel declares, in its
  contract: no autocast, or autocast to bfloat16 / float16 on the module's device type (CPU
  bfloat16 and float16, CUDA float16 and bfloat16) entered by the step around each slot's forward
  and loss (the backward runs outside, as torch recommends). An autocast the caller enters
  around the step is accepted when it is the declared one; another is refused by name
  (`torch-autocast-refused`), and so is a slot loss in a reduced format that was not declared.
  Autocast picks kernels and formats by op; on one device type they are the same on every rank,
  so the bits are still the same on every rank count (tested on CPU bfloat16).
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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..learning.rng import slot_seed
from ..refusals import Refusal
from ._env import require_torch

if TYPE_CHECKING:
    import torch
else:
    torch = require_torch()

__all__ = [
    "Precision",
    "precision",
    "AUTOCAST",
    "step_rng",
    "seed_slot",
    "slot_rng",
    "AUTOCAST_DEVICES",
]

AUTOCAST_DEVICES = ("cpu", "cuda")
"""The device types whose autocast state `Precision.check_around` reads."""


@dataclass(frozen=True)
class Precision:
    """The forward's precision a DataParallel declares: float32/float64 (`dtype` None), or
    autocast to `dtype` on `device` ("cpu" or "cuda") around each slot's forward and loss. Built
    by `precision(...)`; `name` is what the contract says."""

    device: str
    dtype: torch.dtype | None = None

    @property
    def name(self) -> str:
        """ "no autocast", or e.g. "autocast cpu bfloat16 around forward and loss"."""
        if self.dtype is None:
            return "no autocast"
        return f"autocast {self.device} {str(self.dtype).replace('torch.', '')} around forward and loss"

    def forward(self) -> contextlib.AbstractContextManager:
        """The context a slot's forward and loss run in (autocast, or nothing)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device, dtype=self.dtype)

    def backward(self) -> contextlib.AbstractContextManager:
        """The context a slot's backward runs in: every autocast off (the backward's ops follow
        their forward's formats), so an autocast the caller entered changes nothing there."""
        on = [d for d in AUTOCAST_DEVICES if torch.is_autocast_enabled(d)]
        if not on:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        for d in on:
            stack.enter_context(torch.autocast(d, enabled=False))
        return stack

    def check_around(self) -> None:
        """Refuse (`torch-autocast-refused`) an autocast around the step other than the declared one."""
        for d in AUTOCAST_DEVICES:
            if not torch.is_autocast_enabled(d):
                continue
            got = torch.get_autocast_dtype(d)
            if d == self.device and got == self.dtype:
                continue  # the declared autocast, entered by the caller as well: the same forward
            declared = "no autocast" if self.dtype is None else f"autocast {self.device} {_dt(self.dtype)}"
            raise Refusal(
                "torch-autocast-refused",
                f"torch.autocast({d!r}, dtype={_dt(got)}) is active around DataParallel.step, which "
                f"declared {declared}; declare it with DataParallel(..., autocast=torch.{_dt(got)}) "
                "so the contract names it",
            )

    def check_loss(self, loss: torch.Tensor) -> None:
        """Refuse a slot loss in a reduced format the declaration does not allow."""
        if loss.dtype in (torch.float32, torch.float64) or loss.dtype == self.dtype:
            return
        raise Refusal(
            "torch-autocast-refused",
            f"the slot loss is {_dt(loss.dtype)}; a forward in a reduced format (autocast or "
            ".half() inside the module?) is not what the DataParallel declared "
            f"({self.name}): declare it with DataParallel(..., autocast=...)",
        )


def _dt(dtype) -> str:
    return str(dtype).replace("torch.", "")


AUTOCAST = {"cpu": ("bfloat16", "float16"), "cuda": ("float16", "bfloat16")}
"""The autocast formats DataParallel accepts, per device type."""


def precision(autocast: object, device, param_dtype) -> Precision:
    """The Precision of `DataParallel(autocast=...)`: None, or a reduced float dtype (a
    torch.dtype or its name) for the module's device type; `usage` for anything else."""
    if autocast is None:
        return Precision(device.type)
    name = _dt(autocast) if isinstance(autocast, torch.dtype) else autocast
    allowed = AUTOCAST.get(device.type, ())
    if name not in allowed:
        raise Refusal(
            "usage",
            f"autocast={autocast!r} on {device.type}: use None or one of "
            f"{', '.join('torch.' + a for a in allowed)}",
        )
    if param_dtype != torch.float32:
        raise Refusal(
            "usage",
            f"autocast needs float32 parameters (autocast casts float32 ops); these are {_dt(param_dtype)}",
        )
    return Precision(device.type, getattr(torch, name))


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
