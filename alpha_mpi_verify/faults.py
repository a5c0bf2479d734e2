"""Fault injection for the audit (issue 24): an explicit hook object the learners accept.

    from alpha_mpi_verify.faults import BitFlip
    learner = DataParallelLearner(comm, model, slots=8, audit_slots=8,
                                  fault_hook=BitFlip(rank=1, step=3, element=5, bit=0))

The learner calls `hook(rank, step, slot, payload)` after every slot payload a rank computes
(its own slots, and those it recomputes as auditor or referee), so a BitFlip behaves like a
"mercurial core": every payload computed on `rank` at `step` (or at every step from `step` on,
with `persistent=True`; only slot `slot` where given) comes out with bit `bit` of word `element`
flipped. Nothing in the product reads an environment variable for this; without a hook the
learner does nothing extra.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["BitFlip"]


@dataclass
class BitFlip:
    """Flip bit `bit` (0 = lowest mantissa bit, 63 = sign) of word `element` of the payloads
    computed on `rank` at `step` (from `step` on if `persistent`; only slot `slot` if given)."""

    rank: int
    step: int
    element: int
    bit: int
    slot: int | None = None
    persistent: bool = False
    hits: list[tuple[int, int]] = field(default_factory=list)  # (step, slot) of each flip done

    def __call__(self, rank: int, step: int, slot: int, payload: np.ndarray) -> None:
        """Flip the bit if this call is one the fault covers."""
        if rank != self.rank or (step != self.step and not (self.persistent and step > self.step)):
            return
        if self.slot is not None and slot != self.slot:
            return
        payload.view(np.uint64)[self.element] ^= np.uint64(1) << np.uint64(self.bit)
        self.hits.append((step, slot))
