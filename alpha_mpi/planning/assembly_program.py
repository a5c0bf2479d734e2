"""An assembly plan lowered to the one program format, so the one engine runs it (pure).

Assembly is selection, no arithmetic: rank r's program sends each piece it owns to every other
receiver (S, from the piece itself, `L<i>` for piece i of the plan), copies its own pieces into
`out` where it is a receiver (C), and receives every other owner's piece into its `out` region
(W). The frames are the assembly frames (phase "assemble", topology "assembly", order
"selection", identity the plan's, layout `range:a:b`, message index piece-index * size +
receiver), sent with the engine's tags and failure path.
"""

from __future__ import annotations

from ..model.layout import Layout
from .assembly import AssemblyPlan
from .builder import RankBuilder
from .program import Message, Program, RankProgram

ORDER = "selection"  # what assembly frames name as their order: no arithmetic, selection only


def _lower(ap: AssemblyPlan):
    size, receivers = ap.size, sorted(ap.receivers)
    msgs = []  # every message of the plan, in piece order, then receiver order
    seq: dict = {}
    for i, (owner, a, b) in enumerate(ap.pieces):
        for dst in receivers:
            if dst == owner:
                continue
            s = seq.get((owner, dst), 0)
            seq[(owner, dst)] = s + 1
            msgs.append((i, Message(i * size + dst, "a", owner, dst, s, b - a, f"range:{a}:{b}")))

    def build(r: int) -> RankProgram:
        rb = RankBuilder(r, ap.n)
        mine = [i for i, (o, _, _) in enumerate(ap.pieces) if o == r]
        for i, m in msgs:
            if m.src == r:
                rb.send(m, RankBuilder.leaf(i, m.count))
        if r in ap.receivers:
            for i in mine:
                _, a, b = ap.pieces[i]
                rb.copy(RankBuilder.leaf(i, b - a), rb.out(a, b - a))
        for i, m in msgs:
            if m.dst == r:
                _, a, b = ap.pieces[i]
                rb.recv(m, rb.out(a, b - a))
        rp = rb.build(mine, rb.out() if r in ap.receivers else None)
        counts = {i: ap.pieces[i][2] - ap.pieces[i][1] for i in mine}
        return rp.replace(inputs=counts)

    return build


def lower_assembly(ap: AssemblyPlan) -> Program:
    """The Program of an assembly plan: rank r passes its pieces as slots (the plan's piece
    indices it owns, each of its own length) and, where it is a receiver, ends with the whole
    vector in `out`."""
    return Program(
        realization="assembly",
        tree=None,
        delivery=ap.delivery,
        layout=Layout.vector(ap.n),
        size=ap.size,
        coverage=None,
        topology="assembly",
        tree_order_id=ORDER,
        layout_order_id=ORDER,
        identity=ap.identity,
        receivers=ap.receivers,
        builder=_lower(ap),
        rounds=1,
        details={"pieces": [list(p) for p in ap.pieces]},
    )


__all__ = ["lower_assembly"]
