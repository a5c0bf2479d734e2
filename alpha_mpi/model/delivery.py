"""Where the combined value goes after the reduction.

Each delivery is a frozen value: equal when its fields are, hashable, and `key()` is the canonical
text form that plan digests include.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ..refusals import ModelRefusal

__all__ = ["ReplicateAll", "DeliverTo", "ReduceScatter", "check_delivery", "Delivery"]


@dataclass(frozen=True)
class ReplicateAll:
    """Send the result back down the tree so every owner in the tree holds it."""

    def key(self) -> str:
        """Canonical text form (what plan digests include)."""
        return "replicate-all"


@dataclass(frozen=True, repr=False)
class DeliverTo:
    """Send the result from the root down the tree path to one leaf owner only.

    Forwarders on the path relay the value; every other owner's value is left as it was.
    Refused (`delivery-invalid`): a `target` that is not a rank (an int >= 0).
    """

    target: int

    def __post_init__(self):
        t = self.target
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ModelRefusal("delivery-invalid", f"DeliverTo needs a rank >= 0, got {t!r}")

    def key(self) -> str:
        """Canonical text form (what plan digests include)."""
        return f"deliver-to:{self.target}"

    def __repr__(self):
        return f"DeliverTo({self.target})"


@dataclass(frozen=True)
class ReduceScatter:
    """Keep each reduced chunk at its owner: rank r ends with its chunk only (the learners' mode)."""

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
