"""The tree's top over ranks, for the butterflies: which ranks each branch joins (pure).

After pre-evaluation each rank holds the operands it alone owns (operands.py); the *top* is the
rest of the tree. The butterflies (butterfly.py, halving.py) need the top to be
*rank-partitioned*: every rank holds at most one operand, so every branch of the top joins two
disjoint sets of ranks and a rank's value is the value of one node of the top at any time. A
pairwise tree has this shape at every rank count when each rank's block of slots is one
subtree (one slot per rank, 2^k slots per rank, 8 slots on 6 ranks); a random tree, or blocks
that are not subtrees (8 slots on 3 ranks), do not.

A node of the top is *complete* when it is a balanced power-of-two block (both children
complete, of one size): the classic recursive-doubling block, whose position i (leaf order)
meets position i ^ 2^k in round k. The split of any other node follows DESIGN.md "Any rank
count": each side is realized by itself, then a cross round joins them.
"""

from __future__ import annotations

from collections.abc import Callable

from .._record import Record, fields_repr
from ..model.tree import Node
from ..refusals import PlanRefusal
from .operands import operands

_set = object.__setattr__  # Records set their fields through it (frozen: _record.py)


# TopNode and RankTop are written out, not dataclasses: a program's first reduction defines
# them (_record.py: a dataclass costs about 1 ms to define, the start-up budget is 20 ms).


class TopNode:
    """A node of the top: an operand (`rank` set, no children) or a branch over two nodes."""

    def __init__(
        self,
        key: int,  # postorder index among the top's nodes
        node: Node,  # the tree node it stands for
        ranks: tuple = (),  # the ranks below, in leaf order
        left: TopNode | None = None,
        right: TopNode | None = None,
        rank: int = -1,  # an operand's rank
        complete: bool = False,  # a balanced power-of-two block
    ) -> None:
        self.key = key
        self.node = node
        self.ranks = ranks
        self.left = left
        self.right = right
        self.rank = rank
        self.complete = complete

    def __repr__(self) -> str:
        return fields_repr(self, ("key", "ranks", "left", "right", "rank", "complete"))

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def is_operand(self) -> bool:
        return self.left is None


class RankTop(Record):
    """The top of `tree` over ranks: `root`, postorder `nodes`, each rank's operand, and the
    `extra` ranks that hold no operand (they only receive the result)."""

    __slots__ = ("root", "nodes", "operand", "extra", "leaf_key")

    def __init__(
        self,
        root: TopNode,
        nodes: tuple,
        operand: dict,  # rank -> Operand
        extra: tuple,
        leaf_key: dict,  # rank -> the key of its operand's node
    ) -> None:
        _set(self, "root", root)
        _set(self, "nodes", nodes)
        _set(self, "operand", operand)
        _set(self, "extra", extra)
        _set(self, "leaf_key", leaf_key)


def inapplicable(name: str, why: str) -> PlanRefusal:
    return PlanRefusal("realization-inapplicable", f"{name}: {why}", realization=name)


def rank_top(tree: Node, size: int, name: str) -> RankTop:
    """The rank-partitioned top of `tree` on `size` ranks, or realization-inapplicable saying why."""
    ops = operands(tree)
    per_rank: dict = {}
    for o in ops:
        per_rank.setdefault(o.owner, []).append(o)
    several = sorted(r for r, v in per_rank.items() if len(v) > 1)
    if several:
        raise inapplicable(
            name,
            f"the top is not rank-partitioned: rank(s) {several[:6]} hold several operands (their slots "
            "are not one subtree); a pairwise tree is when each rank's block of slots is one subtree "
            "(one slot per rank, or 2^k slots per rank)",
        )
    operand_of = {id(o.node): o for o in ops}
    nodes: list = []
    built: dict = {}
    stack = [(tree, False)]
    while stack:  # postorder without recursion (a deep chain must not overflow the stack)
        node, expanded = stack.pop()
        o = operand_of.get(id(node))
        if o is not None:
            t = TopNode(len(nodes), node, (o.owner,), rank=o.owner, complete=True)
        elif not expanded:
            stack.extend([(node, True), (node.right, False), (node.left, False)])
            continue
        else:
            a, b = built[id(node.left)], built[id(node.right)]
            t = TopNode(len(nodes), node, a.ranks + b.ranks, a, b)
            t.complete = a.complete and b.complete and a.size == b.size
        built[id(node)] = t
        nodes.append(t)
    root = nodes[-1]
    extra = tuple(r for r in range(size) if r not in per_rank)
    leaf_key = {t.rank: t.key for t in nodes if t.is_operand}
    return RankTop(root, tuple(nodes), {r: v[0] for r, v in per_rank.items()}, extra, leaf_key)


