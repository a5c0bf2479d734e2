"""Executed mutants (DESIGN.md "Showing that the declared order ran").

A mutant is a wrong realization of a declared plan that *claims to be* the declared plan: its
frames carry the declared plan's identity, order id and topology, so every header check passes
and the real executor (Combiner over MPI) runs its communication to completion. Only the
independent oracle, evaluating the DECLARED tree, can tell, and it must refuse the result
(`oracle-mismatch`, naming the coordinates that differ).

Kinds (each bypasses the planner's coverage checks by building the Plan object directly):

- `swap-across-subtrees`: at a branch, a leaf of the left subtree and a leaf of the right
  subtree, held by different ranks, trade places. (Swapping a branch's two operands alone is
  NOT a mutant: IEEE addition commutes, a+b and b+a have the same bits; that is the
  `commuted` control below, which the observability check refuses.)
- `duplicated-mass`: one slot's `mass` component counted twice: its payload's mass is doubled
  before it is sent (the numerator is left alone), on a rank other than the root's, so the
  doubled mass travels over the wire. Needs a layout with a `mass` component.
- `duplicated-leaf`: the owning group's fused program pushes one leaf twice (x + x in place of x):
  the same schedule and traffic, a duplicate the coverage check would have refused.
- `moved-leaf`: the last leaf moves to the front of the tree: same coverage, another order.
- `reassociated`: a branch ((a+b)+c) becomes (a+(b+c)).
- `commuted` (control, not in KINDS): a branch's operands on different ranks swapped; always
  unobservable, so `require_observable` refuses it with `mutant-unobservable`.

Tree mutants are planned with plan() over the mutated tree (ParticipantGroup coverage, owners
kept, so every rank still holds the slots it owns), then stamped with the declared identities.
Every mutant plan is checked with planning.simulate (every send meets its receive, no rank waits
forever, every receiver ends with the mutant's expression) before it runs.

A mutant proves something only if the data makes it observable: `require_observable(data)`
refuses (`mutant-unobservable`) when the oracle gives the mutant's tree the declared bits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from alpha_mpi import oracle
from alpha_mpi.model import Branch, Leaf, ParticipantGroup
from alpha_mpi.model.tree import leaf_sequence, postorder
from alpha_mpi.numerics.oracle_check import OracleMismatch, check_against_oracle, component_names
from alpha_mpi.planning import Plan, simulate
from alpha_mpi.planning import plan as make_plan
from alpha_mpi.refusals import Refusal

KINDS = ("swap-across-subtrees", "duplicated-mass", "duplicated-leaf", "moved-leaf", "reassociated")
CONTROLS = ("commuted",)


def _not_applicable(kind, why):
    return Refusal("mutant-not-applicable", f"{kind}: {why}", kind=kind)


@dataclass(frozen=True)
class Mutant:
    kind: str
    description: str
    declared: Plan = field(repr=False)
    plan: Plan = field(repr=False)  # what executes: mutated groups, the declared identities
    tree: object = field(repr=False)  # what the mutant computes (for the oracle; may repeat a leaf)
    double_mass_of: int | None = None  # duplicated-mass: the slot whose mass is counted twice

    # -- data ------------------------------------------------------------------------------
    def _transform(self, slot, payload):
        if self.double_mass_of is None or slot != self.double_mass_of:
            return payload
        lo, hi = self.declared.layout.offsets["mass"]
        out = np.array(payload, dtype=np.float64).reshape(-1)
        out[lo:hi] = out[lo:hi] + out[lo:hi]  # the mass counted twice (exact doubling)
        return out

    def contributions(self, mine: dict) -> dict:
        """This rank's payloads as the mutant sends them (flat float64 arrays)."""
        return {s: self._transform(s, flatten(v)) for s, v in mine.items()}

    def data(self, data: dict) -> dict:
        """`data` (slot -> payload) as this mutant feeds it to the executor."""
        return {s: self._transform(s, flatten(v)) for s, v in data.items()}

    def expected(self, data: dict) -> list:
        """What the mutant computes, by the oracle (its tree over its transformed data)."""
        return oracle.evaluate(self.tree, {s: v.tolist() for s, v in self.data(data).items()})

    def declared_result(self, data: dict) -> list:
        """The oracle's value of the DECLARED tree over `data`."""
        return oracle.evaluate(self.declared.tree, {s: flatten(v).tolist() for s, v in data.items()})

    def observable_coordinates(self, data: dict) -> list:
        """Coordinates where the mutant's bits differ from the declared order's on `data`."""
        a = np.asarray(self.expected(data), dtype=np.float64).view(np.uint64)
        b = np.asarray(self.declared_result(data), dtype=np.float64).view(np.uint64)
        return np.nonzero(a != b)[0].tolist()

    def require_observable(self, data: dict) -> list:
        """`observable_coordinates(data)`, refusing (`mutant-unobservable`) when there are none."""
        coords = self.observable_coordinates(data)
        if not coords:
            raise Refusal(
                "mutant-unobservable",
                f"{self.kind} ({self.description}): on this data the mutant gives the declared bits at every "
                "coordinate, so refusing it would prove nothing",
                kind=self.kind,
            )
        return coords


