"""The 0.1 name `order_id` where the value is the layout order id (tree order + payload layout).

`order_id` means one thing: the tree's own order id (`Node.order_id`, what a tree's shape, slots
and operation give). Objects that name a combine of a tree *with its payload layout* (plans,
executors, contracts' combines, learners, torch DataParallel) call that `layout_order_id`; their
old attribute `order_id` still answers, with a DeprecationWarning, through `deprecated_order_id`,
until 0.3 removes it (REMOVED_IN).
"""

from __future__ import annotations

import warnings

__all__ = ["deprecated_order_id", "REMOVED_IN"]

REMOVED_IN = "0.3"  # the release without `order_id` (deprecated in 0.2)


def deprecated_order_id(owner: str) -> property:
    """The 0.1 name `order_id` of an object's `layout_order_id`: answers, with a warning."""

    def order_id(self) -> str:
        warnings.warn(
            f"{owner}.order_id is deprecated (0.2; removed in {REMOVED_IN}): it is the layout order id "
            "(tree order + payload layout); use .layout_order_id, or .tree_order_id for the tree's "
            "own order id",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.layout_order_id

    order_id.__doc__ = f"Deprecated: `{owner}.layout_order_id` (the tree's own id is `tree_order_id`)."
    return property(order_id)
