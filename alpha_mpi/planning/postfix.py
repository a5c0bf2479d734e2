"""The fused kernel's program form, shared by every lowering (pure).

A program is postfix over a list of inputs: `i >= 0` pushes inputs[i], `-1` pops the right then
the left operand and pushes left + right. The kernel evaluates it with a fixed stack, so
programs are cut where they would need more than STACK_LIMIT entries (a right-deep chain).
"""

from __future__ import annotations

from ..model.tree import Leaf

# The kernel evaluates programs with a fixed stack (AK_MAX_DEPTH = 64); stay well inside it.
STACK_LIMIT = 32


def postfix(root, input_of) -> tuple:
    """(inputs, program) computing `root`. `input_of(node)` is the input a node below `root`
    stands for, or None to expand it (a Leaf must be an input); a Leaf root is its own input."""
    if isinstance(root, Leaf):
        return (input_of(root),), (0,)
    inputs, prog, stack = [], [], [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            prog.append(-1)
            continue
        x = None if node is root else input_of(node)
        if x is not None:
            inputs.append(x)
            prog.append(len(inputs) - 1)
        else:
            stack.append((node, True))
            stack.append((node.right, False))
            stack.append((node.left, False))
    return tuple(inputs), tuple(prog)


def postfix_text(program, inputs, name=str) -> str:
    """The program as a parenthesised sum, each input written as name(input)."""
    stack = []
    for op in program:
        if op == -1:
            right, left = stack.pop(), stack.pop()
            stack.append(f"({left}+{right})")
        else:
            stack.append(name(inputs[op]))
    return stack[0]


def stack_cuts(order, is_input) -> set:
    """ids of the nodes in `order` (a postorder) to evaluate first into scratch, so that no
    postfix program needs a stack deeper than STACK_LIMIT. `is_input(node)`: pushed as one value
    (a leaf, a received or pre-evaluated operand); a child outside `order` counts as one too."""
    need, cuts = {}, set()
    for node in order:
        if is_input(node):
            need[id(node)] = 1
            continue
        nl, nr = need.get(id(node.left), 1), need.get(id(node.right), 1)
        if nl >= STACK_LIMIT:
            cuts.add(id(node.left))
            nl = 1
        if nr >= STACK_LIMIT:
            cuts.add(id(node.right))
            nr = 1
        need[id(node)] = max(nl, nr + 1)
    return cuts


__all__ = ["STACK_LIMIT", "postfix", "postfix_text", "stack_cuts"]
