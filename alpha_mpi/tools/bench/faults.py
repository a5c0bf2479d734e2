"""Fault injection for the audit (issue 24): an explicit hook object the learners accept.

It lives in the tools layer because `alpha-mpi bench audit --inject` (audit_inject.py) draws
these faults itself, and the product never imports the verification package;
`alpha_mpi_verify.faults` re-exports the same classes for the tests.

    from alpha_mpi_verify.faults import BitFlip
    learner = DataParallelLearner(comm, model, slots=8, audit_slots=8,
                                  fault_hook=BitFlip(rank=1, step=3, element=5, bit=0))

The learner calls `hook(rank, step, slot, payload)` after every slot payload a rank computes
(its own slots, and those it recomputes as auditor or referee), so a BitFlip behaves like a
"mercurial core": every payload computed on `rank` at `step` (or at every step from `step` on,
with `persistent=True`; only slot `slot` where given) comes out with bit `bit` of word `element`
flipped. Nothing in the product reads an environment variable for this; without a hook the
learner does nothing extra.

`CarriedFlip` flips a bit of the audit's own words as a rank carries them into the combine (its
digests' halves, or the zeros of a slot it neither owns nor audits), after they are written: the
learner calls `hook.carried(rank, step, words)` where the hook has it. `Faults(a, b, ...)` is
several faults at once (two faulty ranks, say).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["BitFlip", "CarriedFlip", "Faults"]


@dataclass
class BitFlip:
    """Flip bit `bit` (0 = lowest mantissa bit, 63 = sign) of word `element` of the payloads
    computed on `rank` at `step` (from `step` on if `persistent`; only slot `slot` if given).
    `once`: only the first time each (step, slot) is computed, so a retry of the refused step
    no longer meets it (a transient fault; without it a retried step is flipped again)."""

    rank: int
    step: int
    element: int
    bit: int
    slot: int | None = None
    persistent: bool = False
    once: bool = False
    hits: list[tuple[int, int]] = field(default_factory=list)  # (step, slot) of each flip done

    def __call__(self, rank: int, step: int, slot: int, payload: np.ndarray) -> None:
        """Flip the bit if this call is one the fault covers."""
        if rank != self.rank or (step != self.step and not (self.persistent and step > self.step)):
            return
        if self.slot is not None and slot != self.slot:
            return
        if self.once and (step, slot) in self.hits:
            return
        payload.view(np.uint64)[self.element] ^= np.uint64(1) << np.uint64(self.bit)
        self.hits.append((step, slot))


@dataclass
class CarriedFlip:
    """Flip bit `bit` of word `element` of the audit's words that rank `rank` carries into the
    combine at `step` (from `step` on if `persistent`), after its digests are written there:
    word 2j and 2j + 1 are audited slot j's two digest halves (zeros where `rank` neither owns
    nor audits slot j). The payloads themselves are left alone."""

    rank: int
    step: int
    element: int
    bit: int
    persistent: bool = False
    hits: list[int] = field(default_factory=list)  # the steps of each flip done

    def __call__(self, rank: int, step: int, slot: int, payload: np.ndarray) -> None:
        """Not a payload fault."""

    def carried(self, rank: int, step: int, words: np.ndarray) -> None:
        """Flip the bit if this call is one the fault covers (only at audited steps: `words`
        holds the round's pairs; between rounds the learner writes zeros and carries them too)."""
        if rank != self.rank or (step != self.step and not (self.persistent and step > self.step)):
            return
        if self.element < len(words):
            words.view(np.uint64)[self.element] ^= np.uint64(1) << np.uint64(self.bit)
            self.hits.append(step)


class Faults:
    """Several faults at once: each hook is called in turn, payloads and carried words alike."""

    def __init__(self, *hooks) -> None:
        self.hooks = hooks

    def __call__(self, rank: int, step: int, slot: int, payload: np.ndarray) -> None:
        for h in self.hooks:
            h(rank, step, slot, payload)

    def carried(self, rank: int, step: int, words: np.ndarray) -> None:
        for h in self.hooks:
            if hasattr(h, "carried"):
                h.carried(rank, step, words)
