"""Where the combined value goes after the reduction.

Each delivery is a frozen value: equal when its fields are, hashable, and `key()` is the canonical
text form that plan digests include.
"""

from __future__ import annotations

from typing import Union

from .._record import Record
from ..refusals import ModelRefusal

__all__ = ["ReplicateAll", "DeliverTo", "ReduceScatter", "check_delivery", "Delivery"]


# Records, not frozen dataclasses: a program's first reduction defines them (_record.py).


class ReplicateAll(Record):
    """Send the result back down the tree so every owner in the tree holds it."""

    __slots__ = ()

    def key(self) -> str:
        """Canonical text form (what plan digests include)."""
        return "replicate-all"


class DeliverTo(Record):
    """Send the result from the root down the tree path to one leaf owner only.

    Forwarders on the path relay the value; every other owner's value is left as it was.
    Refused (`delivery-invalid`): a `target` that is not a rank (an int >= 0).
    """

    __slots__ = ("target",)

    def __init__(self, target: int) -> None:
        if isinstance(target, bool) or not isinstance(target, int) or target < 0:
            raise ModelRefusal("delivery-invalid", f"DeliverTo needs a rank >= 0, got {target!r}")
        object.__setattr__(self, "target", target)

    def key(self) -> str:
        """Canonical text form (what plan digests include)."""
        return f"deliver-to:{self.target}"

    def __repr__(self):
        return f"DeliverTo({self.target})"


class ReduceScatter(Record):
    """Keep each reduced chunk at its owner: rank r ends with its chunk only (the learners' mode)."""

    __slots__ = ()

    def key(self) -> str:
        """Canonical text form (what plan digests include)."""
        return "reduce-scatter"


def check_delivery(delivery: object) -> None:
    """Refuse (`delivery-invalid`) anything but ReplicateAll() or DeliverTo(rank) (the tree plan's
    deliveries; a realization that takes ReduceScatter() checks for it before calling this)."""
    if not isinstance(delivery, (ReplicateAll, DeliverTo)):
        raise ModelRefusal("delivery-invalid", f"unknown delivery {delivery!r}")


#: Any delivery: every owner gets the result, one rank does, or each keeps its chunk.
Delivery = Union[ReplicateAll, DeliverTo, ReduceScatter]