def flatten(value) -> np.ndarray:
    """A payload (an array, or a tuple of component arrays) as one float64 vector."""
    if isinstance(value, tuple):
        return np.concatenate([np.ravel(np.asarray(p, dtype=np.float64)) for p in value])
    return np.ascontiguousarray(value, dtype=np.float64).reshape(-1)


# ------------------------------------------------------------------------------- tree edits


def _rebuild(tree, subst: dict):
    """The tree with nodes replaced by id (subst: id(node) -> new node or None to drop a leaf,
    in which case its parent becomes its sibling). Iterative; unchanged subtrees are shared."""
    new = {}
    for node in postorder(tree):
        key = id(node)
        if key in subst:
            new[key] = subst[key]
        elif isinstance(node, Leaf):
            new[key] = node
        else:
            l_, r = new[id(node.left)], new[id(node.right)]
            if l_ is None or r is None:
                new[key] = r if l_ is None else l_
            elif l_ is node.left and r is node.right:
                new[key] = node
            else:
                new[key] = Branch(l_, r, node.owner)
    return new[id(tree)]


def _preorder_branches(tree):
    return [n for n in reversed(postorder(tree)) if isinstance(n, Branch)]


def _stamp(declared: Plan, mutated: Plan) -> Plan:
    """The mutant claims the declared plan's identities, so its frames pass every header check."""
    return mutated.replace(
        topology=declared.topology,
        tree_order_id=declared.tree_order_id,
        layout_order_id=declared.layout_order_id,
        identity=declared.identity,
        coverage=declared.coverage,
    )


def _plan_tree(declared: Plan, tree) -> Plan:
    slots = [lf.slot for lf in leaf_sequence(tree)]
    p = make_plan(
        tree, declared.delivery, declared.layout, size=declared.size, coverage=ParticipantGroup(slots)
    )
    return _stamp(declared, p)


def _wire_leaf(declared: Plan, kind: str):
    """A leaf held by a rank other than the root's (its contribution travels), else any leaf."""
    leaves = leaf_sequence(declared.tree)
    for lf in reversed(leaves):
        if lf.owner != declared.root_rank:
            return lf
    if len(leaves) < 2:
        raise _not_applicable(kind, "the tree has a single leaf")
    return leaves[-1]


def _swap_across(declared: Plan):
    kind = "swap-across-subtrees"
    for b in _preorder_branches(declared.tree):
        left, right = leaf_sequence(b.left), leaf_sequence(b.right)
        for x in left:
            for y in right:
                if x.owner == y.owner or (b.left is x and b.right is y):
                    continue
                tree = _rebuild(declared.tree, {id(x): Leaf(y.slot, y.owner), id(y): Leaf(x.slot, x.owner)})
                desc = (
                    f"slots {x.slot}@r{x.owner} and {y.slot}@r{y.owner} trade places "
                    f"across the subtrees of a branch at r{b.owner}"
                )
                return _plan_tree(declared, tree), tree, desc
    raise _not_applicable(kind, "no branch has leaves of two ranks on its two sides")


def _moved_leaf(declared: Plan):
    kind = "moved-leaf"
    leaves = leaf_sequence(declared.tree)
    if len(leaves) < 3:
        raise _not_applicable(kind, "moving a leaf of a tree with fewer than 3 leaves only commutes a branch")
    x = leaves[-1]
    pruned = _rebuild(declared.tree, {id(x): None})
    first = leaf_sequence(pruned)[0]
    moved = Leaf(x.slot, x.owner)
    tree = _rebuild(pruned, {id(first): Branch(moved, first, first.owner)})
    desc = (
        f"slot {x.slot}@r{x.owner} moved from the last position to the first "
        f"(before slot {first.slot}@r{first.owner})"
    )
    return _plan_tree(declared, tree), tree, desc


def _reassociated(declared: Plan):
    kind = "reassociated"
    for b in _preorder_branches(declared.tree):
        if isinstance(b.left, Branch):
            a, bb, c = b.left.left, b.left.right, b.right
            tree = _rebuild(declared.tree, {id(b): Branch(a, Branch(bb, c, b.left.owner), b.owner)})
            desc = f"a branch at r{b.owner} re-associated ((a+b)+c) -> (a+(b+c))"
            return _plan_tree(declared, tree), tree, desc
    raise _not_applicable(kind, "no branch has a branch as its left operand")


def _commuted(declared: Plan):
    kind = "commuted"
    for b in _preorder_branches(declared.tree):
        if b.left.owner != b.right.owner:
            tree = _rebuild(declared.tree, {id(b): Branch(b.right, b.left, b.owner)})
            return (
                _plan_tree(declared, tree),
                tree,
                f"the operands of a branch at r{b.owner} swapped (b+a for a+b)",
            )
    raise _not_applicable(kind, "no branch has operands on two ranks")


