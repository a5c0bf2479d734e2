"""Dry-run simulator: executes every rank's steps symbolically, in one process.

Checks that every send meets exactly one matching receive (same phase, edge, peers and size),
that no rank waits forever (sends are non-blocking, receives block, as in execution/), and that
every receiver ends with exactly the declared tree's expression: coverage and order checked end
to end, not only by counting bytes. Counts traffic per rank and per edge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from ..model.tree import Leaf, expression, postorder
from ..refusals import PlanRefusal
from .combine_plan import Plan
from .steps import Step


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


def grid(
    programs: Sequence[Sequence[Step]], pcs: Sequence[int] | None, failing_rank: int | None = None
) -> str:
    """The rank x step grid, each rank's current step marked; the failing one with ERROR HERE."""
    lines = []
    for r, steps in enumerate(programs):
        cells = []
        for i, s in enumerate(steps):
            mark = "*" if pcs is not None and i == pcs[r] else ""
            cells.append(f"{mark}{s}")
        tail = "  <-- ERROR HERE" if r == failing_rank else ""
        lines.append(f"  r{r}: " + (" ".join(cells) if cells else "(idle)") + tail)
    return "\n".join(lines)


def _fail(message: str, plan: Plan, pcs: Sequence[int], rank: int | None = None) -> NoReturn:
    raise PlanRefusal("plan-simulation-failed", message + "\n" + grid(plan.programs, pcs, rank))


def simulate(plan: Plan) -> Traffic:
    """Run a tree `Plan` (from `plan()`) symbolically, every rank in this one process, and
    return its `Traffic`.

    Sends are non-blocking and receives block, as in execution/. Every send must meet exactly one
    receive of the same phase, edge, peers and size; every group is evaluated by its owner after
    its inputs arrived; every receiver must end with the declared tree's expression (coverage
    and order checked end to end, not only byte counts). Refuses (`plan-simulation-failed`,
    with the rank x step grid and the failing rank marked) a mismatched or duplicate send, a
    deadlock, a frame never received, a wrong expression at a receiver, or a root rank that
    never evaluates the root. Takes the tree realization only: a `Program` from `realize` is
    checked by `alpha_mpi.planning.check.check`.
    """
    size = plan.size
    edges = {(e.phase, e.index): e for e in plan.edges}
    groups = plan.groups
    inflight = {}
    received = [dict() for _ in range(size)]  # rank -> {(phase, edge): value}
    gvalue = {}
    result = {}
    pcs = [0] * size
    ids: dict = {}
    producer = {g.output[1]: g for g in groups if g.output[0] == "edge"}  # edge -> the group sending it
    t = Traffic(size, [0] * size, [0] * size, [0] * size, [0] * size)

    def run(r) -> bool:
        steps = plan.programs[r]
        progressed = False
        while pcs[r] < len(steps):
            s = steps[pcs[r]]
            if s.kind == "E":
                g = groups[s.index]
                if g.rank != r:
                    _fail(f"rank {r} evaluates group {g.index} owned by rank {g.rank}", plan, pcs, r)
                stack = []
                for op in g.program:
                    if op == -1:
                        b, a = stack.pop(), stack.pop()
                        stack.append(ids.setdefault((a, b), len(ids)))
                        continue
                    kind, v = g.inputs[op]
                    if kind == "leaf":
                        stack.append(ids.setdefault(("L", v), len(ids)))
                    elif kind == "edge":
                        if ("r", v) not in received[r]:
                            _fail(f"rank {r} evaluates g{g.index} before receiving edge {v}", plan, pcs, r)
                        stack.append(received[r][("r", v)])
                    else:
                        if v not in gvalue:
                            _fail(f"rank {r} uses group {v} before evaluating it", plan, pcs, r)
                        stack.append(gvalue[v])
                if len(stack) != 1:
                    _fail(f"group {g.index} program leaves {len(stack)} values", plan, pcs, r)
                gvalue[g.index] = stack[0]
                if g.output[0] == "root":
                    result[r] = stack[0]
            elif s.kind == "S":
                e = edges.get((s.phase, s.index))
                if e is None or e.src != r or e.dst != s.peer or e.nbytes != s.nbytes:
                    _fail(f"rank {r} step {s} does not match the edge table", plan, pcs, r)
                if (s.phase, s.index) in inflight or (s.phase, s.index) in t.per_edge:
                    _fail(f"edge {s.phase}{s.index} sent twice", plan, pcs, r)
                if s.phase == "r":
                    g = producer.get(s.index)
                    if g is None or g.index not in gvalue:
                        _fail(f"rank {r} sends edge {s.index} before computing it", plan, pcs, r)
                    value = gvalue[g.index]
                else:
                    if r not in result and ("d", None) not in received[r]:
                        _fail(f"rank {r} forwards a result it does not hold", plan, pcs, r)
                    value = result.get(r, received[r].get(("d", None)))
                inflight[(s.phase, s.index)] = (r, s.peer, s.nbytes, value)
                t.per_edge[(s.phase, s.index)] = (r, s.peer, s.nbytes)
                t.sent_msgs[r] += 1
                t.sent_bytes[r] += s.nbytes
            elif s.kind == "R":
                msg = inflight.get((s.phase, s.index))
                if msg is None:
                    return progressed  # blocked: wait for the peer
                src, dst, nbytes, value = msg
                if src != s.peer or dst != r or nbytes != s.nbytes:
                    _fail(f"rank {r} step {s} meets a frame from {src} to {dst} of {nbytes}B", plan, pcs, r)
                del inflight[(s.phase, s.index)]
                received[r][(s.phase, s.index)] = value
                if s.phase == "d":
                    received[r][("d", None)] = value
                t.recv_msgs[r] += 1
                t.recv_bytes[r] += s.nbytes
            pcs[r] += 1
            progressed = True
        return progressed

    while any(pcs[r] < len(plan.programs[r]) for r in range(size)):
        if not any([run(r) for r in range(size)]):
            stuck = next(r for r in range(size) if pcs[r] < len(plan.programs[r]))
            _fail("deadlock: every unfinished rank waits for a frame nobody sends", plan, pcs, stuck)
    if inflight:
        _fail(f"frames sent but never received: {sorted(inflight)}", plan, pcs)

    # Expressions are interned (a branch is the id of its operand pair): comparing with the
    # declared tree is O(1) per rank and memory stays linear, never O(n^2) strings.
    node_id = {}
    for node in postorder(plan.tree):
        node_id[id(node)] = (
            ids.setdefault(("L", node.slot), len(ids))
            if isinstance(node, Leaf)
            else ids.setdefault((node_id[id(node.left)], node_id[id(node.right)]), len(ids))
        )
    want = node_id[id(plan.tree)]
    text = None
    for r in range(size):
        got = result.get(r) if r == plan.root_rank else received[r].get(("d", None))
        if r in plan.receivers:
            if got != want:
                _fail(
                    f"rank {r} would end with another expression than the declared {expression(plan.tree)}",
                    plan,
                    pcs,
                    r,
                )
            text = text or expression(plan.tree)
            t.results[r] = text
    if plan.root_rank not in result:
        _fail(f"root rank {plan.root_rank} never evaluates the root", plan, pcs, plan.root_rank)
    return t
