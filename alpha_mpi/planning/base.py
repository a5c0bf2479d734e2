"""What every plan states, whatever realization it describes (pure, frozen).

A tree Plan (combine_plan.py) and every realization's Program (program.py) realize one declared
tree for one delivery, payload layout and rank count; they share these fields, so a reader,
a frame or a contract finds them under one name on any plan:

- `tree_order_id`: the tree's order id (`Node.order_id`: the order of additions, owners erased);
- `layout_order_id`: that order bound to the payload layout. Numerical contracts, learners and
  checkpoints name this one: the same tree over another layout is another combine;
- `identity`: this plan itself (order, placement, delivery, layout, realization and its
  chunking); every frame carries it, so a peer running anything else is refused by name.
"""

from __future__ import annotations

from .._record import Record
from .._sha256 import sha256
from ..model.coverage import Coverage
from ..model.delivery import Delivery
from ..model.deprecation import deprecated_order_id
from ..model.layout import Layout
from ..model.tree import Node
from ..refusals import PlanRefusal


def digest(*parts: str) -> str:
    """sha256 over NUL-separated parts: the one recipe for every plan and realization identity."""
    h = sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


def layout_order_id(tree_order_id: str, layout: Layout) -> str:
    """The declared order bound to a payload layout: what numerical contracts and frames name."""
    return digest("alpha-mpi/order+layout/v1", tree_order_id, layout.key())


class PlanBase(Record):
    """The fields every plan has (see the module docstring). Equality is each kind's own: a
    tree Plan compares by all its fields, a Program (whose builder is code) by identity.
    `receivers`: ranks whose run returns the whole result."""

    # A Record, not a frozen dataclass: a program's first reduction defines it and its two
    # kinds (_record.py: about 1 ms each of generated code; the start-up budget is 20 ms).
    __slots__ = tuple(
        "realization tree delivery layout size coverage topology tree_order_id layout_order_id identity receivers".split()
    )
    _norepr = ("tree",)
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def __init__(
        self,
        realization: str,
        tree: Node,
        delivery: Delivery,
        layout: Layout,
        size: int,
        coverage: Coverage,
        topology: str,
        tree_order_id: str,
        layout_order_id: str,
        identity: str,
        receivers: frozenset[int],
    ) -> None:
        _set = object.__setattr__
        _set(self, "realization", realization)
        _set(self, "tree", tree)
        _set(self, "delivery", delivery)
        _set(self, "layout", layout)
        _set(self, "size", size)
        _set(self, "coverage", coverage)
        _set(self, "topology", topology)
        _set(self, "tree_order_id", tree_order_id)
        _set(self, "layout_order_id", layout_order_id)
        _set(self, "identity", identity)
        _set(self, "receivers", receivers)

    order_id = deprecated_order_id("Plan")

    def check_rank(self, rank: int) -> int:
        """`rank`, refused (`rank-out-of-range`) unless it is an int in 0..size-1."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.size:
            raise PlanRefusal("rank-out-of-range", f"rank {rank!r} is outside a plan for {self.size} ranks")
        return rank

    def header_dict(self) -> dict:
        """The shared fields as JSON-ready values (the start of every plan's `to_dict`)."""
        return {
            "realization": self.realization,
            "topology": self.topology,
            "delivery": repr(self.delivery),
            "layout": self.layout.key(),
            "size": self.size,
            "tree_order_id": self.tree_order_id,
            "layout_order_id": self.layout_order_id,
            "identity": self.identity,
            "receivers": sorted(self.receivers),
        }

    def header_lines(self) -> list:
        """The ids, one line each (shared by every plan's `describe`)."""
        return [
            f"tree order    {self.tree_order_id}",
            f"layout order  {self.layout_order_id}",
            f"identity      {self.identity}",
        ]

    def to_dict(self) -> dict:
        return self.header_dict()

    def to_json(self) -> str:
        import json  # here: a program's first reduction needs no JSON (start-up, issue 42)

        return json.dumps(self.to_dict(), indent=2)


__all__ = ["PlanBase", "digest", "layout_order_id"]