def _duplicated_leaf(declared: Plan):
    kind = "duplicated-leaf"
    x = _wire_leaf(declared, kind)
    groups = list(declared.groups)
    for g in groups:
        if g.rank == x.owner and ("leaf", x.slot) in g.inputs:
            i = g.inputs.index(("leaf", x.slot))
            prog = []
            for op in g.program:
                prog.extend((i, i, -1) if op == i else (op,))
            groups[g.index] = g.replace(program=tuple(prog))
            break
    else:  # pragma: no cover - every leaf is an input of its owner's group
        raise _not_applicable(kind, f"slot {x.slot} is not an input of any group")
    tree = _rebuild(declared.tree, {id(x): Branch(x, Leaf(x.slot, x.owner), x.owner)})
    desc = f"the group at r{x.owner} pushes slot {x.slot} twice ((s{x.slot}+s{x.slot}) in its place)"
    return declared.replace(groups=tuple(groups), tree=tree), tree, desc


def _duplicated_mass(declared: Plan):
    kind = "duplicated-mass"
    if "mass" not in declared.layout.offsets:
        raise _not_applicable(
            kind, f"the layout {declared.layout.key()} has no mass component (use Layout.weighted)"
        )
    x = _wire_leaf(declared, kind)
    desc = f"slot {x.slot}@r{x.owner} sends its mass doubled (its weight counted twice)"
    return declared, declared.tree, desc, x.slot


_BUILDERS = {
    "swap-across-subtrees": _swap_across,
    "duplicated-leaf": _duplicated_leaf,
    "moved-leaf": _moved_leaf,
    "reassociated": _reassociated,
    "commuted": _commuted,
}


def mutant(declared: Plan, kind: str) -> Mutant:
    """Build one mutant of `declared` and check with simulate() that it communicates
    consistently (runs to completion)."""
    if kind == "duplicated-mass":
        p, tree, desc, slot = _duplicated_mass(declared)
        m = Mutant(kind, desc, declared, p, tree, double_mass_of=slot)
    elif kind in _BUILDERS:
        p, tree, desc = _BUILDERS[kind](declared)
        m = Mutant(kind, desc, declared, p, tree)
    else:
        raise Refusal("usage", f"unknown mutant kind {kind!r} (known: {', '.join(KINDS + CONTROLS)})")
    for attr in ("identity", "layout_order_id", "topology", "layout", "size"):
        if getattr(m.plan, attr) != getattr(declared, attr):  # pragma: no cover - _stamp guarantees it
            raise Refusal("plan-simulation-failed", f"mutant {kind} does not claim the declared {attr}")
    simulate(m.plan)
    return m


def build_mutants(declared: Plan, kinds=KINDS) -> dict:
    """kind -> Mutant for every kind (mutant-not-applicable if the tree has no place for one)."""
    return {k: mutant(declared, k) for k in kinds}


# ---------------------------------------------------------------------------------- running


@dataclass
class MutantRun:
    kind: str
    result: np.ndarray | None  # what this rank received (None where delivery does not reach)
    observable: list  # coordinates at which the mutant's bits differ from the declared bits
    matches_mutant: bool | None  # the result is the mutant tree's oracle value, bit for bit
    refusal: Refusal | None  # the declared oracle's verdict (OracleMismatch), None if accepted


def run(comm, m: Mutant, mine: dict, *, timeout=None, contract: str = ""):
    """Execute the mutant through the real Combiner on `comm` (collective: every rank calls it)."""
    from alpha_mpi.execution import Combiner

    c = Combiner(comm, m.plan, timeout=timeout, contract=contract)
    try:
        return c.run(m.contributions(mine))
    finally:
        c.free()


def oracle_verdict(declared: Plan, data: dict, result) -> None:
    """The independent oracle of the DECLARED tree refuses a result that is not its bits."""
    check_against_oracle(
        declared.tree,
        {s: flatten(v) for s, v in data.items()},
        result,
        layout=declared.layout,
        what=f"the result of plan {declared.identity[:12]}",
    )


def refute(comm, m: Mutant, data: dict, *, timeout=None, contract: str = "") -> MutantRun:
    """Require the mutant observable on `data` (slot -> payload, the same on every rank), run it
    to completion over `comm`, and let the declared oracle judge what each receiver got."""
    observable = m.require_observable(data)
    rank = comm.Get_rank()
    mine = {s: data[s] for s in m.plan.slots_of(rank)}
    got = run(comm, m, mine, timeout=timeout, contract=contract)
    if got is None:
        return MutantRun(m.kind, None, observable, None, None)
    want_mutant = np.asarray(m.expected(data), dtype=np.float64)
    matches = bool(np.array_equal(got.view(np.uint64), want_mutant.view(np.uint64)))
    refusal = None
    try:
        oracle_verdict(m.declared, data, got)
    except OracleMismatch as e:
        refusal = e
    return MutantRun(m.kind, got, observable, matches, refusal)


__all__ = [
    "KINDS",
    "CONTROLS",
    "Mutant",
    "MutantRun",
    "mutant",
    "build_mutants",
    "run",
    "refute",
    "oracle_verdict",
    "flatten",
    "component_names",
]
