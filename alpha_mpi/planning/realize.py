"""Realizations of one declared tree, lowered to the one program format (pure): the registry.

Every realization of a tree gives the tree's bits and shares its order id; each has its own
identity (named by every frame), so a peer running another realization is refused by name.
Each lives in its own module in planning/realizations/ (its docstring lists them), which says
whether it applies, lowers it and models its cost. `realize(tree_plan, name)` looks the module
up and builds the Program; `applicable(tree_plan)` lists every name with None or the reason it
does not apply.
"""

from __future__ import annotations

from types import MappingProxyType, ModuleType

from ..model.coverage import Coverage
from ..model.delivery import DeliverTo, Delivery, ReduceScatter, ReplicateAll
from ..model.layout import LayoutLike
from ..model.tree import Node
from ..refusals import PlanRefusal, Refusal
from .base import digest
from .combine_plan import Plan
from .combine_plan import plan as plan_tree
from .program import Program
from .realizations import butterfly, halving, replicate, scatter
from .realizations import tree as tree_realization
from .realizations.scatter import DEFAULT_SEGMENT

#: name -> module (NAME, applies, lower, estimate), in the order listings show them.
REGISTRY: MappingProxyType[str, ModuleType] = MappingProxyType(
    {m.NAME: m for m in (tree_realization, scatter, replicate, butterfly, halving)}
)
REALIZATIONS = tuple(REGISTRY)
# Realizations that can stop after their reduce-scatter half (the learners' grads/params modes).
REDUCE_SCATTER = ("halving", "scatter")


def as_tree_plan(
    tree: Node | Plan,
    delivery: ReplicateAll | DeliverTo | None = None,
    layout: LayoutLike = 1,
    *,
    size: int | None = None,
    coverage: Coverage | None = None,
) -> Plan:
    """A tree Plan (validation once: tree, coverage, owners, delivery, layout)."""
    if isinstance(tree, Plan):
        return tree
    return plan_tree(tree, delivery, layout, size=size, coverage=coverage)


def _check_name(name: str) -> None:
    if name not in REGISTRY:
        raise Refusal(
            "usage", f"realization must be one of {', '.join(REALIZATIONS)} (or auto), got {name!r}"
        )


def applicable(tp: Plan, mode: str = "allreduce") -> dict[str, str | None]:
    """name -> None if it applies to this tree plan, else the reason it does not."""
    return {name: m.applies(tp, mode) for name, m in REGISTRY.items()}


def realize(
    tree: Node | Plan,
    name: str,
    *,
    delivery: Delivery | None = None,
    layout: LayoutLike | None = None,
    size: int | None = None,
    coverage: Coverage | None = None,
    mode: str = "allreduce",
    segment: int | None = None,
) -> Program:
    """Lower one realization of `tree` (a Node with layout/size, or a tree Plan) to a Program.
    `mode`: "allreduce" (the plan's delivery) or "reduce-scatter" (rank r ends with chunks[r]);
    `delivery=ReduceScatter()` is the same as mode="reduce-scatter". Refuses a realization that
    does not apply (`realization-inapplicable`, naming those that do)."""
    _check_name(name)
    if isinstance(delivery, ReduceScatter):
        delivery, mode = None, "reduce-scatter"
    if isinstance(tree, Plan) and delivery is not None and delivery != tree.delivery:
        tree = plan_tree(tree.tree, delivery, tree.layout, size=tree.size, coverage=tree.coverage)
    tp = as_tree_plan(tree, delivery, 1 if layout is None else layout, size=size, coverage=coverage)
    if mode not in ("allreduce", "reduce-scatter"):
        raise Refusal("usage", f"mode must be allreduce or reduce-scatter, got {mode!r}")
    module = REGISTRY[name]
    why = module.applies(tp, mode)
    if why is not None:
        ok = [k for k, v in applicable(tp, mode).items() if v is None]
        raise PlanRefusal(
            "realization-inapplicable",
            f"{why}; realizations that apply here: {', '.join(ok)}",
            realization=name,
            applicable=ok,
        )
    if segment is None:
        segment = DEFAULT_SEGMENT
    if isinstance(segment, bool) or not isinstance(segment, int) or segment < 1:
        raise PlanRefusal("segment-invalid", f"segment must be an int >= 1 (elements), got {segment!r}")
    receivers = frozenset() if mode == "reduce-scatter" else tp.receivers
    delivery = ReduceScatter() if mode == "reduce-scatter" else tp.delivery
    low = module.lower(tp, mode, receivers, segment)
    identity = low.identity or digest(
        "alpha-mpi/realization/v1", tp.tree.identity, delivery.key(), tp.layout.key(), name, mode, low.extra
    )
    return Program(
        realization=name,
        tree=tp.tree,
        delivery=delivery,
        layout=tp.layout,
        size=tp.size,
        coverage=tp.coverage,
        topology=tp.topology,
        tree_order_id=tp.tree_order_id,
        layout_order_id=tp.layout_order_id,
        identity=identity,
        receivers=receivers,
        builder=low.builder,
        mode=mode,
        chunks=low.chunks,
        rounds=low.rounds,
        details=low.details,
    )


def plan_scatter(
    tree: Node | Plan,
    delivery: Delivery | None = None,
    layout: LayoutLike = 1,
    *,
    size: int | None = None,
    coverage: Coverage | None = None,
    segment: int | None = None,
) -> Program:
    """The scatter realization of `tree` (a Node, or a tree Plan whose tree, layout, size and
    coverage are reused): `realize(tree, "scatter", ...)`. `delivery`: ReplicateAll() (default),
    DeliverTo(rank), or ReduceScatter() (rank r keeps chunk r of the result)."""
    return realize(
        tree, "scatter", delivery=delivery, layout=layout, size=size, coverage=coverage, segment=segment
    )


__all__ = [
    "REALIZATIONS",
    "REDUCE_SCATTER",
    "realize",
    "plan_scatter",
    "applicable",
    "as_tree_plan",
    "REGISTRY",
    "DeliverTo",
]
