"""The `scatter` realization: each chunk's whole tree at one rank, chunks gathered (any tree; pure).

The payload's coordinates are cut into one chunk per rank (`chunk_bounds`), chunks into
segments; rank o sends, for every chunk c and segment, the pieces of all its operands in one
frame to rank c, which evaluates the whole top over its chunk; chunks are then gathered by the
receivers (or kept: the reduce-scatter, whose flags then travel in header-only rounds).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from ..model.layout import Layout
from ..model.tree import Node
from .builder import Lowering, RankBuilder, frame_cost, is_split
from .combine_plan import Plan
from .operands import lower_expression, operands, operands_by_rank, pre_evaluate, slots_of_operands
from .program import Message, RankProgram

NAME = "scatter"
DEFAULT_SEGMENT = 1 << 16  # elements per scatter frame (512 KiB): transfer, add and copies pipeline


def applies(tp: Plan, mode: str = "allreduce") -> str | None:
    """Any tree, in both modes."""
    return None


def lower(tp: Plan, mode: str, receivers: frozenset, segment: int) -> Lowering:
    n, p = tp.layout.total, tp.size
    builder, chunks = lower_scatter(tp.tree, tp.layout, p, receivers, mode, segment)
    rounds = 2 if mode == "allreduce" else 1 + (p - 1).bit_length()
    extra = f"segment={segment};chunks=" + ",".join(f"{a}:{b}" for a, b in chunk_bounds(n, p))
    return Lowering(
        builder, rounds, chunks if mode == "reduce-scatter" else None, extra, {"segment": segment}
    )


def estimate(tp: Plan, cal, mode: str = "allreduce") -> float:
    """Two rounds of p-1 messages each (pieces out, chunks gathered); each rank's operands'
    pieces out, its chunk's pieces in."""
    p, nb = tp.size, tp.layout.nbytes
    ops = operands(tp.tree)
    k_max = max(Counter(o.owner for o in ops).values(), default=1)
    part = nb * (p - 1) / p
    gather = part if mode == "allreduce" else 0.0
    latency = 2 * cal.alpha + (2 * (p - 1) - 2) * cal.alpha_msg
    frames = (p - 1) * (k_max + (1 if mode == "allreduce" else 0)) * frame_cost(nb / p, cal)
    return latency + (part * k_max + gather) * cal.beta + nb / p * (len(ops) - 1) * cal.gamma + frames


def chunk_bounds(n: int, size: int) -> tuple[tuple[int, int], ...]:
    """Contiguous chunks of 0..n-1, one per rank, sizes differing by at most one."""
    q, r = divmod(n, size)
    return tuple((c * q + min(c, r), c * q + min(c, r) + q + (1 if c < r else 0)) for c in range(size))


def flag_rounds(b: RankBuilder, r: int, size: int, base_index: int, key: str, seq_of) -> None:
    """Dissemination rounds of header-only frames: after ceil(log2 p) rounds every rank has
    every rank's flags (round k: send to r + 2^k, receive from r - 2^k)."""
    k, d = 0, 1
    while d < size:
        to, frm = (r + d) % size, (r - d) % size
        b.send(Message(base_index + k * size + r, "f", r, to, seq_of(k, r, to), 0, f"{key}|f{k}"), None)
        b.recv(Message(base_index + k * size + frm, "f", frm, r, seq_of(k, frm, r), 0, f"{key}|f{k}"), None)
        k, d = k + 1, d * 2


def region_of_node(region_of: dict):
    """The input-region lookup of one evaluation (bound now, not to a loop variable)."""
    return lambda node: region_of.get(id(node))


def lower_scatter(
    tree: Node, layout: Layout, size: int, receivers: frozenset[int], mode: str, segment: int
) -> tuple[Callable[[int], RankProgram], tuple[tuple[int, int], ...]]:
    n = layout.total
    key = layout.key()
    ops = operands(tree)
    by_rank = operands_by_rank(ops, size)
    chunks = chunk_bounds(n, size)
    segs = [[(a, min(a + segment, hi)) for a in range(lo, hi, segment)] for lo, hi in chunks]
    nseg = max((len(s) for s in segs), default=0)
    # Message numbering: pieces first (owner o, chunk c, segment j), then gathers, then flags.
    base_gather = size * size * nseg
    base_flags = 2 * base_gather

    def piece_index(o, c, j):
        return (o * size + c) * nseg + j

    def gather_index(c, t, j):
        return base_gather + (c * size + t) * nseg + j

    def seq_flags(k, src, dst):
        # after the piece (and gather) frames of the pair, one per round
        return 2 * nseg + k

    def build(r: int):
        b = RankBuilder(r, n)
        mine = by_rank[r]
        values = pre_evaluate(b, mine, n, [None] * len(mine))
        # 1. pieces of my operands to every other chunk owner, segment by segment
        for j in range(nseg):
            for i in range(1, size):
                c = (r + i) % size
                if j >= len(segs[c]) or not mine:
                    continue
                a, z = segs[c][j]
                m = z - a
                msg = Message(
                    piece_index(r, c, j), "s", r, c, j, m * len(mine), f"{key}|s{a}:{z}x{len(mine)}"
                )
                if len(mine) == 1:
                    b.send(msg, values[0].sub(a, m))
                else:
                    frame = b.work(m * len(mine), framed=not is_split(m * len(mine)))
                    for i2, v in enumerate(values):
                        b.copy(v.sub(a, m), frame.sub(i2 * m, m))
                    b.send(msg, frame)
        # 2. my chunk: receive every other owner's pieces, evaluate the top per segment
        whole = mode == "allreduce" and r in receivers
        acc = b.out() if whole else b.work(n)
        for j, (a, z) in enumerate(segs[r]):
            m = z - a
            region_of = {id(o.node): values[i].sub(a, m) for i, o in enumerate(mine)}
            for i in range(1, size):
                o = (r + i) % size
                theirs = by_rank[o]
                if not theirs:
                    continue
                msg = Message(
                    piece_index(o, r, j), "s", o, r, j, m * len(theirs), f"{key}|s{a}:{z}x{len(theirs)}"
                )
                got = b.recv(msg, None)
                for i2, op in enumerate(theirs):
                    region_of[id(op.node)] = got.sub(i2 * m, m)
            dest = acc.sub(a, m)
            if len(ops) == 1:
                b.copy(region_of[id(ops[0].node)], dest)
            else:
                for ev in lower_expression(tree, region_of_node(region_of), dest, b.work):
                    b.eval(ev)
            b.check(dest)
            if mode == "allreduce":
                for t in sorted(receivers, key=lambda t: (t - r) % size):
                    if t != r:
                        b.send(
                            Message(gather_index(r, t, j), "g", r, t, nseg + j, m, f"{key}|g{a}:{z}"), dest
                        )
        lo, hi = chunks[r]
        if mode == "reduce-scatter":
            flag_rounds(b, r, size, base_flags, key, seq_flags)
            return b.build(slots_of_operands(mine), acc.sub(lo, hi - lo))
        if r not in receivers:
            return b.build(slots_of_operands(mine), None)
        for i in range(1, size):
            c = (r - i) % size
            for j, (a, z) in enumerate(segs[c]):
                b.recv(
                    Message(gather_index(c, r, j), "g", c, r, nseg + j, z - a, f"{key}|g{a}:{z}"),
                    acc.sub(a, z - a),
                )
        return b.build(slots_of_operands(mine), acc)

    return build, chunks


__all__ = [
    "NAME",
    "applies",
    "lower",
    "estimate",
    "chunk_bounds",
    "lower_scatter",
    "flag_rounds",
    "DEFAULT_SEGMENT",
]
