"""Assembly plans: a full vector built by selection from owners of disjoint coordinate ranges.

No arithmetic: each word comes from exactly the owner that holds it. Overlap and holes are
refused before anything moves. The plan is the pieces, the delivery and the identity; its one
executable form is the Program `lower_assembly(plan)` builds (assembly_program.py), in which
rank r starts the send of each piece it owns to every other receiver, copies its own pieces
into its result where it is a receiver, then waits for every other owner's piece (from that
owner, of exactly that range's size).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from ..model.delivery import DeliverTo, ReplicateAll, check_delivery
from ..refusals import ModelRefusal
from .validate import check_size


@dataclass(frozen=True)
class AssemblyPlan:
    n: int
    size: int
    pieces: tuple[tuple[int, int, int], ...]  # (owner, start, stop), sorted by start
    delivery: ReplicateAll | DeliverTo
    identity: str
    receivers: frozenset[int]

    def describe(self, program=None) -> str:
        """The plan as text: pieces and owners; with `program` (`lower_assembly(plan)`) each
        rank's ops."""
        lines = [
            f"assembly of {self.n} coordinates, {self.delivery!r}",
            f"identity {self.identity}",
            "pieces:",
        ]
        lines += [f"  [{a}, {b}) @r{o}" for o, a, b in self.pieces]
        lines.append(f"receivers {sorted(self.receivers)}")
        if program is not None:
            lines.append("schedule:")
            lines += [f"  r{r}: {program.rank(r).text()}" for r in range(self.size)]
        return "\n".join(lines)


def _pieces(ranges: Iterable[tuple[int, int, int]], n: int, size: int) -> tuple[tuple[int, int, int], ...]:
    items = []
    for item in ranges:
        try:
            owner, start, stop = item
        except (TypeError, ValueError):
            raise ModelRefusal(
                "placement-invalid", f"an assembly piece is (owner, start, stop), got {item!r}"
            )
        for v in (owner, start, stop):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ModelRefusal("placement-invalid", f"assembly piece {item!r} must hold ints")
        if not 0 <= owner < size:
            raise ModelRefusal(
                "owner-out-of-range", f"piece {item!r} names rank {owner} outside 0..{size - 1}"
            )
        if not 0 <= start < stop:
            raise ModelRefusal("data-parallel-assembly-coverage", f"piece {item!r} is empty or negative")
        items.append((owner, start, stop))
    items.sort(key=lambda p: (p[1], p[2], p[0]))
    pos = 0
    for owner, start, stop in items:
        if start < pos:
            raise ModelRefusal(
                "data-parallel-assembly-overlap",
                f"coordinates [{start}, {min(stop, pos)}) are claimed by rank {owner} and by an earlier piece",
                start=start,
            )
        if start > pos:
            raise ModelRefusal(
                "data-parallel-assembly-coverage",
                f"coordinates [{pos}, {start}) have no owner",
                start=pos,
            )
        pos = stop
    if pos != n:
        if pos > n:
            raise ModelRefusal(
                "data-parallel-assembly-coverage", f"pieces reach coordinate {pos} beyond n={n}"
            )
        raise ModelRefusal("data-parallel-assembly-coverage", f"coordinates [{pos}, {n}) have no owner")
    return tuple(items)


def plan_assembly(
    ranges: Iterable[tuple[int, int, int]],
    n: int,
    size: int,
    delivery: ReplicateAll | DeliverTo | None = None,
) -> AssemblyPlan:
    """`ranges`: (owner, start, stop) pieces that must tile 0..n-1 exactly."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ModelRefusal("data-parallel-assembly-coverage", f"need n >= 1 coordinates, got {n!r}")
    check_size(size)
    delivery = ReplicateAll() if delivery is None else delivery
    check_delivery(delivery)
    pieces = _pieces(ranges, n, size)
    if isinstance(delivery, DeliverTo):
        if delivery.target >= size:
            raise ModelRefusal(
                "delivery-target-not-owner", f"DeliverTo({delivery.target}) outside {size} ranks"
            )
        receivers = frozenset([delivery.target])
    else:
        receivers = frozenset(range(size))
    key = ";".join(f"{o}:{a}:{b}" for o, a, b in pieces)
    identity = hashlib.sha256(f"alpha-mpi/assembly/v1\0{n}\0{key}\0{delivery.key()}".encode()).hexdigest()
    return AssemblyPlan(n, size, pieces, delivery, identity, receivers)


def even_ranges(n: int, size: int) -> list[tuple[int, int, int]]:
    """Contiguous ranges, one per rank, sizes differing by at most one (empty ranks dropped)."""
    out = []
    for r in range(size):
        a, b = r * n // size, (r + 1) * n // size
        if b > a:
            out.append((r, a, b))
    return out
