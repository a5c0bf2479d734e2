"""Where each word of a slot's binary64 payload lies: `PayloadLayout`.

Apart from the slot pass (which writes a slot's payload) and the step (which reads the combined
one) because both, the buckets and the audit follow this one layout: built once from the module's
parts, frozen, passed to each of them in its constructor.

The payload, in order (`layout`: the named components the combine plans over):

    numerator   each trainable parameter's gradient, parameter by parameter (`offsets`)
    buffers     each floating buffer (slot-mean mode; absent without such buffers)
    used        one word per parameter: 1 where the slot gave it a gradient
    sizes       one word per slot: slot s writes its sample count at word s (one non-zero per
                word: exact), so every rank sees the whole cut after the combine
    mass        what the step divides by (samples, or the loss's declared mass: tokens, say)
    loss        the slot's loss sum
    inf         1 where a slot's gradient, scaled by a GradScaler, overflowed (its words then 0)
    stop        1 where a rank asked to stop (the first owned slot's payload)
    agree       the step's agreement words (alpha_mpi.torch.step_agreement); after stop, so the
                audit digests the words before it
    audit       with audit_slots only: the audit's words (alpha_mpi.learning.audit: per audited
                slot the owner's digest minus the auditor's, two words); absent from the
                layout the contract names (`of` without `audit`), so auditing is not a contract
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model import Layout
from .step_agreement import WORDS

__all__ = ["PayloadLayout"]


def _ranges(sizes, start: int) -> tuple[tuple[int, int], ...]:
    out, at = [], start
    for k in sizes:
        out.append((at, at + k))
        at += k
    return tuple(out)


@dataclass(frozen=True)
class PayloadLayout:
    """The payload's words for a module's parts and a slot count (`of`); the readers of a
    combined payload by name (`gradient`, `mass`, ...)."""

    offsets: tuple[tuple[int, int], ...]  # each parameter's gradient words
    buffer_offsets: tuple[tuple[int, int], ...]  # each floating buffer's words
    n: int  # gradient words
    nb: int  # floating buffer words
    slots: int
    layout: Layout

    @classmethod
    def of(cls, params: list, float_buffers: list, slots: int, audit: int = 0) -> PayloadLayout:
        """The layout of `params` (tensors), `float_buffers` ((name, tensor)) and `slots`, with
        `audit` words at its end (alpha_mpi.learning.audit.audit_words; 0: none)."""
        offsets = _ranges([p.numel() for p in params], 0)
        n = offsets[-1][1] if offsets else 0
        buffer_offsets = _ranges([b.numel() for _, b in float_buffers], n)
        nb = (buffer_offsets[-1][1] if buffer_offsets else n) - n
        comps = [("numerator", n)] + ([("buffers", nb)] if nb else [])
        comps += [("used", len(params)), ("sizes", slots), ("mass", 1), ("loss", 1), ("inf", 1), ("stop", 1)]
        comps += [("agree", WORDS)] + ([("audit", audit)] if audit else [])
        return cls(offsets, buffer_offsets, n, nb, slots, Layout(*comps))

    # where the words after the buffers lie
    @property
    def used_at(self) -> int:
        return self.n + self.nb

    @property
    def sizes_at(self) -> int:
        return self.used_at + len(self.offsets)

    @property
    def mass_at(self) -> int:
        return self.sizes_at + self.slots

    @property
    def loss_at(self) -> int:
        return self.mass_at + 1

    @property
    def inf_at(self) -> int:
        return self.mass_at + 2

    @property
    def stop_at(self) -> int:
        return self.mass_at + 3

    @property
    def agree_at(self) -> int:
        return self.mass_at + 4

    @property
    def audit_at(self) -> int:
        return self.agree_at + WORDS

    @property
    def total(self) -> int:
        return self.layout.total

    # readers of a combined payload
    def gradient(self, red: np.ndarray) -> np.ndarray:
        """Σ of the slots' gradients (a view)."""
        return red[: self.n]

    def buffers(self, red: np.ndarray) -> np.ndarray:
        """Σ of the slots' floating buffers (a view)."""
        return red[self.n : self.used_at]

    def used(self, red: np.ndarray) -> np.ndarray:
        """Per parameter: whether any slot gave it a gradient."""
        return red[self.used_at : self.sizes_at] > 0

    def sizes(self, red: np.ndarray) -> np.ndarray:
        """Each slot's sample count (a view)."""
        return red[self.sizes_at : self.mass_at]

    def agreement(self, red: np.ndarray) -> np.ndarray:
        """The step's agreement words, summed over the slots (a view)."""
        return red[self.agree_at : self.audit_at]

    def audit(self, red: np.ndarray) -> np.ndarray:
        """The audit's words, summed over the slots (a view; empty without the audit)."""
        return red[self.audit_at :]
