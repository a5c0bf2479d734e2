"""Dry run of a tree Plan: its program run by the one symbolic checker, seen as traffic (pure).

`simulate(plan)` lowers the tree Plan to its Program (tree.py: step by step, so a step missing
from the schedule is missing from the program) and runs it with `check.check`, the checker of
every realization: every send meets exactly one receive with the same description, no rank
waits forever, and every receiver ends with exactly the declared tree's expression. The
`Traffic` it returns is that Program's messages per rank and per edge.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model.tree import expression
from .check import check
from .combine_plan import Plan
from .program import Program
from .realize import realize


@dataclass
class Traffic:
    """What `simulate` saw a tree plan move: per rank (lists indexed by rank) the messages and
    payload bytes sent and received, per edge `(phase, index) -> (src, dst, nbytes)`, and the
    expression each receiver ended with (`results`, rank -> text)."""

    size: int
    sent_msgs: list[int] = field(default_factory=list)
    sent_bytes: list[int] = field(default_factory=list)
    recv_msgs: list[int] = field(default_factory=list)
    recv_bytes: list[int] = field(default_factory=list)
    per_edge: dict[tuple[str, int], tuple[int, int, int]] = field(default_factory=dict)
    results: dict[int, str] = field(default_factory=dict)  # rank -> expression it ended with

    def sends(self, rank: int, phase: str | None = None) -> int:
        return sum(1 for (ph, _), (s, _, _) in self.per_edge.items() if s == rank and phase in (None, ph))

    def receives(self, rank: int, phase: str | None = None) -> int:
        return sum(1 for (ph, _), (_, d, _) in self.per_edge.items() if d == rank and phase in (None, ph))

    def table(self) -> str:
        lines = ["traffic:", "  # rank   sent msgs  sent bytes   recv msgs  recv bytes"]
        for r in range(self.size):
            lines.append(
                f"  {r:6d} {self.sent_msgs[r]:11d} {self.sent_bytes[r]:11d} {self.recv_msgs[r]:11d} {self.recv_bytes[r]:11d}"
            )
        lines.append(f"  total {sum(self.sent_msgs):11d} {sum(self.sent_bytes):11d}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        per_rank = ("sent_msgs", "sent_bytes", "recv_msgs", "recv_bytes")
        return {
            **{k: getattr(self, k) for k in per_rank},
            "edges": [
                {"phase": ph, "index": i, "src": s, "dst": d, "nbytes": b}
                for (ph, i), (s, d, b) in sorted(self.per_edge.items())
            ],
        }


def simulate(plan: Plan, program: Program | None = None) -> Traffic:
    """Run a tree `Plan` (from `plan()`) symbolically, every rank in this one process, and
    return its `Traffic`.

    Refuses (`plan-simulation-failed`, with the rank x op grid and the failing rank marked
    `<-- ERROR HERE`) a mismatched or duplicate send, a deadlock, a frame never received, or a
    receiver that would end with another expression than the declared tree (coverage and order
    checked end to end, not only byte counts). A `Program` from `realize` is checked by
    `alpha_mpi.planning.check.check` directly. `program`: the plan's tree realization where
    the caller has it already (`realize(plan, "tree")`: its rank programs are built once).
    """
    prog = realize(plan, "tree") if program is None else program
    check(prog)
    size = plan.size
    t = Traffic(size, [0] * size, [0] * size, [0] * size, [0] * size)
    for r in range(size):
        rp = prog.rank(r)
        for o in rp.ops:
            if o.kind == "S":
                m = rp.messages[o.index]
                t.per_edge[(m.phase, m.index)] = (m.src, m.dst, 8 * m.count)
    for src, dst, nbytes in t.per_edge.values():
        t.sent_msgs[src] += 1
        t.sent_bytes[src] += nbytes
        t.recv_msgs[dst] += 1
        t.recv_bytes[dst] += nbytes
    if plan.receivers:
        text = expression(plan.tree)
        t.results = {r: text for r in sorted(plan.receivers)}
    return t
