"""Assembly plans: a full vector built by selection from owners of disjoint coordinate ranges.

No arithmetic: each word comes from exactly the owner that holds it. Overlap and holes are
refused before anything moves. Protocol: every rank posts its `aR` receives (from the named
owner, of exactly that range's size), copies its own ranges, starts its `aS` sends, then waits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from ..model.delivery import DeliverTo, ReplicateAll, check_delivery
from ..refusals import ModelRefusal
from .steps import Edge, Step
from .validate import check_size


@dataclass(frozen=True)
class AssemblyPlan:
    n: int
    size: int
    pieces: tuple[tuple[int, int, int], ...]  # (owner, start, stop), sorted by start
    delivery: ReplicateAll | DeliverTo
    identity: str
    edges: tuple  # Edge(index, "a", src, dst, nbytes)
    programs: tuple
    receivers: frozenset[int]

    def piece_of_edge(self, index: int) -> tuple[int, int, int]:
        return self.pieces[index // self.size]

    def describe(self) -> str:
        lines = [
            f"assembly of {self.n} coordinates, {self.delivery!r}",
            f"identity {self.identity}",
            "pieces:",
        ]
        lines += [f"  [{a}, {b}) @r{o}" for o, a, b in self.pieces]
        lines.append("schedule:")
        for r, steps in enumerate(self.programs):
            lines.append(f"  r{r}: " + (" ".join(map(str, steps)) if steps else "(idle)"))
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
    edges, recvs, sends = [], [[] for _ in range(size)], [[] for _ in range(size)]
    for i, (owner, start, stop) in enumerate(pieces):
        for dst in sorted(receivers):
            if dst == owner:
                continue
            e = Edge(i * size + dst, "a", owner, dst, 8 * (stop - start))
            edges.append(e)
            recvs[dst].append(Step("R", e.index, "a", owner, e.nbytes))
            sends[owner].append(Step("S", e.index, "a", dst, e.nbytes))
    key = ";".join(f"{o}:{a}:{b}" for o, a, b in pieces)
    identity = hashlib.sha256(f"alpha-mpi/assembly/v1\0{n}\0{key}\0{delivery.key()}".encode()).hexdigest()
    programs = tuple(tuple(recvs[r] + sends[r]) for r in range(size))
    return AssemblyPlan(n, size, pieces, delivery, identity, tuple(edges), programs, receivers)


def even_ranges(n: int, size: int) -> list[tuple[int, int, int]]:
    """Contiguous ranges, one per rank, sizes differing by at most one (empty ranks dropped)."""
    out = []
    for r in range(size):
        a, b = r * n // size, (r + 1) * n // size
        if b > a:
            out.append((r, a, b))
    return out
