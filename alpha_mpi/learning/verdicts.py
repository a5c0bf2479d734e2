"""A few words from every rank to every rank: the communicator's verdict round (layer 5).

The audit's referees' verdicts (after a mismatch), the replica digests and the replay's first
difference all have one shape: rank r contributes W float64 words (row r of a p x W table) and
every rank receives the whole table, so every rank decides from the same facts. That is the
endpoint's verdict round (alpha_mpi.execution.Endpoint.verdict): point to point, size-safe and
bounded like every other exchange, the words travelling as their bits (digests as two exact
32-bit halves, as before, so the tables read the same).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..execution import Endpoint

if TYPE_CHECKING:
    from mpi4py import MPI

    from ..refusals import Refusal

__all__ = ["WordTable", "halves"]


def halves(d: int) -> tuple[float, float]:
    """A 64-bit integer as two exact float64 words (low 32 bits, high 32 bits)."""
    return float(d & 0xFFFFFFFF), float(d >> 32)


class WordTable:
    """Every rank's `width` words to every rank, one verdict round per `run`. Making one is local
    (the communicator's endpoint is made on first use: collective then). `contract`: the
    digest of the learner's numerical contract, part of the round's name (ranks under another
    contract are out of step); `what` names the round in refusals."""

    def __init__(
        self,
        comm: MPI.Comm,
        width: int,
        *,
        timeout: float | None,
        contract: str,
        what: str = "a digest round",
    ) -> None:
        self.endpoint = Endpoint.of(comm, timeout)
        self.rank, self.width, self.timeout = comm.Get_rank(), width, timeout
        self.what = what
        self._name = f"{what} ({width} words, contract {contract[:16] or '-'})"

    def run(self, mine: np.ndarray, refused: Refusal | None = None) -> np.ndarray:
        """Send this rank's `width` words; returns the (size, width) table (read-only). Every rank
        calls it the same number of times. `refused`: this rank's refusal instead of words;
        every rank then raises (it here, `peer-refused` naming it elsewhere)."""
        words = np.zeros(self.width) if refused is not None else np.ascontiguousarray(mine, dtype=np.float64)
        if words.shape != (self.width,):
            raise ValueError(f"a WordTable of width {self.width} got {words.shape} words")
        v = self.endpoint.verdict(words.view(np.uint64), refused, self._name, timeout=self.timeout)
        v.raise_failures(refused, self.what)
        return v.words.view(np.float64)
