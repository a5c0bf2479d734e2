"""The `tree` realization: reduce up the placed tree, deliver down (any tree; pure).

The tree Plan (combine_plan.py) holds the groups and edges; `lower` writes each rank's program
in the order combine_plan.py's docstring states: the rank's groups in global postorder (wait
for the reduce edges feeding one, evaluate it, the kernel writing an up-going frame's payload
straight into a framed buffer, send it), then the deliver phase (wait for the result from the
parent, relay it down the tree). The Program keeps the tree Plan's identity.
"""

from __future__ import annotations

from collections.abc import Callable

from ..builder import Lowering, RankBuilder, allreduce_only, frame_cost, is_split
from ..combine_plan import Plan
from ..program import Eval, Message, RankProgram

NAME = "tree"


def applies(tp: Plan, mode: str = "allreduce") -> str | None:
    """Any tree, in allreduce mode (the tree's own delivery)."""
    return allreduce_only(NAME, mode)


def lower(tp: Plan, mode: str, receivers: frozenset, segment: int) -> Lowering:
    return Lowering(lower_tree(tp), tree_rounds(tp), identity=tp.identity)


def estimate(tp: Plan, cal, mode: str = "allreduce") -> float:
    """The critical path's hops, a full payload (one frame) moved per hop and added about every
    other one."""
    nb, hops = tp.layout.nbytes, tree_rounds(tp)
    return hops * (cal.alpha + nb * cal.beta + frame_cost(nb, cal)) + max(1, hops // 2) * nb * cal.gamma


def tree_rounds(tp: Plan) -> int:
    """Sequential hops on the tree realization's critical path (reduce up, deliver down)."""
    depth = {}
    producer = {g.output[1]: g.index for g in tp.groups if g.output[0] == "edge"}
    for g in tp.groups:
        d = 0
        for kind, v in g.inputs:
            if kind == "edge":
                d = max(d, depth[producer[v]] + 1)
            elif kind == "group":
                d = max(d, depth[v])
        depth[g.index] = d
    up = max(depth.values(), default=0)
    down: dict = {tp.root_rank: 0}
    for e in tp.edges:
        if e.phase == "d":
            down[e.dst] = down.get(e.src, 0) + 1
    return up + max(down.values(), default=0)


def lower_tree(tp: Plan) -> Callable[[int], RankProgram]:
    """The tree Plan's groups and edges as programs, in the order of the module docstring:
    reduce frames are written by the kernel straight into framed buffers; the deliver phase
    sends the result down the tree."""
    n = tp.layout.total
    key = tp.layout.key()
    seq, count = {}, {}
    for e in tp.edges:  # the k-th frame between a pair in edge order: its MPI tags
        k = (e.src, e.dst)
        seq[e.index] = count.get(k, 0)
        count[k] = seq[e.index] + 1

    def msg(e) -> Message:
        return Message(e.index, e.phase, e.src, e.dst, seq[e.index], n, f"{key}|{e.phase}{e.index}")

    deliver_in, deliver_out = {}, {}  # rank -> its deliver edge in; rank -> its edges out, in order
    for e in tp.edges:
        if e.phase == "d":
            deliver_in[e.dst] = e
            deliver_out.setdefault(e.src, []).append(e)
    # rank -> its groups, in global postorder: one pass here, so that building a rank's program
    # costs what that program holds (every rank's, as `count` builds them, O(p) in all, not O(p²))
    groups_of: dict = {}
    for g in tp.groups:
        groups_of.setdefault(g.rank, []).append(g)

    def build(r: int):
        b = RankBuilder(r, n)
        res = b.out() if r in tp.receivers else None
        group_out, recv_at = {}, {}
        holder = None
        for g in groups_of.get(r, ()):
            for k, x in g.inputs:  # the reduce edges feeding the group, from their senders
                if k == "edge":
                    recv_at[x] = b.recv(msg(tp.edge("r", x)), None)
            kind, v = g.output
            if kind == "edge":
                dest = b.work(n, framed=True)  # the kernel writes the frame's payload
            elif kind == "group":
                dest = b.work(n)
            else:
                dest = res if res is not None else b.work(n, framed=not is_split(n))
                holder = dest
            group_out[g.index] = dest
            inputs = tuple(
                b.leaf(x, n) if k == "leaf" else recv_at[x] if k == "edge" else group_out[x]
                for k, x in g.inputs
            )
            if len(g.program) == 1:
                b.copy(inputs[0], dest)
            else:
                b.eval(Eval(inputs, g.program, dest))
            if kind == "root":
                b.check(dest)
            elif kind == "edge":  # the group's value, up to its parent
                b.send(msg(tp.edge("r", v)), dest)
        if r in deliver_in:  # the result, from the parent
            holder = b.recv(msg(deliver_in[r]), res)
        for e in deliver_out.get(r, ()):
            holder = b.send(msg(e), holder)
        return b.build(tp.slots_of(r), res)

    return build


__all__ = ["NAME", "applies", "lower", "estimate", "lower_tree", "tree_rounds"]
