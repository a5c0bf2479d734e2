"""The butterfly realizations of a balanced rank-level top: `butterfly` and `halving` (pure).

Applicability: after pre-evaluation each of the p = 2^L ranks holds exactly one operand, and
every branch of the top joins two aligned rank blocks [b, b + 2^h) and [b + 2^h, b + 2^(h+1))
(in either order). The `pairwise` tree over a power-of-two slot count in contiguous blocks on a
power-of-two rank count has this shape. In round k a rank and its partner r ^ 2^k hold the values
of the two children of one branch; both compute left + right in the declared operand order, so
both hold the same bits without any assumption on the arithmetic.

- butterfly (recursive doubling): L rounds, each rank sends its whole current value.
- halving (recursive halving reduce-scatter, then recursive doubling allgather): in round k of
  the first half the pair splits its current coordinate range, each keeps one half and sends the
  other: after L rounds rank r holds the declared value of its chunk only (`chunks[r]`). The
  second half doubles the held ranges back. 2L rounds, 2(p-1)/p of the vector per rank. Its
  first half alone is the reduce-scatter (then L header-only rounds carry the flags to all).
"""

from __future__ import annotations

from collections.abc import Callable

from ..model.layout import Layout
from ..model.tree import Leaf, Node
from ..refusals import PlanRefusal
from .builder import RankBuilder, is_split
from .operands import lower_expression, operands
from .program import Eval, Message, RankProgram


def _inapplicable(name: str, why: str):
    return PlanRefusal("realization-inapplicable", f"{name}: {why}", realization=name)


