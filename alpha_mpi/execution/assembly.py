"""Assembly over MPI: the full vector built by selection from owners of disjoint ranges.

No arithmetic: every word is copied from exactly the owner that holds it. The plan
(planning/assembly.py) has already refused overlaps and holes; it is lowered to a Program
(planning/assembly_program.py) that the one engine runs, with the engine's frames, tags,
bounded waits and failure path. This module only checks the caller's pieces.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..planning.assembly import AssemblyPlan
from ..planning.assembly_program import lower_assembly
from ..refusals import Refusal
from .engine import Engine
from .frames import FLAG_VOTE


class Assembler:
    """Assembles one AssemblyPlan repeatedly. Build it on every rank of `comm` (collectively:
    its build agreement is one verdict round; `dup` as Engine's). `.engine` is the Engine that
    runs it."""

    def __init__(
        self,
        comm: MPI.Comm,
        aplan: AssemblyPlan,
        *,
        timeout: float | None = None,
        contract: str = "",
        dup: bool = True,
    ) -> None:
        # A plan for another rank count is refused by the Engine inside its build agreement
        # (`plan-rank-mismatch` there, `peer-refused` on ranks whose plan fits), never here
        # alone, so no rank is left waiting for a build that does not come.
        self.plan = aplan
        self.program = lower_assembly(aplan)
        self.engine = Engine(
            comm, self.program, timeout=timeout, contract=contract, dup=dup, what="Assembler"
        )
        self.rank = rank = self.engine.rank
        self.comm = self.engine.comm
        self.prepared = self.engine.prepare()  # every run goes through it
        self.timeout = self.engine.timeout  # seconds one wait may take (as before: the Waiter's)
        # (start, stop) -> the program's slot (the piece's index in the plan)
        self._slot = {(a, b): i for i, (o, a, b) in enumerate(aplan.pieces) if o == rank}
        self.own = list(self._slot)
        self.flags = 0

    @property
    def step(self) -> int:
        """Runs so far (the frames' step)."""
        return self.prepared.step

    @property
    def send_hook(self):
        """The engine's fault-injection hook (Engine.send_hook), for tests and verification."""
        return self.engine.send_hook

    @send_hook.setter
    def send_hook(self, hook) -> None:
        self.engine.send_hook = hook

    @property
    def broken(self) -> str | None:
        """The refusal code that broke the executor (None while it is usable)."""
        return self.engine.broken

    def run(
        self,
        pieces: dict[tuple[int, int], np.ndarray],
        out: np.ndarray | None = None,
        flags: int = 0,
        refused: Refusal | None = None,
    ) -> np.ndarray | None:
        """`pieces` maps (start, stop) -> float64 array for every range this rank owns.

        Returns the full vector on receivers, else None (an `out` array is then left untouched).
        `flags` (0 or 1) travels in this rank's frame headers; afterwards `self.flags` is the OR
        of this rank's and every received frame's flags: a one-bit vote riding on the data.
        `out`: a writeable float64 vector of n elements (where given, on any rank).
        `refused`: this rank's refusal of whatever its pieces were to come from (they are then
        not read): it travels as the flag below, so every rank names it.

        Bad pieces on one rank do not leave the others waiting: that rank sends zeros in frames
        flagged with its rank and code, every rank completes the round, then it raises its own
        refusal and every rank its frames reached raises `peer-refused` naming it (a receiver's
        `out` is then unspecified). The next run works.
        """
        local = refused if refused is not None else self._refusal_of(pieces, out, flags)
        leaves = None
        if local is None:
            # C reads a piece through `double *`: a misaligned or non-contiguous one is copied
            leaves = {
                self._slot[r]: v if v.flags.c_contiguous and v.flags.aligned else np.array(v, order="C")
                for r, v in pieces.items()
            }
        elif not self._out_ok(out):
            out = None
        self.flags = 0
        try:
            got = self.prepared.run_checked(leaves, out, refused=local, vote=flags if local is None else 0)
        finally:
            self.flags = 1 if self.prepared.flags & FLAG_VOTE else 0
        return got

    def _out_ok(self, out) -> bool:
        return out is None or (
            isinstance(out, np.ndarray)
            and out.dtype == np.float64
            and out.shape == (self.plan.n,)
            and out.flags.writeable
            and out.flags.c_contiguous
        )

    def _refusal_of(self, pieces, out, flags):
        """The Refusal this rank's arguments earn (None when they are what it owns, an `out` it
        can write the whole vector to, and a one-bit vote)."""
        if not self._out_ok(out):
            return Refusal("out-invalid", f"out must be a writeable float64 vector of {self.plan.n} elements")
        if flags not in (0, 1):
            return Refusal("usage", f"flags is a one-bit vote (0 or 1), got {flags!r}")
        if not isinstance(pieces, dict):
            return Refusal(
                "contributions-not-mapping",
                f"pieces must be a dict (start, stop) -> array, got {type(pieces).__name__}",
            )
        missing = [r for r in self.own if r not in pieces]
        extra = [r for r in pieces if r not in self.own]
        if missing or extra:
            return Refusal(
                "contribution-missing" if missing else "contribution-unexpected",
                f"rank {self.rank} owns ranges {self.own}, got {list(pieces)}",
            )
        for (a, b), v in pieces.items():
            if not isinstance(v, np.ndarray) or v.dtype != np.float64 or v.shape != (b - a,):
                return Refusal(
                    "contribution-shape", f"range [{a}, {b}) needs a float64 vector of {b - a} values"
                )
        return None

    def free(self) -> None:
        """Free the persistent requests and give the executor's tags back (local)."""
        self.engine.free()


def assemble(
    comm: MPI.Comm,
    aplan: AssemblyPlan,
    pieces: dict[tuple[int, int], np.ndarray],
    out: np.ndarray | None = None,
    *,
    timeout: float | None = None,
) -> np.ndarray | None:
    """One-shot assembly (builds an Assembler, runs it once and frees it: all ranks call)."""
    asm = Assembler(comm, aplan, timeout=timeout)
    try:
        return asm.run(pieces, out=out)
    finally:
        asm.free()
