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
  `.grad` to +inf (the gradient writer's `overflow`), so `scaler.step(opt)` finds the overflow, skips the update on
  every rank alike, and `scaler.update()` backs off: the same scale everywhere.
- The scale is one of the words the ranks agree on (alpha_mpi.torch.step_agreement): ranks whose
  scalers hold other scales are refused by name (`step-mismatch`, field `loss scale`).

Without `scaler=`, `scaler.step(opt)` would divide the unscaled gradient by S: pass it. Not with
`bucket_mb` (the buckets are combined before the last slot's overflow is known).

A sharded partition (`state`, `grads`, `params`) takes `ShardedGradScaler` (torch's GradScaler
with the unscaling a shard needs; FSDP has one of that name). torch's own `scaler.step(opt)`
looks for the overflow in the `.grad` of the optimizer's shard tensors, which exist only inside
the sharded `opt.step()` (and a rank with an empty shard has none at all), so it stops with "No
inf checks were recorded for this optimizer" (measured, torch 2.13): torch's GradScaler there is
refused by name (`options-conflict`, flagged on every rank in the step's combine). The
ShardedGradScaler unscales what this rank holds — every `.grad` in `state` (each rank holds the
whole gradient), the rank's gradient shard in `grads` and `params` — by torch's own unscaling
(the same multiplication by 1/S), and takes the overflow from the step's combined flag, which
every rank has, instead of from the tensors: a rank with an empty shard records it too, so
`scaler.step(opt)` skips the sharded update on every rank alike and `scaler.update()` moves
every rank's scale alike. After an overflow the shard holds +inf (no parameter's whole `.grad`
is made in `grads`/`params`). With an optimizer that is not sharded it is torch's GradScaler.
bfloat16 needs no scaler.
"""

from __future__ import annotations

import math

from ..refusals import Refusal
from ._env import require_torch

torch = require_torch()

__all__ = ["ShardedGradScaler", "loss_scale"]


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
    if sharded is not None and not isinstance(scaler, ShardedGradScaler):
        raise Refusal(
            "options-conflict",
            f"scaler= with partition={sharded!r} takes alpha_mpi.torch.ShardedGradScaler: torch's "
            "GradScaler unscales and checks for overflow the .grad of the optimizer's own tensors, "
            "which in a sharded partition are shard tensors whose .grad exists only inside "
            "opt.step(), so scaler.step(opt) would stop on torch's 'No inf checks were recorded'; "
            "build ShardedGradScaler(...) with the same arguments",
        )
    s = float(scaler.get_scale())
    if not (math.isfinite(s) and s > 0):
        raise Refusal("usage", f"the GradScaler's scale is {s!r}; it must be a finite number > 0")
    return s


class ShardedGradScaler(torch.amp.GradScaler):
    """torch's `GradScaler` (same arguments, same scale schedule) for a sharded DataParallel:
    `dp.step(..., scaler=scaler)`, `scaler.step(opt)`, `scaler.update()` as with torch's, where
    `opt` is `dp.optimizer(...)` of a `state`, `grads` or `params` partition (the module says
    what differs). Pass it to every step whose update it makes."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._overflow: bool | None = None  # the last step's combined flag (None: no step yet)

    def note_step(self, overflow: bool | None) -> None:
        """What DataParallel's step found (every rank alike): whether a slot's scaled gradient
        overflowed; None when a step began and has not settled (no update to make yet)."""
        self._overflow = overflow

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        shards = getattr(optimizer, "_alpha_mpi_shards", None)
        if shards is None:  # torch's own optimizer: torch's own unscaling and check
            return super()._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)
        if self._overflow is None:
            raise Refusal(
                "usage",
                "ShardedGradScaler: no step of the DataParallel settled with scaler= this scaler since "
                "the last update; call dp.step(..., scaler=scaler) before scaler.step(opt)",
            )
        groups: dict = {}
        for g in shards.ctx.grads.held():
            if g.dtype == torch.float16 and not allow_fp16:
                raise ValueError("Attempting to unscale FP16 gradients.")  # torch's own words
            groups.setdefault((g.device, g.dtype), []).append(g)
        with torch.no_grad():
            for (device, _), grads in groups.items():
                local = torch.zeros((), dtype=torch.float32, device=device)  # the flag decides
                torch._amp_foreach_non_finite_check_and_unscale_(grads, local, inv_scale.to(device))
        found_inf.fill_(1.0 if self._overflow else 0.0)
        self._overflow = None  # one unscaling per settled step
        shards.ctx.grads.scale = 1.0  # (a fused update takes the scale itself: torch passes it)
        return {found_inf.device: found_inf}
