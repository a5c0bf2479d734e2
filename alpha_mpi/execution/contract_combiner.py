"""Executing a combine under a numerical contract (layer 4: binds the numerics to the executor).

Was `alpha_mpi.numerics.execute` (0.1): execution-level code kept beside the numerics it binds,
which made the numerics package straddle two layers; it lives with the executor it uses now.

`ContractCombiner(comm, plan, contract)` authorizes the contract for the plan in this process
(profile, live FP environment, order id, relation and evidence), then builds a Combiner whose
every frame carries the contract digest, so a peer running another contract is refused
(`frame-contract-mismatch`, naming the contract). Each run applies the contract's conversion
site to the contributions (KeepFormat; WidenBinary32; or RoundBinary64 then WidenBinary32 in the
kernel, into buffers allocated once) and combines the binary64 results by the declared tree.

FiniteOrRefuse through a conversion site: a NaN contribution, or a finite one that rounds beyond
binary32, does not refuse before communication (a peer would be left waiting); the IEEE value
(NaN or +-Inf) travels, and the Combiner refuses by name on every receiver after communication
has completed (`non-finite-contribution` where the value was, `non-finite-combined` elsewhere).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..numerics.authorization import authorize
from ..numerics.conversion import convert_contribution
from ..refusals import KernelRefusal
from .allreducer import Combiner
from .contributions import require_mapping

if TYPE_CHECKING:
    from mpi4py import MPI

    from ..execution.contributions import Contributions
    from ..model.contract import NumericalContract
    from ..planning import Plan

__all__ = ["ContractCombiner"]


class ContractCombiner:
    """A Combiner bound to a numerical contract. Build it on every rank of `comm`.

    Takes the plan, the contract (authorized here for the plan: refused by name when it may not
    execute), and the Combiner's `timeout` and `dup`. `run(contributions, out=None)` converts
    this rank's contributions at the contract's site and combines them (Combiner.run's return
    value); `free()` releases the communicator.
    """

    def __init__(
        self,
        comm: MPI.Comm,
        plan: Plan,
        contract: NumericalContract | dict,
        *,
        timeout: float | None = None,
        dup: bool = True,
    ) -> None:
        self.contract = authorize(contract, plan=plan)
        self.plan = plan
        self.kinds = self.contract.profile.site("contribution")
        self.combiner = Combiner(comm, plan, timeout=timeout, contract=self.contract.digest, dup=dup)
        self.rank = self.combiner.rank
        n = plan.layout.total
        self._out = {s: np.empty(n) for s in self.combiner.slots}
        self._s32 = {s: np.empty(n, dtype=np.float32) for s in self.combiner.slots}

    @property
    def step(self) -> int:
        """The Combiner's step counter (runs completed)."""
        return self.combiner.step

    def _flat(self, value):
        if isinstance(value, tuple):
            dt = np.float32 if self.kinds == ("WidenBinary32",) else np.float64
            return np.concatenate([np.ravel(np.asarray(p, dtype=dt)) for p in value])
        return value

    def run(self, contributions: Contributions, out: np.ndarray | None = None) -> np.ndarray | None:
        """Convert this rank's contributions at the contract's site, then combine them."""
        if self.kinds == ("KeepFormat",):
            return self.combiner.run(contributions, out=out)
        require_mapping(contributions)
        converted, overflow = {}, {}
        for slot, value in contributions.items():
            x = self._flat(value)
            buf = self._out.get(slot)
            if buf is None or getattr(x, "size", None) != buf.size:
                converted[slot] = x  # let the Combiner refuse it by name (unexpected slot, shape)
                continue
            converted[slot], bad = convert_contribution(
                self.kinds, x, buf, self._s32[slot], passthrough_nonfinite=True
            )
            if bad >= 0:
                overflow[slot] = (bad, float(np.ravel(x)[bad]))
        try:
            return self.combiner.run(converted, out=out)
        except KernelRefusal as e:
            slot = e.context.get("slot")
            if e.code == "non-finite-contribution" and slot in overflow:
                i, v = overflow[slot]
                raise KernelRefusal(
                    "non-finite-contribution",
                    f"slot {slot} element {i} = {v!r} rounds beyond binary32's range at the RoundBinary64 "
                    f"site (step {self.combiner.step - 1}); nothing was applied",
                    slot=slot,
                    index=i,
                ) from e
            raise

    def free(self) -> None:
        """Release the Combiner's communicator and requests (collective)."""
        self.combiner.free()
