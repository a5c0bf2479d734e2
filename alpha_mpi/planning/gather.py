"""Realizations for any tree: `replicate` (allgather the top's operands) and `scatter` (pure).

- replicate: after pre-evaluation every rank gathers every operand of the top by a Bruck
  allgather (round k: send what it has to rank r - 2^k, receive from r + 2^k; ceil(log2 p)
  rounds for any p), then evaluates the whole top itself in one fused pass. For small payloads.
- scatter: the payload's coordinates are cut into one chunk per rank (`chunk_bounds`), chunks
  into segments; rank o sends, for every chunk c and segment, the pieces of all its operands in
  one frame to rank c, which evaluates the whole top over its chunk; chunks are then gathered by
  the receivers (or kept: the reduce-scatter, whose flags then travel in header-only rounds).
"""

from __future__ import annotations

from collections.abc import Callable

from ..model.layout import Layout
from ..model.tree import Leaf, Node, leaf_sequence
from .builder import RankBuilder, is_split
from .operands import lower_expression, operands
from .program import Message, RankProgram

DEFAULT_SEGMENT = 1 << 16  # elements per scatter frame (512 KiB): transfer, add and copies pipeline


def chunk_bounds(n: int, size: int) -> tuple[tuple[int, int], ...]:
    """Contiguous chunks of 0..n-1, one per rank, sizes differing by at most one."""
    q, r = divmod(n, size)
    return tuple((c * q + min(c, r), c * q + min(c, r) + q + (1 if c < r else 0)) for c in range(size))


def _pre_evaluate(b: RankBuilder, ops, n: int, dests) -> list:
    """Write each of this rank's operands into its destination Region (or use the leaf itself
    when `dests[i]` is None); returns the Regions holding the operand values."""
    out = []
    for op, dest in zip(ops, dests):
        if isinstance(op.node, Leaf):
            leaf = b.leaf(op.node.slot, n)
            if dest is not None:
                b.copy(leaf, dest)
            out.append(dest or leaf)
            continue
        target = dest or b.work(n)
        for ev in lower_expression(
            op.node,
            lambda nd: b.leaf(nd.slot, n) if isinstance(nd, Leaf) else None,
            target,
            lambda c: b.work(c),
        ):
            b.eval(ev)
        out.append(target)
    return out


def _slots_of(ops) -> tuple:
    return tuple(leaf.slot for op in ops for leaf in leaf_sequence(op.node))


def _flag_rounds(b: RankBuilder, r: int, size: int, base_index: int, key: str, seq_of) -> None:
    """Dissemination rounds of header-only frames: after ceil(log2 p) rounds every rank has
    every rank's flags (round k: send to r + 2^k, receive from r - 2^k)."""
    k, d = 0, 1
    while d < size:
        to, frm = (r + d) % size, (r - d) % size
        b.send(Message(base_index + k * size + r, "f", r, to, seq_of(k, r, to), 0, f"{key}|f{k}"), None)
        b.recv(Message(base_index + k * size + frm, "f", frm, r, seq_of(k, frm, r), 0, f"{key}|f{k}"), None)
        k, d = k + 1, d * 2


def bruck_rounds(size: int) -> list:
    """(distance, ranks carried) per round of the Bruck allgather."""
    out, d = [], 1
    while d < size:
        out.append((d, min(d, size - d)))
        d *= 2
    return out


def region_of_node(region_of: dict):
    """The input-region lookup of one evaluation (bound now, not to a loop variable)."""
    return lambda node: region_of.get(id(node))


def lower_replicate(
    tree: Node, layout: Layout, size: int, receivers: frozenset[int]
) -> Callable[[int], RankProgram]:
    n = layout.total
    key = layout.key()
    ops = operands(tree)
    by_rank = [[o for o in ops if o.owner == r] for r in range(size)]
    counts = [len(x) for x in by_rank]
    rounds = bruck_rounds(size)

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
        _pre_evaluate(b, mine, n, [g.sub((start[r] + i) * n, n) for i in range(len(mine))])
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
            return b.build(_slots_of(mine), None)
        region_of = {id(o.node): g.sub(start[o.owner] * n + by_rank[o.owner].index(o) * n, n) for o in ops}
        res = b.out()
        if len(ops) == 1:
            b.copy(region_of[id(ops[0].node)], res)
        else:
            for ev in lower_expression(tree, lambda nd: region_of.get(id(nd)), res, lambda c: b.work(c)):
                b.eval(ev)
        b.check(res)
        return b.build(_slots_of(mine), res)

    return build


def lower_scatter(
    tree: Node, layout: Layout, size: int, receivers: frozenset[int], mode: str, segment: int
) -> tuple[Callable[[int], RankProgram], tuple[tuple[int, int], ...]]:
    n = layout.total
    key = layout.key()
    ops = operands(tree)
    by_rank = [[o for o in ops if o.owner == r] for r in range(size)]
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
        values = _pre_evaluate(b, mine, n, [None] * len(mine))
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
            _flag_rounds(b, r, size, base_flags, key, seq_flags)
            return b.build(_slots_of(mine), acc.sub(lo, hi - lo))
        if r not in receivers:
            return b.build(_slots_of(mine), None)
        for i in range(1, size):
            c = (r - i) % size
            for j, (a, z) in enumerate(segs[c]):
                b.recv(
                    Message(gather_index(c, r, j), "g", c, r, nseg + j, z - a, f"{key}|g{a}:{z}"),
                    acc.sub(a, z - a),
                )
        return b.build(_slots_of(mine), acc)

    return build, chunks
