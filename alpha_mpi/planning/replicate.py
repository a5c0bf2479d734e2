"""The `replicate` realization: allgather the top's operands, every rank evaluates the top (pure).

After pre-evaluation every rank gathers every operand of the top by a Bruck allgather (round
k: send what it has to rank r - 2^k, receive from r + 2^k; ceil(log2 p) rounds for any p), then
evaluates the whole top itself in one fused pass. Any tree; for small payloads.
"""

from __future__ import annotations

from collections.abc import Callable

from ..model.layout import Layout
from ..model.tree import Node
from .builder import Lowering, RankBuilder, allreduce_only, frame_cost
from .combine_plan import Plan
from .operands import lower_expression, operands, operands_by_rank, pre_evaluate, slots_of_operands
from .program import Message, RankProgram

NAME = "replicate"


def applies(tp: Plan, mode: str = "allreduce") -> str | None:
    """Any tree, in allreduce mode."""
    return allreduce_only(NAME, mode)


def lower(tp: Plan, mode: str, receivers: frozenset, segment: int) -> Lowering:
    builder = lower_replicate(tp.tree, tp.layout, tp.size, receivers)
    return Lowering(builder, (tp.size - 1).bit_length())


def estimate(tp: Plan, cal, mode: str = "allreduce") -> float:
    """ceil(log2 p) rounds of one frame each; every operand moved to and added at every rank."""
    nb, ops = tp.layout.nbytes, len(operands(tp.tree))
    rounds = (tp.size - 1).bit_length()
    return rounds * (cal.alpha + frame_cost(nb, cal)) + nb * (ops - 1) * (cal.beta + cal.gamma)


def bruck_rounds(size: int) -> list:
    """(distance, ranks carried) per round of the Bruck allgather."""
    out, d = [], 1
    while d < size:
        out.append((d, min(d, size - d)))
        d *= 2
    return out


def lower_replicate(
    tree: Node, layout: Layout, size: int, receivers: frozenset[int]
) -> Callable[[int], RankProgram]:
    n = layout.total
    key = layout.key()
    ops = operands(tree)
    by_rank = operands_by_rank(ops, size)
    counts = [len(x) for x in by_rank]
    rounds = bruck_rounds(size)
    place = {id(o.node): i for mine_q in by_rank for i, o in enumerate(mine_q)}  # within its rank

    def build(r: int):
        b = RankBuilder(r, n)
        rot = [(r + i) % size for i in range(size)]  # gather order: me, r+1, r+2, ...
        start, pos = {}, 0
        for q in rot:
            start[q] = pos
            pos += counts[q]
        total = pos
        g = b.work(max(total, 1) * n, framed=True)
        mine = by_rank[r]
        pre_evaluate(b, mine, n, [g.sub((start[r] + i) * n, n) for i in range(len(mine))])
        have = 1  # ranks r .. r+have-1 (rotation positions 0..have-1) are in g
        for k, (d, carried) in enumerate(rounds):
            to, frm = (r - d) % size, (r + d) % size
            cnt_out = sum(counts[(r + i) % size] for i in range(carried))
            cnt_in = sum(counts[(frm + i) % size] for i in range(carried))
            m_out = Message(k * size + r, "o", r, to, 0, cnt_out * n, f"{key}|o{k}x{carried}")
            m_in = Message(k * size + frm, "o", frm, r, 0, cnt_in * n, f"{key}|o{k}x{carried}")
            b.send(m_out, g.sub(0, cnt_out * n) if cnt_out else None)
            b.recv(m_in, g.sub(start[frm] * n, cnt_in * n) if cnt_in else None)
            have += carried
        if r not in receivers:
            return b.build(slots_of_operands(mine), None)
        region_of = {id(o.node): g.sub((start[o.owner] + place[id(o.node)]) * n, n) for o in ops}
        res = b.out()
        if len(ops) == 1:
            b.copy(region_of[id(ops[0].node)], res)
        else:
            for ev in lower_expression(tree, lambda nd: region_of.get(id(nd)), res, lambda c: b.work(c)):
                b.eval(ev)
        b.check(res)
        return b.build(slots_of_operands(mine), res)

    return build


__all__ = ["NAME", "applies", "lower", "estimate", "lower_replicate", "bruck_rounds"]
