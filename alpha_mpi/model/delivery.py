"""Where the combined value goes after the reduction."""

from __future__ import annotations

from ..refusals import ModelRefusal

__all__ = ["ReplicateAll", "DeliverTo", "ReduceScatter", "check_delivery"]


class ReplicateAll:
    """Send the result back down the tree so every owner in the tree holds it."""

    def key(self) -> str:
        """Canonical text form (what plan digests include)."""
        return "replicate-all"

    def __repr__(self):
        return "ReplicateAll()"

    def __eq__(self, other):
        return isinstance(other, ReplicateAll)

    def __hash__(self):
        return hash("replicate-all")


class DeliverTo:
    """Send the result from the root down the tree path to one leaf owner only.

    Forwarders on the path relay the value; every other owner's value is left as it was.
    """

    def __init__(self, target: int):
        if isinstance(target, bool) or not isinstance(target, int) or target < 0:
            raise ModelRefusal("delivery-invalid", f"DeliverTo needs a rank >= 0, got {target!r}")
        self.target = target

    def key(self) -> str:
        """Canonical text form (what plan digests include)."""
        return f"deliver-to:{self.target}"

    def __repr__(self):
        return f"DeliverTo({self.target})"

    def __eq__(self, other):
        return isinstance(other, DeliverTo) and self.target == other.target

    def __hash__(self):
        return hash(("deliver-to", self.target))


class ReduceScatter:
    """Keep each reduced chunk at its owner: rank r ends with its chunk only (the learners' mode)."""

    def key(self) -> str:
        return "reduce-scatter"

    def __repr__(self):
        return "ReduceScatter()"

    def __eq__(self, other):
        return isinstance(other, ReduceScatter)

    def __hash__(self):
        return hash("reduce-scatter")


def check_delivery(delivery) -> None:
    """Refuse (`delivery-invalid`) anything but a delivery of this module."""
    if not isinstance(delivery, (ReplicateAll, DeliverTo)):
        raise ModelRefusal("delivery-invalid", f"unknown delivery {delivery!r}")
