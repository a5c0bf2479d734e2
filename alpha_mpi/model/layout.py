"""Payload layout: named binary64 components combined by the same tree.

A leaf may carry e.g. `numerator` (a gradient sum, a vector) and `mass` (a sample count). They
travel in one contiguous payload and are added coordinate by coordinate in the declared order;
normalisation (numerator / mass) is the learner's job, done once after the combine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Union

from ..refusals import ModelRefusal

__all__ = ["Layout", "as_layout", "LayoutLike"]


class Layout:
    """The named binary64 components of one payload, in the order they travel.

    `Layout(("numerator", 1000), ("mass", 1))` (or one list of such pairs): each component a
    (identifier, element count >= 1) pair, each name once. `Layout.vector(n)` is one component
    `x`; `Layout.weighted(n)` is `numerator[n]` + `mass[1]`. Attributes: `components` (the
    pairs), `offsets` (name -> (start, end) in the flat payload), `total` (elements), `nbytes`.
    Immutable, hashable, equal by components. Refuses anything else with `layout-invalid`.
    """

    __slots__ = ("components", "total", "offsets")
    components: tuple[tuple[str, int], ...]
    total: int
    offsets: dict[str, tuple[int, int]]

    def __init__(self, *components: tuple[str, int] | Sequence[tuple[str, int]]) -> None:
        if (
            len(components) == 1
            and isinstance(components[0], (list, tuple))
            and components[0]
            and isinstance(components[0][0], (list, tuple))
        ):
            components = tuple(components[0])
        if not components:
            raise ModelRefusal("layout-invalid", "a layout needs at least one component")
        comps = []
        names = set()
        for c in components:
            try:
                name, count = c
            except (TypeError, ValueError):
                raise ModelRefusal("layout-invalid", f"component {c!r} is not a (name, count) pair")
            if not isinstance(name, str) or not name or not name.isidentifier():
                raise ModelRefusal("layout-invalid", f"component name {name!r} must be an identifier")
            if name in names:
                raise ModelRefusal("layout-invalid", f"component {name!r} appears twice")
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ModelRefusal(
                    "layout-invalid", f"component {name!r} count must be an int >= 1, got {count!r}"
                )
            names.add(name)
            comps.append((name, count))
        object.__setattr__(self, "components", tuple(comps))
        offsets = {}
        off = 0
        for name, count in comps:
            offsets[name] = (off, off + count)
            off += count
        object.__setattr__(self, "offsets", offsets)
        object.__setattr__(self, "total", off)

    def __setattr__(self, name, value):
        raise AttributeError("Layout is immutable")

    @classmethod
    def vector(cls, n: int) -> Layout:
        """One component `x` of n coordinates."""
        return cls(("x", n))

    @classmethod
    def weighted(cls, n: int, mass: int = 1) -> Layout:
        """A gradient sum of n coordinates plus its sample-count mass."""
        return cls(("numerator", n), ("mass", mass))

    @property
    def nbytes(self) -> int:
        """Bytes of one payload (8 per binary64 element)."""
        return 8 * self.total

    def key(self) -> str:
        """Canonical text form, `name:count,...` (what plan and frame digests include)."""
        return ",".join(f"{n}:{c}" for n, c in self.components)

    def __repr__(self):
        return "Layout(" + ", ".join(f"({n!r}, {c})" for n, c in self.components) + ")"

    def __eq__(self, other):
        return isinstance(other, Layout) and self.components == other.components

    def __hash__(self):
        return hash(self.components)


def as_layout(layout: LayoutLike) -> Layout:
    """`layout` itself, or `Layout.vector(n)` for an element count n; refuses anything else."""
    if isinstance(layout, Layout):
        return layout
    if isinstance(layout, int) and not isinstance(layout, bool):
        return Layout.vector(layout)
    raise ModelRefusal("layout-invalid", f"expected a Layout or an element count, got {layout!r}")


#: What every `layout=` argument takes: a Layout, or an element count (a one-vector layout).
LayoutLike = Union[Layout, int]
