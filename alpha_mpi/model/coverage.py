"""Coverage: which contributions a tree must combine, each exactly once.

A missing, duplicated or unknown leaf is refused by name even when the byte totals would match
(a duplicated slot in place of a missing one moves the same number of bytes).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Union

from ..refusals import ModelRefusal
from .tree import Node, leaf_sequence

__all__ = ["OrderedMembers", "ParticipantGroup", "default_coverage", "check_coverage", "Coverage"]


def _as_slots(members: Iterable[int], what: str) -> tuple[int, ...]:
    try:
        slots = tuple(members)
    except TypeError:
        raise ModelRefusal("coverage-invalid", f"{what} needs an iterable of slots, got {members!r}")
    for s in slots:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ModelRefusal("coverage-invalid", f"{what} members must be non-negative ints, got {s!r}")
    return slots


class OrderedMembers:
    """An explicit slot list; the tree's left-to-right leaf sequence must equal it."""

    def __init__(self, members: Iterable[int]) -> None:
        self.members = _as_slots(members, "OrderedMembers")
        dup = [s for s, c in Counter(self.members).items() if c > 1]
        if dup:
            raise ModelRefusal("coverage-invalid", f"OrderedMembers lists slots {dup[:5]} twice")

    def key(self) -> str:
        """Canonical text form (what plan digests include)."""
        return "ordered:" + ",".join(map(str, self.members))

    def __repr__(self):
        return f"OrderedMembers({list(self.members)})"

    def __eq__(self, other):
        return isinstance(other, OrderedMembers) and self.members == other.members

    def __hash__(self):
        return hash(self.members)


class ParticipantGroup:
    """A compact membership (e.g. `range(10)`); every member exactly once, in any order."""

    def __init__(self, members: Iterable[int]) -> None:
        if isinstance(members, range) and members.step != 1:
            raise ModelRefusal("coverage-invalid", "ParticipantGroup ranges must have step 1")
        self.members = frozenset(_as_slots(members, "ParticipantGroup"))

    def key(self) -> str:
        """Canonical text form (what plan digests include)."""
        return "group:" + ",".join(map(str, sorted(self.members)))

    def __repr__(self):
        ms = sorted(self.members)
        if ms and ms == list(range(ms[0], ms[-1] + 1)):
            return f"ParticipantGroup(range({ms[0]}, {ms[-1] + 1}))"
        return f"ParticipantGroup({ms})"

    def __eq__(self, other):
        return isinstance(other, ParticipantGroup) and self.members == other.members

    def __hash__(self):
        return hash(self.members)


def default_coverage(tree: Node) -> ParticipantGroup:
    """Slots 0..n-1 for an n-leaf tree: a duplicate then always leaves some slot missing."""
    return ParticipantGroup(range(tree.leaves))


def check_coverage(tree: Node, coverage: Coverage | None) -> None:
    """Refuse unless the tree's leaves are exactly the declared members (and order, if ordered)."""
    if coverage is None:
        coverage = default_coverage(tree)
    if not isinstance(coverage, (OrderedMembers, ParticipantGroup)):
        raise ModelRefusal("coverage-invalid", f"unknown coverage {coverage!r}")
    seq = [leaf.slot for leaf in leaf_sequence(tree)]
    counts = Counter(seq)
    dups = sorted(s for s, c in counts.items() if c > 1)
    if dups:
        raise ModelRefusal(
            "coverage-duplicate-leaf",
            f"slot(s) {dups[:8]} appear more than once in the tree (expected each exactly once)",
            slots=dups,
        )
    members = set(coverage.members)
    unknown = sorted(set(seq) - members)
    if unknown:
        raise ModelRefusal(
            "coverage-unknown-leaf",
            f"slot(s) {unknown[:8]} are leaves but not members of {coverage!r}",
            slots=unknown,
        )
    missing = sorted(members - set(seq))
    if missing:
        raise ModelRefusal(
            "coverage-missing-leaf",
            f"member slot(s) {missing[:8]} have no leaf in the tree",
            slots=missing,
        )
    if isinstance(coverage, OrderedMembers) and tuple(seq) != coverage.members:
        first = next(i for i, (a, b) in enumerate(zip(seq, coverage.members)) if a != b)
        raise ModelRefusal(
            "coverage-order-mismatch",
            f"leaf #{first} is slot {seq[first]} but OrderedMembers declares slot "
            f"{coverage.members[first]} there",
            position=first,
        )


#: A declared coverage: the members in order, or a group whose order the tree states.
Coverage = Union[OrderedMembers, ParticipantGroup]
