"""One slot's forward and backward into its binary64 payload, and the payload's layout: the
`SlotPasses` part of `DataParallel`.

Apart from data_parallel.py (which holds the step: cut, slots, combine, `.grad`) because this is
what a slot computes wherever it runs, the part the audit recomputes on another rank and the
buckets overlap: the payload's words and where each lies (`_lay_out`), and the pass itself
(`_slot`): the step-start buffers, the slot's generator seeds, the forward, the declared-sum
loss, its own backward into fresh tensors (nothing accumulated across slots), each gradient
widened exactly into its payload slice (on the host: one copy per slot for a module on a
device; by the bucket hooks for the last owned slot with `bucket_mb`), then the floating
buffers, the used flags, the slot's sample count, mass and loss, and the step's agreement words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..learning.slicing import batch_length
from ..model import Layout
from ._env import require_torch
from .convert import into64 as _into64
from .devices import host_gradients, to_device
from .losses import slot_loss
from .slot_rules import seed_slot
from .step_agreement import WORDS

if TYPE_CHECKING:
    import torch
else:
    torch = require_torch()

__all__ = ["SlotPasses", "SlotCall"]


@dataclass(frozen=True)
class SlotCall:
    """What every slot pass of one step shares: the loss and whether it is declared a sum
    (alpha_mpi.torch.losses), the step-start buffers (None: none kept), the CUDA devices whose
    generators are seeded, the step's agreement words (alpha_mpi.torch.step_agreement), and a
    GradScaler whose scale multiplies each slot's loss (None: none; alpha_mpi.torch.scaling)."""

    loss_fn: Any
    declared: bool
    start: list | None
    devices: list
    words: np.ndarray
    scaler: Any = None


class SlotPasses:
    """The slot pass of DataParallel (a mixin: it reads the DataParallel's attributes)."""

    def _lay_out(self, slots: int) -> Layout:
        """The payload: gradients (`numerator`, parameter by parameter), floating buffers, one
        `used` word per parameter, the slots' sizes, mass, loss, stop, and the step's agreement
        words (after stop: the audit digests the words before stop); sets the offsets."""
        # Offsets of each parameter and each floating buffer in the flat binary64 payload.
        self.offsets, off = [], 0
        for p in self.params:
            self.offsets.append((off, off + p.numel()))
            off += p.numel()
        n = self.n = off
        self.buffer_offsets, boff = [], n
        for _, b in self.float_buffers:
            self.buffer_offsets.append((boff, boff + b.numel()))
            boff += b.numel()
        self.nb = boff - n
        k = len(self.params)
        comps = [("numerator", n)] + ([("buffers", self.nb)] if self.nb else [])
        # `sizes`: slot s writes its sample count at word s (exact: one non-zero per word), so
        # every rank sees the whole cut after the combine and can check it is one global batch's.
        # `mass`: what the step divides by (samples, or the loss's declared mass: tokens, say).
        # `inf`: 1 where a slot's gradient, scaled by a GradScaler, overflowed (its words then 0).
        comps += [("used", k), ("sizes", slots), ("mass", 1), ("loss", 1), ("inf", 1), ("stop", 1)]
        comps += [("agree", WORDS)]
        self.used_at, self.sizes_at = boff, boff + k
        self.mass_at = self.sizes_at + slots
        self.loss_at, self.inf_at, self.stop_at = self.mass_at + 1, self.mass_at + 2, self.mass_at + 3
        self.agree_at = self.stop_at + 1
        return Layout(*comps)

    def _slot(self, s: int, data, call: SlotCall, buf=None, armed: bool = False) -> None:
        """Slot s's payload (into `buf`, default its own): forward and backward alone, own
        generator seeds (the caller restores the states), the declared loss (losses.slot_loss)
        under the declared precision. `armed`: the last owned slot with buckets, whose gradients
        the hooks take (overlap.py)."""
        Xs, ys = to_device(data, self.device)
        buf = self.payloads[s] if buf is None else buf
        self._restore_buffers(call.start)
        seed_slot(self.seed, self.steps, s, call.devices)
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
                buf[: self.n] = 0.0
            elif self._host is not None:
                grads = torch.autograd.grad(graph, self.params, allow_unused=True)
                host_gradients(grads, self.params, self._host, buf[: self.n], loss.scale)
            else:
                grads = torch.autograd.grad(graph, self.params, allow_unused=True)
                for g, (a, b) in zip(grads, self.offsets):
                    if g is None:
                        buf[a:b] = 0.0
                    else:
                        _into64(buf[a:b], g)
                        if loss.scale != 1.0:
                            buf[a:b] *= loss.scale
        buf[self.inf_at] = 0.0
        if call.scaler is not None and not np.isfinite(buf[: self.n]).all():
            buf[: self.n] = 0.0  # the overflow travels as a flag; the combine stays finite
            buf[self.inf_at] = 1.0
        for (_, t), (a, b) in zip(self.float_buffers, self.buffer_offsets):
            _into64(buf[a:b], t)
        buf[self.used_at : self.sizes_at] = [0.0 if g is None else 1.0 for g in grads]
        buf[self.sizes_at : self.mass_at] = 0.0
        buf[self.sizes_at + s] = float(count)
        buf[self.mass_at] = loss.mass
        buf[self.loss_at] = loss.value
        buf[self.agree_at :] = call.words
        if self.fault_hook is not None:
            self.fault_hook(self.rank, self.steps, s, buf)

    def _restore_buffers(self, start) -> None:
        """Every buffer back to its step-start value (`start`: their clones; None: nothing kept)."""
        if start is None:
            return
        with torch.no_grad():
            for (_, b), b0 in zip(self.float_buffers + self.other_buffers, start):
                b.copy_(b0)
