"""One slot's forward and backward into its binary64 payload: `SlotPass`.

Apart from data_parallel.py (which holds the step: cut, slots, combine, `.grad`) because this is
what a slot computes wherever it runs, the part the audit recomputes on another rank and the
buckets overlap: the step-start buffers, the slot's generator seeds, the forward, the
declared-sum loss, its own backward into fresh tensors (nothing accumulated across slots), each
gradient widened exactly into its payload slice (on the host: one copy per slot for a module on
a device; by the bucket hooks for the last owned slot with `bucket_mb`), then the floating
buffers, the used flags, the slot's sample count, mass and loss, and the step's agreement words,
each where the `PayloadLayout` puts it (alpha_mpi.torch.payload).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..learning.slicing import batch_length
from ._env import require_torch
from .buffers import StepBuffers
from .convert import into64
from .devices import host_gradients, to_device
from .losses import slot_loss
from .payload import PayloadLayout
from .slot_rules import Precision, seed_slot

if TYPE_CHECKING:
    import torch

    from ..learning.audit import FaultHook
    from .overlap import Buckets
else:
    torch = require_torch()

__all__ = ["SlotPass", "SlotCall"]


@dataclass(frozen=True)
class SlotCall:
    """What every slot pass of one step shares: the step's number (the slots' generator seeds),
    the loss and whether it is declared a sum (alpha_mpi.torch.losses), the step-start buffers
    (None: none kept), the CUDA devices whose generators are seeded, the step's agreement words
    (alpha_mpi.torch.step_agreement), and a GradScaler whose scale multiplies each slot's loss
    (None: none; alpha_mpi.torch.scaling)."""

    step: int
    loss_fn: Any
    declared: bool
    start: list | None
    devices: list
    words: np.ndarray
    scaler: Any = None


class SlotPass:
    """The slot pass of one DataParallel, over explicit parts: the module and its trainable
    `params`, the payload `layout`, the `buffers`, the declared `precision`, the module's
    `device`, the slots' `seed`, the `buckets` whose hooks take the last owned slot's gradients
    (None: one combine after the slots), the audit's `fault_hook` (None: none) and this `rank`
    (what the hook is told)."""

    def __init__(
        self,
        module: torch.nn.Module,
        params: list,
        layout: PayloadLayout,
        buffers: StepBuffers,
        precision: Precision,
        *,
        device: torch.device,
        dtype: torch.dtype,
        seed: int,
        buckets: Buckets | None,
        fault_hook: FaultHook | None,
        rank: int,
    ) -> None:
        self.module, self.params, self.layout, self.buffers = module, params, layout, buffers
        self.precision, self.device, self.seed = precision, device, seed
        self.buckets, self.fault_hook, self.rank = buckets, fault_hook, rank
        # A module on a device: each slot's gradients cross to the host in one copy, into this.
        self.host = None if device.type == "cpu" else torch.empty(layout.n, dtype=dtype, pin_memory=True)

    def run(self, s: int, data, call: SlotCall, buf: np.ndarray, armed: bool = False) -> None:
        """Slot s's payload into `buf`: forward and backward alone, own generator seeds (the
        caller restores the states), the declared loss (losses.slot_loss) under the declared
        precision. `armed`: the last owned slot with buckets, whose gradients the hooks take
        (overlap.py)."""
        lay = self.layout
        Xs, ys = to_device(data, self.device)
        self.buffers.restore(call.start)
        seed_slot(self.seed, call.step, s, call.devices)
        count = batch_length(Xs, ys)
        with self.precision.forward():
            loss = slot_loss(call.loss_fn, self.module, Xs, ys, count, call.declared)
        # The slot's gradient: the backward of its own loss alone (fresh tensors, nothing
        # accumulated), each parameter's widened straight into its payload slice (no
        # concatenated copy; the same exact conversion element by element), times the loss's
        # scale in binary64 (1, or the mass of a module's mean: exact, losses.py).
        graph = loss.graph
        if graph is None:  # a mean over nothing: no backward, no gradient
            grads = [None] * len(self.params)
        else:
            self.precision.check_loss(graph)
            if call.scaler is not None:  # times its scale, a power of two: exact (scaling.py)
                graph = call.scaler.scale(graph)
        with self.precision.backward():
            if armed:
                self.buckets.arm(buf, loss.scale)
                if graph is not None:
                    grads = torch.autograd.grad(graph, self.params, allow_unused=True)
                self.buckets.disarm(grads)
            elif graph is None:
                buf[: lay.n] = 0.0
            elif self.host is not None:
                grads = torch.autograd.grad(graph, self.params, allow_unused=True)
                host_gradients(grads, self.params, self.host, buf[: lay.n], loss.scale)
            else:
                grads = torch.autograd.grad(graph, self.params, allow_unused=True)
                for g, (a, b) in zip(grads, lay.offsets):
                    if g is None:
                        buf[a:b] = 0.0
                    else:
                        into64(buf[a:b], g)
                        if loss.scale != 1.0:
                            buf[a:b] *= loss.scale
        buf[lay.inf_at] = 0.0
        if call.scaler is not None and not np.isfinite(buf[: lay.n]).all():
            buf[: lay.n] = 0.0  # the overflow travels as a flag; the combine stays finite
            buf[lay.inf_at] = 1.0
        for (_, t), (a, b) in zip(self.buffers.float_buffers, lay.buffer_offsets):
            into64(buf[a:b], t)
        buf[lay.used_at : lay.sizes_at] = [0.0 if g is None else 1.0 for g in grads]
        buf[lay.sizes_at : lay.mass_at] = 0.0
        buf[lay.sizes_at + s] = float(count)
        buf[lay.mass_at] = loss.mass
        buf[lay.loss_at] = loss.value
        buf[lay.agree_at : lay.audit_at] = call.words
        if self.fault_hook is not None:  # the slot's words, not the audit's after them
            self.fault_hook(self.rank, call.step, s, buf[: lay.audit_at])
