"""The step's one combine of the owned slots' payloads over the slot tree: `StepCombine`.

Apart from the step because it owns the exchange's buffers and chooses once, at construction,
how the combine runs: one `Allreducer` after the slots, or `Buckets` (alpha_mpi.torch.overlap)
started while the last owned slot's backward runs. Either way every coordinate is the tree's
sum in the declared order, and a refusal on this rank travels as a flag in the combine, so
every rank refuses the step by name (`peer-refused` naming this rank) and the next step works.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from ..execution import Allreducer
from ..refusals import Refusal
from .overlap import Buckets
from .payload import PayloadLayout

if TYPE_CHECKING:
    from mpi4py import MPI

    from ..model import Node
    from ..planning import Plan

__all__ = ["StepCombine"]


class StepCombine:
    """The combine of one DataParallel over the slot `tree` and its `plan` (built on every rank,
    collectively; the buckets plan their own ranges over the same tree): `payloads` (one
    binary64 payload per owned slot, written by the slot pass), `reduced` (the combined payload),
    `buckets` (None: one combine after the slots) and the `realization` that runs."""

    def __init__(
        self,
        comm: MPI.Comm,
        tree: Node,
        plan: Plan,
        layout: PayloadLayout,
        params: list,
        *,
        bucket_mb: float | None,
        timeout: float | None,
        contract: str,
        realization: str,
    ) -> None:
        self.reducer: Allreducer | None = None
        self.buckets: Buckets | None = None
        if bucket_mb is None:
            self.reducer = Allreducer(comm, plan, timeout=timeout, contract=contract, realization=realization)
            self.realization = self.reducer.realization
        else:
            self.buckets = Buckets(
                comm,
                tree,
                params,
                list(layout.offsets),
                layout.total,
                bucket_mb=bucket_mb,
                timeout=timeout,
                contract=contract,
                realization=realization,
            )
            self.realization = self.buckets.reducers[0].realization
        self.payloads = {s: np.zeros(layout.total) for s in plan.slots_of(comm.Get_rank())}
        self.reduced = np.empty(layout.total)
        self.reader = layout  # the combined payload is the whole payload: read by its layout

    def slot_buffer(self, s: int) -> np.ndarray:
        """Where slot `s`'s pass writes its payload: its own, kept to the combine."""
        return self.payloads[s]

    def slot_done(self, s: int) -> None:
        """Slot `s`'s payload is final (nothing to do: the combine reads every payload)."""

    @contextlib.contextmanager
    def around_slots(self) -> Iterator[None]:
        """Around the slot passes: with buckets, the worker takes the step and whatever escapes
        the slots still ends its walk (overlap.Buckets.walk); without, nothing."""
        if self.buckets is None:
            yield
            return
        self.buckets.begin(self.payloads, self.reduced)
        with self.buckets.walk():
            yield

    def finish(self, refused: Refusal | None) -> np.ndarray:
        """The combined payload, after this rank's slots (`refused`: this rank's refusal of the
        step, flagged to every rank, which then all raise it by name)."""
        if self.buckets is not None:
            return self.buckets.finish(refused)
        if refused is None:
            return self.reducer.run(self.payloads, out=self.reduced)
        return self.reducer.prepared.run_checked(None, self.reduced, refused=refused)

    def free(self) -> None:
        """Free the combine's requests and give its tags back (local)."""
        if self.reducer is not None:
            self.reducer.free()
        if self.buckets is not None:
            self.buckets.free()