def balanced_top(tree: Node, size: int, name: str = "butterfly") -> dict:
    """Check the butterfly shape; return {(level k, block base): left child is the lower block}
    and the operand of each rank. Raises realization-inapplicable saying why not."""
    if size & (size - 1):
        raise _inapplicable(name, f"{size} ranks is not a power of two")
    ops = operands(tree)
    owners = [o.owner for o in ops]
    if sorted(owners) != list(range(size)):
        extra = sorted({o for o in owners if owners.count(o) > 1})
        missing = sorted(set(range(size)) - set(owners))
        why = []
        if extra:
            why.append(f"rank(s) {extra[:6]} hold several operands (their slots are not one subtree)")
        if missing:
            why.append(f"rank(s) {missing[:6]} hold no operand")
        raise _inapplicable(name, "; ".join(why) or "the operands do not map one to one onto the ranks")
    operand_of = {id(o.node): o for o in ops}
    side: dict = {}
    span: dict = {}  # id(node) -> (base, count)
    stack = [(tree, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in operand_of:
            span[id(node)] = (operand_of[id(node)].owner, 1)
            continue
        if not expanded:
            stack.extend([(node, True), (node.right, False), (node.left, False)])
            continue
        (a, ca), (b, cb) = span[id(node.left)], span[id(node.right)]
        base = min(a, b)
        if ca != cb or {a, b} != {base, base + ca} or base % (2 * ca):
            raise _inapplicable(
                name,
                f"the top is not balanced over aligned rank blocks (a branch joins ranks {a}..{a + ca - 1} "
                f"and {b}..{b + cb - 1}); the pairwise topology with power-of-two slots and ranks is",
            )
        side[(ca.bit_length() - 1, base)] = a < b
        span[id(node)] = (base, 2 * ca)
    return {"side": side, "operand": {o.owner: o for o in ops}}


def _is_left(side: dict, r: int, k: int) -> bool:
    base = (r >> (k + 1)) << (k + 1)
    lower_is_left = side[(k, base)]
    return ((r >> k) & 1 == 0) == lower_is_left


def _operand_value(b: RankBuilder, op, n: int, framed: bool):
    """Region holding this rank's operand value: the contribution itself, or its pre-evaluation."""
    if isinstance(op.node, Leaf):
        return b.leaf(op.node.slot, n)
    dest = b.work(n, framed=framed)
    for ev in lower_expression(
        op.node, lambda nd: b.leaf(nd.slot, n) if isinstance(nd, Leaf) else None, dest, lambda c: b.work(c)
    ):
        b.eval(ev)
    return dest


def halves(lo: int, hi: int):
    mid = lo + (hi - lo + 1) // 2
    return (lo, mid), (mid, hi)


def chunk_ranges(n: int, size: int) -> list:
    """chunks[r] after the reduce-scatter half: in round k the pair splits its range, the rank
    whose bit k is 0 keeps the lower half; returns the (lo, hi) range per rank per round too."""
    L = size.bit_length() - 1
    ranges = [[(0, n)] for _ in range(size)]
    for r in range(size):
        lo, hi = 0, n
        for k in range(L):
            low, high = halves(lo, hi)
            lo, hi = low if (r >> k) & 1 == 0 else high
            ranges[r].append((lo, hi))
    return ranges


def lower_butterfly(
    tree: Node, layout: Layout, size: int, receivers: frozenset[int], top: dict
) -> Callable[[int], RankProgram]:
    n = layout.total
    L = size.bit_length() - 1
    key = layout.key()

    def build(r: int):
        b = RankBuilder(r, n)
        op = top["operand"][r]
        split = is_split(n)
        if L == 0:
            v = _operand_value(b, op, n, framed=False)
            res = b.out() if r in receivers else b.work(n)
            b.copy(v, res)
            b.check(res)
            return b.build(_slots(op), res if r in receivers else None)
        v = _operand_value(b, op, n, framed=not split)
        spare = [b.work(n, framed=not split) for _ in range(min(2, L))] if split else None
        res = b.out() if r in receivers else b.work(n)
        for k in range(L):
            q = r ^ (1 << k)
            sent = b.send(Message(k * size + r, "x", r, q, 0, n, f"{key}|x{k}"), v)
            x = b.recv(Message(k * size + q, "x", q, r, 0, n, f"{key}|x{k}"), spare[k % 2] if split else None)
            left, right = (sent, x) if _is_left(top["side"], r, k) else (x, sent)
            if k == L - 1:
                dest = res
            else:
                dest = res if split else b.work(n, framed=True)
            b.eval(Eval((left, right), (0, 1, -1), dest))
            v = dest
        b.check(res)
        return b.build(_slots(op), res if r in receivers else None)

    return build


def lower_halving(
    tree: Node, layout: Layout, size: int, receivers: frozenset[int], top: dict, mode: str
) -> Callable[[int], RankProgram]:
    n = layout.total
    L = size.bit_length() - 1
    key = layout.key()
    ranges = chunk_ranges(n, size)

    def build(r: int):
        b = RankBuilder(r, n)
        op = top["operand"][r]
        v = _operand_value(b, op, n, framed=False)
        whole = mode == "allreduce" and r in receivers
        acc = b.out() if whole else b.work(n)
        if L == 0:
            b.copy(v, acc)
        cur = v
        for k in range(L):
            q = r ^ (1 << k)
            lo, hi = ranges[r][k]
            keep = ranges[r][k + 1]
            give = ranges[q][k + 1]
            m_out = Message(k * size + r, "h", r, q, 0, give[1] - give[0], f"{key}|h{k}:{give[0]}:{give[1]}")
            m_in = Message(k * size + q, "h", q, r, 0, keep[1] - keep[0], f"{key}|h{k}:{keep[0]}:{keep[1]}")
            b.send(m_out, cur.sub(give[0], give[1] - give[0]) if m_out.count else None)
            x = b.recv(m_in, None)
            if m_in.count:
                mine = cur.sub(keep[0], keep[1] - keep[0])
                left, right = (mine, x) if _is_left(top["side"], r, k) else (x, mine)
                b.eval(Eval((left, right), (0, 1, -1), acc.sub(keep[0], keep[1] - keep[0])))
            cur = acc
        c0, c1 = ranges[r][L]
        if c1 > c0:
            b.check(acc.sub(c0, c1 - c0))
        if mode == "reduce-scatter":
            # Header-only rounds carry every rank's flags to every rank (nothing else moves).
            for k in range(L):
                q = r ^ (1 << k)
                b.send(Message((L + k) * size + r, "f", r, q, 1, 0, f"{key}|f{k}"), None)
                b.recv(Message((L + k) * size + q, "f", q, r, 1, 0, f"{key}|f{k}"), None)
            return b.build(_slots(op), acc.sub(c0, c1 - c0))
        for j, k in enumerate(range(L - 1, -1, -1)):
            q = r ^ (1 << k)
            mine, theirs = ranges[r][k + 1], ranges[q][k + 1]
            m_out = Message(
                (L + j) * size + r, "u", r, q, 1, mine[1] - mine[0], f"{key}|u{k}:{mine[0]}:{mine[1]}"
            )
            m_in = Message(
                (L + j) * size + q, "u", q, r, 1, theirs[1] - theirs[0], f"{key}|u{k}:{theirs[0]}:{theirs[1]}"
            )
            b.send(m_out, acc.sub(mine[0], mine[1] - mine[0]) if m_out.count else None)
            b.recv(m_in, acc.sub(theirs[0], theirs[1] - theirs[0]) if m_in.count else None)
        return b.build(_slots(op), acc if r in receivers else None)

    return build


def _slots(op) -> tuple:
    from ..model.tree import leaf_sequence

    return tuple(leaf.slot for leaf in leaf_sequence(op.node))
