"""A torch GradScaler with DataParallel: `step(..., scaler=scaler)` (float16 autocast's loss scaling).

`torch.amp.GradScaler` multiplies the loss by its scale S before the backward (so float16
gradients do not underflow), then `scaler.step(opt)` divides `.grad` by S, skips `opt.step()` when
a gradient overflowed, and `scaler.update()` moves S (halved after an overflow, doubled after
`growth_interval` clean steps). DataParallel runs the backward itself, so it takes the scaler:

    with torch.autocast("cuda", dtype=torch.float16):       # or DataParallel(autocast=...)
        loss = dp.step(X, y, loss_fn, scaler=scaler)       # each slot's backward of S * loss
    scaler.step(opt)                                         # .grad / S; skipped after an overflow
    scaler.update()

- Each slot differentiates `scaler.scale(loss)`, S * loss (`loss_scale(scaler)`: S; its default 2^16, growth 2 and
  backoff 0.5 keep it a power of two, so the scaling and the scaler's unscaling are exact
  wherever no overflow or underflow happens).
- A slot whose scaled gradient is not finite writes zeros and sets the payload's `inf` word
  (the combine stays finite; every rank sees the flag after it). Then every rank sets every
  `.grad` to +inf (`mark_overflow`), so `scaler.step(opt)` finds the overflow, skips the update on
  every rank alike, and `scaler.update()` backs off: the same scale everywhere.
- The scale is one of the words the ranks agree on (alpha_mpi.torch.step_agreement): ranks whose
  scalers hold other scales are refused by name (`step-mismatch`, field `loss scale`).

Without `scaler=`, `scaler.step(opt)` would divide the unscaled gradient by S: pass it. Not with
`bucket_mb` (the buckets are combined before the last slot's overflow is known) and not in a
sharded partition (`state`, `grads`, `params`): `options-conflict`, flagged on every rank in the
step's combine. In those modes torch's `scaler.step(opt)` looks for the overflow in the `.grad` of
the optimizer's shard tensors, which exist only inside the sharded `opt.step()` (and a rank with
an empty shard has none at all), so torch stops with "No inf checks were recorded for this
optimizer" (measured, torch 2.13). FSDP answers with a ShardedGradScaler that agrees on the
overflow across ranks; alpha_mpi's overflow flag already travels in the combine, and handing it
to the shard tensors is the work left (docs/pytorch.md). bfloat16 needs no scaler.
"""

from __future__ import annotations

import math

from ..refusals import Refusal
from ._env import require_torch

torch = require_torch()

__all__ = ["loss_scale", "mark_overflow"]


def loss_scale(scaler, buckets: bool = False, sharded: str | None = None) -> float | None:
    """The scale a step multiplies each slot's loss by (each slot calls `scaler.scale(loss)`, as
    a torch script does before its backward): None without a scaler (or a disabled one), else
    `scaler.get_scale()`, a finite number > 0 (`usage` otherwise). Refused with `bucket_mb` and in
    a mode that shards the optimizer state (`sharded`: its name; `options-conflict`, see the module)."""
    if scaler is None:
        return None
    needs = ("get_scale", "is_enabled", "scale")
    if not all(callable(getattr(scaler, k, None)) for k in needs):
        raise Refusal("usage", f"scaler= takes a torch.amp.GradScaler, got {type(scaler).__name__}")
    if not scaler.is_enabled():
        return None
    if buckets:
        raise Refusal(
            "options-conflict",
            "scaler= with bucket_mb: the buckets are combined before the last slot's overflow is known; "
            "build DataParallel without bucket_mb",
        )
    if sharded is not None:
        raise Refusal(
            "options-conflict",
            f"scaler= with partition={sharded!r}: torch's GradScaler unscales and checks for "
            "overflow the .grad of the optimizer's own tensors, which in a sharded partition are "
            "shard tensors whose .grad exists only inside opt.step(), so scaler.step(opt) would stop "
            "on torch's 'No inf checks were recorded'; train float16 with partition='none', or use "
            "autocast=torch.bfloat16, which needs no loss scaling",
        )
    s = float(scaler.get_scale())
    if not (math.isfinite(s) and s > 0):
        raise Refusal("usage", f"the GradScaler's scale is {s!r}; it must be a finite number > 0")
    return s


def mark_overflow(params) -> None:
    """Every `.grad` +inf: a scaled gradient overflowed in some slot; `scaler.step` skips."""
    for p in params:
        p.grad = torch.full_like(p, math.inf)
