"""The units of `DataParallel(..., partition="params")`: which parameters are gathered together.

A unit is a submodule whose trainable parameters are gathered (assembled by selection from the
ranks' shards) just before its forward runs and again for its backward, and freed in between
(alpha_mpi.torch.gather_schedule). Which submodules are units, in this order:

1. the list the caller passes (`units=[...]`: submodules, or their names in
   `module.named_modules()`; a name the module does not have is refused by name,
   `torch-units-unknown`, on every rank: the check runs before the first agreement round);
2. else the elements of every `nn.ModuleList` (transformer blocks), outermost lists only;
3. else the module's children that hold trainable parameters.

Every trainable parameter outside the units, and every parameter reachable from more than one
unit (a tied weight: nanoGPT ties the token embedding and the head), belongs to the **root**:
gathered once at the start of a slot and kept until the slot's backward is done. A tied weight
is therefore gathered once for both of its uses, and its gradient is the one torch accumulates
over both (the same as `partition="none"`). Units run in the order of the list (their forward
order): the schedule of gathers is the same on every rank (it is collective), whatever the
data do, so a unit that runs out of that order is refused (`torch-units-order`).

Pure: no communication, no tensors created; `UnitPlan.of` runs on each rank alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..refusals import Refusal

__all__ = ["Unit", "UnitPlan"]


@dataclass(frozen=True)
class Unit:
    """One unit: its name in the module, the submodule, and its parameters' indices in
    `DataParallel.params` (flat order)."""

    name: str
    module: object
    members: tuple[int, ...]


@dataclass(frozen=True)
class UnitPlan:
    """The units in forward order and the `root` parameters (indices in `DataParallel.params`),
    gathered for a whole slot."""

    units: tuple[Unit, ...]
    root: tuple[int, ...]

    @classmethod
    def of(cls, module, params: list, units=None) -> UnitPlan:
        """The plan of `module` whose trainable parameters are `params` (see the module)."""
        named = list(module.named_modules())
        chosen = _given(module, named, units) if units is not None else _default(module, named)
        where = {id(p): i for i, p in enumerate(params)}
        reach: dict[int, list[int]] = {}  # parameter -> the units it is reachable from
        for k, (_, m) in enumerate(chosen):
            for p in m.parameters():
                if id(p) in where:
                    reach.setdefault(where[id(p)], []).append(k)
        out = []
        for k, (name, m) in enumerate(chosen):
            members = tuple(sorted(i for i, ks in reach.items() if ks == [k]))
            if members:  # a unit left without parameters (all tied away) needs no gather
                out.append(Unit(name, m, members))
        held = {i for u in out for i in u.members}
        root = tuple(i for i in range(len(params)) if i not in held)
        return cls(tuple(out), root)

    def sizes(self, params: list) -> tuple[int, list[int]]:
        """Elements of the root and of each unit."""
        count = lambda idx: sum(params[i].numel() for i in idx)  # noqa: E731
        return count(self.root), [count(u.members) for u in self.units]


def _given(module, named, units) -> list:
    if isinstance(units, str) or not hasattr(units, "__iter__"):
        raise Refusal("usage", f"units is a list of submodules or their names, got {units!r}")
    by_name = dict(named)
    by_id = {id(m): k for k, m in named}
    chosen = []
    for u in units:
        if isinstance(u, str):
            if u not in by_name or u == "":
                near = [k for k in by_name if k and (u in k or k in u)][:4]
                raise Refusal(
                    "torch-units-unknown",
                    f"units names {u!r}, which is not a submodule of {type(module).__name__}"
                    + (f" (near: {near})" if near else ""),
                    unit=u,
                )
            chosen.append((u, by_name[u]))
        elif id(u) in by_id and by_id[id(u)] != "":
            chosen.append((by_id[id(u)], u))
        else:
            raise Refusal(
                "torch-units-unknown",
                f"units holds a {type(u).__name__} that is not a submodule of {type(module).__name__}",
                unit=type(u).__name__,
            )
    names = [n for n, _ in chosen]
    for a in names:
        for b in names:
            if a != b and b.startswith(a + "."):
                raise Refusal("usage", f"units {a!r} and {b!r} nest; a unit is gathered whole: give one")
    if len(set(names)) != len(names):
        raise Refusal("usage", f"units names a submodule twice: {names}")
    return chosen


def _default(module, named) -> list:
    lists = [
        (k, m)
        for k, m in named
        if any(c.__name__ == "ModuleList" for c in type(m).__mro__) and len(list(m.parameters()))
    ]
    outer = [(k, m) for k, m in lists if not any(k.startswith(o + ".") for o, _ in lists if o != k)]
    chosen = [
        (f"{k}.{j}", e)
        for k, m in outer
        for j, e in enumerate(m)
        if any(p.requires_grad for p in e.parameters())
    ]
    if chosen:
        return chosen
    return [(k, m) for k, m in module.named_children() if any(p.requires_grad for p in m.parameters())]
