"""What a plan is asked for, checked once (pure): the tree planner and every realization start here.

Each check refuses by the code naming that mistake, in a fixed order (the tree itself, the
delivery, the layout, the tree's size, the coverage, the rank count, the owners, the delivery
target), so one bad input gives one code whichever planner was called.
"""

from __future__ import annotations

from collections.abc import Iterable

from .._record import Record
from ..model.coverage import Coverage, check_coverage, default_coverage
from ..model.delivery import DeliverTo, Delivery, ReduceScatter, ReplicateAll, check_delivery
from ..model.layout import Layout, LayoutLike, as_layout
from ..model.tree import Leaf, Node, postorder
from ..refusals import ModelRefusal, PlanRefusal

_set = object.__setattr__  # Records set their fields through it (frozen: _record.py)

# Frames name edges in 32-bit fields and MPI tags must stay under MPI_TAG_UB (>= 32767).
MAX_NODES = 1 << 20


class PlanRequest(Record):
    """A checked request: the tree, its delivery, payload layout, rank count and coverage."""

    __slots__ = ("tree", "delivery", "layout", "size", "coverage", "nodes")
    _norepr = ("tree", "nodes")

    def __init__(
        self,
        tree: Node,
        delivery: Delivery,
        layout: Layout,
        size: int,
        coverage: Coverage,
        nodes: tuple[Node, ...],  # the tree in postorder
    ) -> None:
        _set(self, "tree", tree)
        _set(self, "delivery", delivery)
        _set(self, "layout", layout)
        _set(self, "size", size)
        _set(self, "coverage", coverage)
        _set(self, "nodes", nodes)


def check_size(size: int, what: str = "size") -> int:
    """`size` (a rank count), refused (`plan-size-invalid`) unless an int >= 1."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise PlanRefusal("plan-size-invalid", f"{what} must be an int >= 1, got {size!r}")
    return size


def check_owners(nodes: Iterable[Node], size: int) -> None:
    for node in nodes:
        if node.owner >= size:
            kind = "leaf slot %d" % node.slot if isinstance(node, Leaf) else "a branch"
            raise ModelRefusal(
                "owner-out-of-range",
                f"{kind} is placed on rank {node.owner} but the plan has {size} rank(s)",
                owner=node.owner,
            )


def validate(
    tree: Node,
    delivery: Delivery | None = None,
    layout: LayoutLike = 1,
    *,
    size: int | None = None,
    coverage: Coverage | None = None,
    reduce_scatter: bool = False,
) -> PlanRequest:
    """Check a plan request; `size` defaults to the highest owner + 1, `delivery` to
    ReplicateAll(), `coverage` to the tree's own slots. `reduce_scatter`: ReduceScatter() is a
    delivery here (realizations), not only ReplicateAll() and DeliverTo(rank) (the tree plan)."""
    if not isinstance(tree, Node):
        raise ModelRefusal("tree-malformed", f"expected a Leaf or Branch, got {type(tree).__name__}")
    delivery = ReplicateAll() if delivery is None else delivery
    if not (reduce_scatter and isinstance(delivery, ReduceScatter)):
        check_delivery(delivery)
    layout = as_layout(layout)
    nodes = tuple(postorder(tree))
    if len(nodes) > MAX_NODES:
        raise ModelRefusal("tree-too-large", f"{len(nodes)} nodes exceed the limit of {MAX_NODES}")
    coverage = default_coverage(tree) if coverage is None else coverage
    check_coverage(tree, coverage)
    size = check_size(max(n.owner for n in nodes) + 1 if size is None else size)
    check_owners(nodes, size)
    if isinstance(delivery, DeliverTo) and not any(
        isinstance(n, Leaf) and n.owner == delivery.target for n in nodes
    ):
        raise ModelRefusal(
            "delivery-target-not-owner",
            f"DeliverTo({delivery.target}) names a rank that owns no leaf of this tree",
        )
    return PlanRequest(tree, delivery, layout, size, coverage, nodes)


__all__ = ["PlanRequest", "validate", "check_size", "check_owners", "MAX_NODES"]
