"""Combine trees: Leaf(slot, owner) and Branch(left, right, owner).

A tree is the declaration of a floating-point order. Nodes are immutable and carry two Merkle
digests computed once at construction (so hashing, equality and identities cost O(1) per node and
never recurse, even for a 10,000-leaf chain):

- the *order* digest erases owners: shape, slots and the operation. Two trees with the same
  order digest produce the same bits wherever they are placed.
- the *placed* digest includes owners. It names one placement of that order.

Digests are sha256 over a canonical byte form with domain-separation prefixes, never Python's
`hash()`, so identities agree across processes, Python versions and machines.
"""

from __future__ import annotations

import struct

from .._sha256 import sha256
from ..refusals import ModelRefusal

__all__ = ["OPERATION", "Node", "Leaf", "Branch", "postorder", "leaf_sequence", "expression", "owners"]

#: The one operation a branch performs (part of every order digest).
OPERATION = b"add-binary64-nearest-even"
_ORDER_TAG = b"alpha-mpi/order/v1\0"
_TREE_TAG = b"alpha-mpi/tree/v1\0"


def _check_index(value, what: str, code: str) -> int:
    # bool is an int subclass; a True slot is almost surely a bug, so refuse it.
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelRefusal(code, f"{what} must be a non-negative int, got {value!r}")
    if value >= 2**62:
        raise ModelRefusal(code, f"{what} {value} is too large (limit 2**62)")
    return value


class Node:
    """A node of a combine tree: a `Leaf` or a `Branch` (never built directly).

    Attributes: `owner` (the rank that holds or evaluates it), `leaves` (leaf count), `depth`;
    `order_id` and `identity` (see below). Immutable; equal and hashed by placed digest.
    """

    __slots__ = ("owner", "_order", "_placed", "leaves", "depth")
    owner: int
    leaves: int
    depth: int
    _order: bytes
    _placed: bytes

    def __eq__(self, other):
        return isinstance(other, Node) and self._placed == other._placed

    def __hash__(self):
        return int.from_bytes(self._placed[:8], "little")

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _init(self, owner, order, placed, leaves, depth):
        object.__setattr__(self, "owner", owner)
        object.__setattr__(self, "_order", order)
        object.__setattr__(self, "_placed", placed)
        object.__setattr__(self, "leaves", leaves)
        object.__setattr__(self, "depth", depth)

    @property
    def order_id(self) -> str:
        """Digest of the declared order with owners erased (what a numerical contract names)."""
        return sha256(_ORDER_TAG + self._order).hexdigest()

    @property
    def identity(self) -> str:
        """Digest of the order together with its placement (what frames and plans name)."""
        return sha256(_TREE_TAG + self._placed).hexdigest()


class Leaf(Node):
    """One logical contribution `slot`, held by rank `owner`."""

    __slots__ = ("slot",)
    slot: int

    def __init__(self, slot: int, owner: int = 0):
        slot = _check_index(slot, "Leaf slot", "slot-invalid")
        owner = _check_index(owner, "Leaf owner", "owner-out-of-range")
        object.__setattr__(self, "slot", slot)
        order = sha256(b"L" + struct.pack("<Q", slot)).digest()
        placed = sha256(b"L" + struct.pack("<QQ", slot, owner)).digest()
        self._init(owner, order, placed, 1, 0)

    def __repr__(self):
        return f"Leaf({self.slot}, {self.owner})"


class Branch(Node):
    """`left + right`, coordinate by coordinate in binary64, left operand first, at `owner`."""

    __slots__ = ("left", "right")
    left: Node
    right: Node

    def __init__(self, left: Node, right: Node, owner: int = 0):
        if not isinstance(left, Node) or not isinstance(right, Node):
            raise ModelRefusal(
                "tree-malformed",
                f"Branch operands must be Leaf or Branch, got {type(left).__name__} and "
                f"{type(right).__name__}",
            )
        owner = _check_index(owner, "Branch owner", "owner-out-of-range")
        object.__setattr__(self, "left", left)
        object.__setattr__(self, "right", right)
        order = sha256(b"B" + OPERATION + left._order + right._order).digest()
        placed = sha256(b"B" + OPERATION + struct.pack("<Q", owner) + left._placed + right._placed).digest()
        self._init(owner, order, placed, left.leaves + right.leaves, 1 + max(left.depth, right.depth))

    def __repr__(self):
        if self.leaves > 8:
            return f"Branch(<{self.leaves} leaves>, owner={self.owner})"
        return f"Branch({self.left!r}, {self.right!r}, {self.owner})"


def postorder(root: Node) -> list[Node]:
    """Nodes in postorder (children before parents), iteratively."""
    out = []
    stack = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if isinstance(node, Leaf) or expanded:
            out.append(node)
        else:
            stack.append((node, True))
            stack.append((node.right, False))
            stack.append((node.left, False))
    return out


def leaf_sequence(root: Node) -> list[Leaf]:
    """Leaves left to right: the in-order sequence that OrderedMembers constrains."""
    return [n for n in postorder(root) if isinstance(n, Leaf)]


def expression(root: Node, placed: bool = False) -> str:
    """A readable canonical form, e.g. `((s0+s1)+s2)`; with `placed`, owners as `@r`."""
    parts: dict[int, str] = {}
    for node in postorder(root):
        if isinstance(node, Leaf):
            text = f"s{node.slot}" + (f"@{node.owner}" if placed else "")
        else:
            text = f"({parts[id(node.left)]}+{parts[id(node.right)]})" + (f"@{node.owner}" if placed else "")
        parts[id(node)] = text
    return parts[id(root)]


def owners(root: Node) -> set[int]:
    """The ranks that own a node of the tree."""
    return {n.owner for n in postorder(root)}