class Load:
    """Messages (or bytes) each rank sends so far, for choosing among equivalent senders: when
    every rank of a set holds one value, the least loaded ones send it (ties by position)."""

    def __init__(self, size: int):
        self.sent = [0] * size

    def pick(self, candidates, count: int) -> list:
        """`count` senders among `candidates` (round robin over them, least loaded first)."""
        if not candidates:
            return []
        order = sorted(range(len(candidates)), key=lambda i: (self.sent[candidates[i]], i))
        return [candidates[order[j % len(order)]] for j in range(count)]

    def add(self, rank: int, amount: int = 1) -> None:
        self.sent[rank] += amount


def why_not(tree: Node, size: int, name: str) -> str | None:
    """None when the top of `tree` is rank-partitioned on `size` ranks, else the reason."""
    try:
        top_of(tree, size, name)
    except PlanRefusal as e:
        return e.message
    return None


def node_times(top: RankTop, join: Callable[[TopNode, int, int], int]) -> dict:
    """Each node's time (key -> round by which every rank of it holds its value), bottom up: an
    operand's is 0, a branch `t`'s is `join(t, ta, tb)` of its operands' times. The one walk
    behind the butterfly's schedule (butterfly.plan_schedule, whose join also plans the
    messages) and its round count (butterfly_rounds)."""
    done: dict = {}
    for t in top.nodes:
        done[t.key] = 0 if t.is_operand else join(t, done[t.left.key], done[t.right.key])
    return done


def butterfly_rounds(top: RankTop, late_receivers: bool) -> int:
    """The butterfly's rounds: plan_schedule's times without its messages (O(nodes)). A complete
    block's exchange ends one round after its halves; every other join (piggybacked or cross)
    one round after its later side."""
    done = node_times(top, lambda t, ta, tb: (ta if t.complete else max(ta, tb)) + 1)
    return done[top.root.key] + (1 if late_receivers else 0)


def halving_shape(top: RankTop) -> tuple[int, int]:
    """(depth of the root's holders, rounds of the reduce-scatter half): halving.plan_halving's
    recursion, times only (O(nodes)). The root has 2^depth holders."""
    held: dict = {}
    for t in top.nodes:
        if t.is_operand:
            held[t.key] = (0, 0)
            continue
        (da, ta), (db, tb) = held[t.left.key], held[t.right.key]
        if da == db:
            held[t.key] = (da + 1, max(ta, tb) + 1)
        else:
            (dt, tt), (_, tu) = ((da, ta), (db, tb)) if da > db else ((db, tb), (da, ta))
            held[t.key] = (dt, max(tt, tu + 1))
    return held[top.root.key]


_TOPS: dict = {}  # (tree identity, size) -> RankTop or the reason it is not rank-partitioned


def top_of(tree: Node, size: int, name: str) -> RankTop:
    """rank_top, remembered for the last few trees (applicable, auto and realize all ask)."""
    key = (tree.identity, size)
    got = _TOPS.get(key)
    if got is None:
        try:
            got = rank_top(tree, size, "{name}")
        except PlanRefusal as e:
            got = e.message
        if len(_TOPS) >= 8:
            _TOPS.pop(next(iter(_TOPS)))
        _TOPS[key] = got
    if isinstance(got, str):
        raise inapplicable(name, got.split(": ", 1)[1])
    return got


__all__ = [
    "TopNode",
    "RankTop",
    "rank_top",
    "top_of",
    "why_not",
    "inapplicable",
    "Load",
    "butterfly_rounds",
    "node_times",
    "halving_shape",
]
