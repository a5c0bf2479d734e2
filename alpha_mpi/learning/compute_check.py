"""The compute identity in a learner's first agreement: ranks compute alike, or the learner knows
where they do not (DESIGN.md "The same bits on every machine").

A learner (DataParallelLearner, alpha_mpi.torch.DataParallel, `alpha-mpi train --model`'s probe)
reads its rank's compute identity (alpha_mpi.kernel.compute_identity) when it is built and puts
into its numerical contract what its slots' bits depend on (`compute_spec`): the identity's
compared fields, or `MachineIndependent` when the model declares `machine_independent = True`
(it computes only with alpha_mpi's fixed-order functions) or the caller promises it
(`machine_independent=True`). The ranks then compare, inside the learner's first agreement round
(same_start.agree), the declaration and one item per compared field (`ComputeCheck.items`):

- machine-dependent: ranks whose fields differ are refused on every rank, `compute-mismatch`,
  naming the ranks and the field (`field=`), before anything trains;
- machine-independent: the field items are recorded, never refused; `RankIdentities` then says
  which ranks compute alike, so the audit and the replica digests tell an environment difference
  (a promise that does not hold) from a fault, and never blame a rank for the former.

Ranks that declare differently (one promises, another does not) are refused too: the
declaration is the first item.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..model.compute import COMPARED, ComputeIdentity, MachineIndependent
from ..refusals import Refusal
from .same_start import Holding, Item, agree, text_values

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["compute_spec", "uses_torch", "ComputeCheck", "RankIdentities"]


def compute_spec(
    identity: ComputeIdentity, model: object = None, machine_independent: bool = False
) -> ComputeIdentity | MachineIndependent:
    """What a learner's contract says its slots depend on: `MachineIndependent("model")` when the
    model declares `machine_independent = True`, `MachineIndependent("caller")` when the caller
    promises it, else the identity's compared fields."""
    if not isinstance(machine_independent, bool):
        raise Refusal("usage", f"machine_independent must be True or False, got {machine_independent!r}")
    if getattr(model, "machine_independent", False) is True:
        return MachineIndependent("model")
    if machine_independent:
        return MachineIndependent("caller")
    return identity.compared()


def uses_torch(model: object) -> bool:
    """Whether a numpy-protocol model computes its slots with torch, so that the identity has
    torch's fields: the model says so with `uses_torch = True` (alpha_mpi.torch.ModuleModel
    does). Imports neither torch nor alpha_mpi.torch."""
    return getattr(model, "uses_torch", False) is True


class RankIdentities:
    """What the agreement learned: which ranks compute alike.

    `classes[r]`: rank r's identity class (0 is rank 0's; ranks of one class hold every compared
    field alike); `texts[field][r]`: the field's text on rank r (at most 64 bytes of it)."""

    def __init__(self, fields: Sequence[str], held: Sequence[Holding]) -> None:
        self.fields = tuple(fields)
        self.texts = {f: h.shown for f, h in zip(self.fields, held)}
        size = len(held[0].groups) if held else 1
        keys = [tuple(h.groups[r] for h in held) for r in range(size)]
        first: dict[tuple, int] = {}
        for k in keys:
            first.setdefault(k, len(first))
        self.classes = tuple(first[k] for k in keys)

    @classmethod
    def alone(cls) -> RankIdentities:
        """One rank (or ranks known to compute alike): one class."""
        return cls((), ())

    @property
    def uniform(self) -> bool:
        """Every rank holds the same compute identity."""
        return max(self.classes) == 0

    def same(self, a: int, b: int) -> bool:
        """Ranks a and b compute alike."""
        return self.classes[a] == self.classes[b]

    def explain(self, ranks: Sequence[int]) -> str:
        """The compared fields that differ among `ranks`, e.g. `blas.kernel: rank 0 'Haswell',
        rank 1 'Sandybridge'`; "" when they compute alike."""
        parts = []
        for f in self.fields:
            t = self.texts[f]
            if len({t[r] for r in ranks}) > 1:
                parts.append(f"{f}: " + ", ".join(f"rank {r} {t[r]!r}" for r in ranks))
        return "; ".join(parts)


class ComputeCheck:
    """One rank's side of the comparison: its `identity` and the contract's `spec`; `items()` go
    into the learner's first agreement, `record(held)` reads what it learned into `ranks`."""

    def __init__(self, identity: ComputeIdentity, spec: ComputeIdentity | MachineIndependent) -> None:
        self.identity, self.spec = identity, spec
        self.fields = [f for f in COMPARED if identity.get(f) is not None]
        self.ranks = RankIdentities.alone()

    @classmethod
    def for_model(cls, model: object, machine_independent: bool = False) -> ComputeCheck:
        """The check of a numpy-protocol model on this rank: the live identity (with torch's
        fields for a ModuleModel) and `compute_spec(identity, model, machine_independent)`."""
        from .. import kernel

        identity = kernel.compute_identity(torch=uses_torch(model))
        return cls(identity, compute_spec(identity, model, machine_independent))

    @property
    def dependent(self) -> bool:
        """The slots' bits depend on the identity (ranks must match)."""
        return isinstance(self.spec, ComputeIdentity)

    def items(self) -> list[Item]:
        """The declaration, then one item per compared field (refused when dependent)."""
        said = "machine-dependent" if self.dependent else self.spec.describe()
        out = [
            Item("the machine-independence declarations", text_values(said), "compute-mismatch", shown=said)
        ]
        code = "compute-mismatch" if self.dependent else None
        for f in self.fields:
            text = self.identity.get(f) or ""
            out.append(Item(f"the compute identities ({f})", text_values(text), code, shown=text, field=f))
        return out

    def record(self, held: Sequence[Holding]) -> None:
        """Read the items' holdings (in `items()` order) into `ranks`."""
        self.ranks = RankIdentities(self.fields, list(held)[1 : 1 + len(self.fields)])

    def alike(self, ranks: Sequence[int]) -> bool:
        """Whether `ranks` compute alike (after `record`)."""
        return len({self.ranks.classes[r] for r in ranks}) == 1

    def agree(self, comm: MPI.Comm, *, what: str, timeout: float | None = None) -> RankIdentities:
        """Collective: the comparison as a round of its own (a learner whose first agreement is
        elsewhere, e.g. torch DataParallel's); returns `ranks`."""
        if comm.Get_size() > 1:
            self.record(agree(comm, self.items(), what=what, timeout=timeout))
        return self.ranks

    def broken_promise(self, ranks: Sequence[int], what: str, after: str = "", **context: object) -> Refusal:
        """`compute-mismatch` for `what` (results) that differ between `ranks` whose identities
        differ, although the contract says machine-independent: the declaration does not hold, and
        no rank is blamed for it. `after`: a sentence appended (what was left undone)."""
        return Refusal(
            "compute-mismatch",
            f"{what} differ between ranks {', '.join(map(str, ranks))}, whose compute identities differ "
            f"({self.ranks.explain(ranks)}); the contract says {self.spec.describe()}, which does not "
            f"hold for this model: an environment difference, not a fault, so no rank or host is blamed{after}",
            ranks=tuple(ranks),
            promise=getattr(self.spec, "declared_by", None),
            **context,
        )
