"""Pre-evaluation: the maximal subtrees one rank alone owns, and fused programs for expressions.

Before any communication a rank evaluates every maximal subtree whose leaves it alone owns (one
fused kernel pass each); only those values, the *operands* of the tree's *top*, travel. The top
is the rest of the tree, with operands as its inputs.
"""

from __future__ import annotations

from .._record import Record
from ..model.tree import Leaf, Node, leaf_sequence, postorder
from .postfix import postfix, stack_cuts
from .program import Eval, Region

_set = object.__setattr__  # Records set their fields through it (frozen: _record.py)


class Operand(Record):
    __slots__ = ("index", "owner", "node")

    def __init__(
        self,
        index: int,  # position in the top's left-to-right operand order
        owner: int,
        node: Node,  # the subtree (a Leaf or a Branch whose leaves all sit on `owner`)
    ) -> None:
        _set(self, "index", index)
        _set(self, "owner", owner)
        _set(self, "node", node)


def sole_owners(tree: Node) -> dict:
    """id(node) -> the one rank owning every leaf below node, or None."""
    sole = {}
    for node in postorder(tree):
        if isinstance(node, Leaf):
            sole[id(node)] = node.owner
        else:
            a, b = sole[id(node.left)], sole[id(node.right)]
            sole[id(node)] = a if a is not None and a == b else None
    return sole


def operands(tree: Node) -> list:
    """The maximal single-owner subtrees, left to right."""
    sole = sole_owners(tree)
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        if sole[id(node)] is not None:
            out.append(Operand(len(out), sole[id(node)], node))
        else:
            stack.append(node.right)
            stack.append(node.left)
    return out


def lower_expression(root: Node, input_region, out: Region, new_work) -> list:
    """Evals computing `root` into `out`. `input_region(node)` gives the Region of a node that is
    an input (or None for a node to expand); `new_work(count)` allocates a scratch Region.
    Programs are cut where the postfix stack would exceed STACK_LIMIT (a right-deep chain):
    the cut subtree is evaluated first into scratch."""
    count = out.count
    # Postorder over the expanded part only.
    order, stack = [], [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if input_region(node) is not None or isinstance(node, Leaf) or expanded:
            order.append(node)
        else:
            stack.append((node, True))
            stack.append((node.right, False))
            stack.append((node.left, False))
    cuts = stack_cuts(order, lambda node: input_region(node) is not None or isinstance(node, Leaf))
    evals, done = [], {}
    for node in order:  # cut subtrees come before their parents in postorder
        if id(node) in cuts:
            region = new_work(count)
            evals.append(_one(node, input_region, done, region))
            done[id(node)] = region
    evals.append(_one(root, input_region, done, out))
    return evals


def _one(root, input_region, done, out) -> Eval:
    """One postfix program for `root` (not itself an input) over its inputs."""
    inputs, prog = postfix(root, lambda node: done.get(id(node)) or input_region(node))
    return Eval(inputs, prog, out)


def pre_evaluate(b, ops, n: int, dests) -> list:
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


def slots_of_operands(ops) -> tuple:
    return tuple(leaf.slot for op in ops for leaf in leaf_sequence(op.node))


def operands_by_rank(ops, size: int) -> list:
    """The operands each rank holds, left to right (one pass; a scan per rank is O(p^2))."""
    by_rank: list = [[] for _ in range(size)]
    for o in ops:
        by_rank[o.owner].append(o)
    return by_rank
