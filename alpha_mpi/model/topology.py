"""Topologies: builders that fix a tree shape over logical slots, and placements onto ranks.

The tree is over slots (micro-batch shards), not ranks: `hierarchy(range(8), owners=2, ...)` and
`hierarchy(range(8), owners=8, ...)` are the same order on two placements, so they give the same
bits. A star and a hierarchy over the same slots are two different orders (two contracts).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Union

from ..refusals import ModelRefusal
from .tree import Branch, Leaf, Node, leaf_sequence

#: What `slots=` takes: a count (slots 0..k-1) or the slots themselves, in tree order.
Slots = Union[int, Iterable[int]]
#: What `owners=` takes: a rank count (contiguous blocks), one rank per slot, or slot -> rank.
Owners = Union[int, Sequence[int], Mapping[int, int]]

__all__ = [
    "Slots",
    "Owners",
    "block_owners",
    "placement",
    "star",
    "hierarchy",
    "pairwise_split",
    "pairwise",
    "TOPOLOGIES",
    "parse_topology",
    "build",
    "heap_preorder",
    "classify",
]


def _slots(slots: Slots) -> list[int]:
    if isinstance(slots, int) and not isinstance(slots, bool):
        if slots < 1:
            raise ModelRefusal("slot-invalid", f"need at least one slot, got {slots}")
        return list(range(slots))
    try:
        out = list(slots)
    except TypeError:
        raise ModelRefusal("slot-invalid", f"slots must be a count or a sequence, got {slots!r}")
    if not out:
        raise ModelRefusal("slot-invalid", "need at least one slot")
    return out


def block_owners(nslots: int, ranks: int) -> list[int]:
    """Slot position i -> rank i*ranks//nslots: contiguous blocks differing by at most one slot."""
    return [i * ranks // nslots for i in range(nslots)]


def placement(slots: list[int], owners: Owners | None) -> list[int]:
    """Owner rank for each slot position: from a rank count, a per-slot list, or a mapping."""
    n = len(slots)
    if owners is None:
        return [0] * n
    if isinstance(owners, int) and not isinstance(owners, bool):
        if owners < 1:
            raise ModelRefusal("placement-invalid", f"rank count must be >= 1, got {owners}")
        return block_owners(n, owners)
    if isinstance(owners, Mapping):
        missing = [s for s in slots if s not in owners]
        if missing:
            raise ModelRefusal("placement-invalid", f"no owner given for slot(s) {missing[:8]}")
        return [owners[s] for s in slots]
    try:
        out = list(owners)
    except TypeError:
        raise ModelRefusal("placement-invalid", f"cannot read owners from {owners!r}")
    if len(out) != n:
        raise ModelRefusal("placement-invalid", f"{len(out)} owners given for {n} slots")
    return out


def star(slots: Slots, owners: Owners | None = None, hub: int | None = None) -> Node:
    """The chain ((x0 + x1) + x2) + ... with every branch at `hub` (default: first slot's owner)."""
    slots = _slots(slots)
    place = placement(slots, owners)
    if hub is None:
        hub = place[0]
    acc: Node = Leaf(slots[0], place[0])
    for s, o in zip(slots[1:], place[1:]):
        acc = Branch(acc, Leaf(s, o), hub)
    return _known(acc, "single" if len(slots) == 1 else "star")


def hierarchy(slots: Slots, owners: Owners | None = None, fanout: int = 2) -> Node:
    """Slot positions in a k-ary heap (children of i are k*i+1 .. k*i+k).

    Each node folds its own contribution, then each child subtree in order, at the node's owner:
    T(i) = ((x_i + T(k*i+1)) + T(k*i+2)) + ...
    """
    if isinstance(fanout, bool) or not isinstance(fanout, int) or fanout < 1:
        raise ModelRefusal("topology-invalid", f"hierarchy fanout must be an int >= 1, got {fanout!r}")
    slots = _slots(slots)
    place = placement(slots, owners)
    n = len(slots)
    sub: list = [None] * n
    for i in range(n - 1, -1, -1):  # children have larger indices: build bottom-up, no recursion
        acc: Node = Leaf(slots[i], place[i])
        for c in range(fanout * i + 1, min(fanout * i + fanout, n - 1) + 1):
            acc = Branch(acc, sub[c], place[i])
            sub[c] = None
        sub[i] = acc
    return _known(sub[0], "single" if n == 1 else "star" if fanout >= n - 1 else f"hierarchy:{fanout}")


def pairwise_split(lo: int, hi: int) -> int:
    """Where the pairwise tree splits [lo, hi) (hi - lo >= 2): lo + 2**floor(log2(hi - lo - 1)).

    The left part is the largest power of two below the length, so every power-of-two-aligned
    block of positions is a complete subtree (the property the butterfly realizations need)."""
    return lo + (1 << ((hi - lo - 1).bit_length() - 1))


def pairwise(slots: Slots, owners: Owners | None = None) -> Node:
    """The balanced binary tree over slot positions: [lo, hi) split at pairwise_split(lo, hi).

    Each branch sits at the owner of its first slot. Placed in contiguous blocks with a
    power-of-two rank count and slot count, each rank's block is one complete subtree and the
    rank-level top is balanced: the butterfly and halving realizations then apply.
    """
    slots = _slots(slots)
    place = placement(slots, owners)
    # Iterative (no recursion limit): a stack of (lo, hi, expanded) ranges.
    done: dict = {}
    stack = [(0, len(slots), False)]
    while stack:
        lo, hi, expanded = stack.pop()
        if hi - lo == 1:
            done[(lo, hi)] = Leaf(slots[lo], place[lo])
            continue
        mid = pairwise_split(lo, hi)
        if expanded:
            done[(lo, hi)] = Branch(done.pop((lo, mid)), done.pop((mid, hi)), place[lo])
        else:
            stack.extend([(lo, hi, True), (mid, hi, False), (lo, mid, False)])
    n = len(slots)
    return _known(done[(0, n)], "single" if n == 1 else "star" if n <= 3 else "pairwise")


TOPOLOGIES = "pairwise | star | star:HUB | hierarchy:K"


def parse_topology(text: str) -> tuple[str, int | None]:
    """'pairwise', 'star', 'star:HUB', 'hierarchy:K' -> (kind, parameter)."""
    kind, _, arg = str(text).partition(":")
    try:
        if kind == "pairwise" and not arg:
            return ("pairwise", None)
        if kind == "star":
            return ("star", int(arg) if arg else None)
        if kind == "hierarchy":
            k = int(arg) if arg else 2
            if k >= 1:
                return ("hierarchy", k)
    except ValueError:
        pass
    raise ModelRefusal("topology-invalid", f"cannot read topology {text!r}")


def build(topology: str, slots: Slots, owners: Owners | None = None) -> Node:
    """The tree a topology string names (parse_topology) over `slots`, placed by `owners`."""
    kind, arg = parse_topology(topology)
    if kind == "pairwise":
        return pairwise(slots, owners)
    if kind == "star":
        return star(slots, owners, hub=arg)
    return hierarchy(slots, owners, fanout=arg)


def heap_preorder(n: int, k: int) -> list[int]:
    """Heap positions in the order their leaves appear left to right in hierarchy(n, k)."""
    out, stack = [], [0]
    while stack:
        i = stack.pop()
        out.append(i)
        stack.extend(reversed(range(k * i + 1, min(k * i + k, n - 1) + 1)))
    return out


# Shape names of trees the builders made, by order digest: classify() is then O(1) for them
# (the builders know what classify's search would find; tests check that they agree).
_SHAPES: dict = {}
_SHAPES_MAX = 256


def _known(tree: Node, name: str) -> Node:
    if len(_SHAPES) >= _SHAPES_MAX:
        _SHAPES.clear()
    _SHAPES[tree._order] = name
    return tree


def classify(tree: Node) -> str:
    """Name the shape of a tree: 'single', 'star', 'pairwise', 'hierarchy:K' or 'custom'
    (O(1) for trees the builders made; see classify_slowly for the rules)."""
    name = _SHAPES.get(tree._order) if isinstance(tree, Node) else None
    return name if name is not None else classify_slowly(tree)


def classify_slowly(tree: Node) -> str:
    """Name the shape of a tree: 'single', 'star', 'pairwise', 'hierarchy:K' or 'custom'.

    Derived from the order (owners erased), so every rank names a tree's topology the same way
    and frames can tell a star peer from a hierarchy peer. Two slots form both a star and any
    hierarchy; that shape is called a star.
    """
    if isinstance(tree, Leaf):
        return "single"
    seq = [leaf.slot for leaf in leaf_sequence(tree)]
    n = len(seq)
    node = tree
    while isinstance(node, Branch) and isinstance(node.right, Leaf):
        node = node.left
    if isinstance(node, Leaf):
        return "star"
    if pairwise(seq)._order == tree._order:
        return "pairwise"
    for k in range(1, min(n - 1, 64) + 1):
        slots = [None] * n
        for pos, s in zip(heap_preorder(n, k), seq):
            slots[pos] = s
        if hierarchy(slots, None, k)._order == tree._order:
            return f"hierarchy:{k}"
    return "custom"
