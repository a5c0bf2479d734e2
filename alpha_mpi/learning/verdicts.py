"""A few words from every rank to every rank, through the engine (no MPI collective; layer 5).

The audit's digest tables, the referees' verdicts, the replica digests and the replay's first
difference all have one shape: rank r contributes W float64 words (block r of a p x W table) and
every rank receives the whole table, so every rank decides from the same facts. That is an
assembly by selection (alpha_mpi.execution.Assembler): exact, frame-checked and bounded like every
other exchange. Values must be exact in binary64 (digests travel as two 32-bit halves).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..execution import Assembler
from ..planning.assembly import plan_assembly

if TYPE_CHECKING:
    from mpi4py import MPI

    from ..refusals import Refusal

__all__ = ["WordTable", "halves"]


def halves(d: int) -> tuple[float, float]:
    """A 64-bit integer as two exact float64 words (low 32 bits, high 32 bits)."""
    return float(d & 0xFFFFFFFF), float(d >> 32)


class WordTable:
    """Every rank's `width` words to every rank. Build on every rank (collective)."""

    def __init__(self, comm: MPI.Comm, width: int, *, timeout: float | None, contract: str) -> None:
        size, self.rank, self.width = comm.Get_size(), comm.Get_rank(), width
        ranges = [(r, r * width, (r + 1) * width) for r in range(size)]
        self._asm = Assembler(
            comm, plan_assembly(ranges, size * width, size), timeout=timeout, contract=contract
        )
        self._out = np.empty(size * width)
        self._key = (self.rank * width, (self.rank + 1) * width)

    def run(self, mine: np.ndarray, refused: Refusal | None = None) -> np.ndarray:
        """Send this rank's `width` words; returns the (size, width) table (a view reused by the
        next run). Every rank calls it the same number of times. `refused`: this rank's refusal
        instead of words; every rank then raises (it here, `peer-refused` elsewhere)."""
        return self._asm.run({self._key: mine}, out=self._out, refused=refused).reshape(-1, self.width)
