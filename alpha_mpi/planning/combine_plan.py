"""The tree planner: tree + delivery + payload layout -> groups and edges (pure, deterministic).

`plan()` is four passes over frozen data: `validate` (validate.py: the request, once), `group`
(the tree cut into one-owner groups), `lower_reduce` (groups and the reduce edges up the tree)
and `lower_deliver` (the deliver edges: the result's way down). The Plan is the tree
realization's data; its one executable form is the Program (planning/program.py) that
realizations/tree.py lowers it to (`realize(plan, "tree")`), whose order is:

1. Reduce, group by group in the global postorder of their roots: wait for the reduce edges
   feeding the group, evaluate its postfix program over its inputs (local contributions,
   received payloads, results of earlier local groups) in one fused kernel pass, writing
   straight into the payload of the outgoing frame, a scratch buffer, or the result; start the
   send of the group's edge where its parent lives on another rank.
2. Deliver: a rank other than the root waits for its one deliver edge, then starts its deliver
   sends of the same value, in edge order.
Any group waits only on groups that come earlier in that order: no cycle, hence no deadlock,
with non-blocking sends.

A group is a maximal connected piece of the tree with one owner. Its program is cut further
where the postfix stack would exceed the kernel's fixed depth (a right-deep chain on one rank),
into local groups that write a scratch buffer.
"""

from __future__ import annotations

from .._record import Record
from ..model.coverage import Coverage
from ..model.delivery import DeliverTo, Delivery, ReplicateAll
from ..model.layout import Layout, LayoutLike
from ..model.topology import classify
from ..model.tree import Branch, Leaf, Node, expression
from .base import PlanBase, digest, layout_order_id
from .postfix import STACK_LIMIT, postfix, postfix_text, stack_cuts
from .validate import MAX_NODES, PlanRequest, validate

_set = object.__setattr__


# Edge, Group and Grouping are Records, not frozen dataclasses: a program's first reduction
# defines them (_record.py: the start-up budget).


class Edge(Record):
    """One planned message of the tree realization: `phase` ("r" reduce, "d" deliver) frame
    number `index` from `src` to `dst`, `nbytes` of payload."""

    __slots__ = ("index", "phase", "src", "dst", "nbytes")

    def __init__(self, index: int, phase: str, src: int, dst: int, nbytes: int) -> None:
        _set(self, "index", index)
        _set(self, "phase", phase)
        _set(self, "src", src)
        _set(self, "dst", dst)
        _set(self, "nbytes", nbytes)


class Group(Record):
    """One rank's piece of the tree: `inputs` (("leaf", slot) | ("edge", e) | ("group", g))
    combined by `program` (postfix: i >= 0 pushes inputs[i]; -1 adds, left operand pushed
    first) into `output` (("edge", e) | ("group", g) | ("root", 0))."""

    __slots__ = ("index", "rank", "inputs", "program", "output")

    def __init__(self, index: int, rank: int, inputs: tuple, program: tuple, output: tuple) -> None:
        _set(self, "index", index)
        _set(self, "rank", rank)
        _set(self, "inputs", inputs)
        _set(self, "program", program)
        _set(self, "output", output)

    def expression(self) -> str:
        return postfix_text(
            self.program, self.inputs, lambda x: {"leaf": "s", "edge": "e", "group": "g"}[x[0]] + str(x[1])
        )


class Plan(PlanBase):
    """The tree realization: its groups and edges (see the module docstring). The order each
    rank runs them in is its Program's: `realize(plan, "tree")` (realizations/tree.py).
    `edges`: the reduce edges (group order), then the deliver edges."""

    __slots__ = ("groups", "edges", "root_rank", "_slots_by_rank", "_edges_by_key")
    _extra = ("_slots_by_rank", "_edges_by_key")  # caches, made on first use
    __eq__ = Record.__eq__  # by every field (PlanBase's is by identity)
    __hash__ = Record.__hash__

    def __init__(
        self,
        realization: str,
        tree: Node,
        delivery: Delivery,
        layout: Layout,
        size: int,
        coverage: Coverage,
        topology: str,
        tree_order_id: str,
        layout_order_id: str,
        identity: str,
        receivers: frozenset[int],
        groups: tuple = (),
        edges: tuple = (),
        root_rank: int = 0,
    ) -> None:
        PlanBase.__init__(
            self, realization, tree, delivery, layout, size, coverage, topology, tree_order_id,
            layout_order_id, identity, receivers,
        )  # fmt: skip
        _set(self, "groups", groups)
        _set(self, "edges", edges)
        _set(self, "root_rank", root_rank)

    def slots_of(self, rank: int) -> tuple:
        """The leaves `rank` passes, in group order (one pass over the groups for all ranks)."""
        m = getattr(self, "_slots_by_rank", None)
        if m is None:
            m = {}
            for g in self.groups:
                m.setdefault(g.rank, []).extend(s for k, s in g.inputs if k == "leaf")
            m = {r: tuple(v) for r, v in m.items()}
            object.__setattr__(self, "_slots_by_rank", m)
        return m.get(rank, ())

    def edge(self, phase: str, index: int) -> Edge:
        return self._edge_map()[(phase, index)]

    def _edge_map(self):
        m = getattr(self, "_edges_by_key", None)
        if m is None:
            m = {(e.phase, e.index): e for e in self.edges}
            object.__setattr__(self, "_edges_by_key", m)
        return m

    # -- printing ---------------------------------------------------------------------------
    def to_dict(self, program=None) -> dict:
        """The plan as JSON-ready data; with `program` (its Program, `realize(plan, "tree")`)
        each rank's ops as text under "ranks"."""
        out = {
            **self.header_dict(),
            "tree": expression(self.tree, placed=True),
            "root_rank": self.root_rank,
            "groups": [
                {"index": g.index, "rank": g.rank, "expression": g.expression(), "output": list(g.output)}
                for g in self.groups
            ],
        }
        if program is not None:
            out["ranks"] = {str(r): program.rank(r).text() for r in range(self.size)}
        return out

    def describe(self, traffic=None, program=None) -> str:
        """The plan as text: tree, identities, groups; with `program` (its Program,
        `realize(plan, "tree")`) each rank's ops, with `traffic` (`simulate(plan)`) its table."""
        lines = [
            f"tree          {expression(self.tree, placed=True)}",
            f"topology      {self.topology}   delivery {self.delivery!r}   layout {self.layout.key()}",
            *self.header_lines(),
            f"root rank     {self.root_rank}   receivers {sorted(self.receivers)}",
            "groups:",
        ]
        for g in self.groups:
            out = {"edge": f"-> edge {g.output[1]}", "group": f"-> group {g.output[1]}", "root": "-> result"}[
                g.output[0]
            ]
            lines.append(f"  g{g.index} @r{g.rank}: {g.expression()} {out}")
        if program is not None:
            lines.append("schedule:")
            lines += [f"  r{r}: {program.rank(r).text()}" for r in range(self.size)]
        if traffic is not None:
            lines.append(traffic.table())
        return "\n".join(lines)

    def to_dot(self) -> str:
        lines = ["digraph plan {", "  rankdir=BT;"]
        for g in self.groups:
            lines.append(f'  g{g.index} [label="g{g.index} @r{g.rank}\\n{g.expression()}"];')
        producer = {g.output: g.index for g in self.groups}
        for g in self.groups:
            for kind, v in g.inputs:
                if kind in ("edge", "group"):
                    style = "solid" if kind == "edge" else "dashed"
                    lines.append(
                        f'  g{producer[(kind, v)]} -> g{g.index} [style={style}, label="{kind[0]}{v}"];'
                    )
        for e in self.edges:
            if e.phase == "d":
                lines.append(f'  r{e.src}_d -> r{e.dst}_d [color=blue, label="d{e.index}"];')
        lines.append("}")
        return "\n".join(lines)


# -- pass 1: group ------------------------------------------------------------------------------
class Grouping(Record):
    """The tree cut into groups: maximal one-owner pieces, cut again where the kernel's stack
    would overflow. `roots` in global postorder; `edge_of[id(root)]` numbers the roots whose
    parent lives on another rank (the reduce edges), in that order. `parent`: id(node) -> its
    Branch; `index`: id(root) -> group index; `edge_of`: id(root) -> reduce edge index."""

    __slots__ = ("parent", "roots", "root_ids", "index", "edge_of")
    _norepr = ("parent", "index", "edge_of")

    def __init__(
        self,
        parent: dict,
        roots: tuple = (),
        root_ids: frozenset = frozenset(),
        index: dict | None = None,  # None: a new empty dict (dataclasses' default_factory)
        edge_of: dict | None = None,
    ) -> None:
        _set(self, "parent", parent)
        _set(self, "roots", roots)
        _set(self, "root_ids", root_ids)
        _set(self, "index", {} if index is None else index)
        _set(self, "edge_of", {} if edge_of is None else edge_of)


def group(req: PlanRequest) -> Grouping:
    nodes = req.nodes
    parent = {}
    for node in nodes:
        if isinstance(node, Branch):
            parent[id(node.left)] = node
            parent[id(node.right)] = node
    owner_roots = [n for n in nodes if id(n) not in parent or parent[id(n)].owner != n.owner]
    members: dict[int, list] = {id(r): [] for r in owner_roots}
    root_of = {}
    for node in reversed(nodes):  # parents before children
        p = parent.get(id(node))
        root_of[id(node)] = node if (p is None or p.owner != node.owner) else root_of[id(p)]
    for node in nodes:
        members[id(root_of[id(node)])].append(node)
    root_ids = {id(r) for r in owner_roots}
    for r in owner_roots:  # stack-depth cuts become extra group roots on the same rank
        root_ids |= stack_cuts(members[id(r)], lambda node: isinstance(node, Leaf))
    roots = tuple(n for n in nodes if id(n) in root_ids)
    edge_of = {}
    for n in roots:
        p = parent.get(id(n))
        if p is not None and p.owner != n.owner:
            edge_of[id(n)] = len(edge_of)
    return Grouping(parent, roots, frozenset(root_ids), {id(n): i for i, n in enumerate(roots)}, edge_of)


# -- pass 2: lower the reduce ---------------------------------------------------------------------
def _group_program(root, gr: Grouping) -> tuple:
    """(inputs, postfix program) of the group rooted at `root`."""
    if isinstance(root, Leaf):  # a one-leaf group (its root may also be an edge's source)
        return (("leaf", root.slot),), (0,)

    def input_of(node):
        if id(node) in gr.edge_of:
            return ("edge", gr.edge_of[id(node)])
        if id(node) in gr.root_ids:
            return ("group", gr.index[id(node)])
        return ("leaf", node.slot) if isinstance(node, Leaf) else None

    return postfix(root, input_of)


def lower_reduce(req: PlanRequest, gr: Grouping) -> tuple:
    """(groups, reduce edges): a group's result goes up an edge where its parent lives on
    another rank."""
    nbytes = req.layout.nbytes
    groups, edges = [], []
    for g, root in enumerate(gr.roots):
        inputs, prog = _group_program(root, gr)
        if id(root) in gr.edge_of:
            e = gr.edge_of[id(root)]
            output = ("edge", e)
            edges.append(Edge(e, "r", root.owner, gr.parent[id(root)].owner, nbytes))
        elif id(root) in gr.parent:
            output = ("group", g)
        else:
            output = ("root", 0)
        groups.append(Group(g, root.owner, inputs, prog, output))
    return tuple(groups), tuple(edges)


# -- pass 3: lower the delivery -------------------------------------------------------------------
def lower_deliver(req: PlanRequest, gr: Grouping, groups: tuple, first_edge: int) -> tuple:
    """(deliver edges, receivers): the result travels down the group tree from the root's
    rank, each rank receiving it at most once."""
    nbytes = req.layout.nbytes
    parent_rank = {gr.index[id(n)]: gr.parent[id(n)].owner for n in gr.roots if id(n) in gr.parent}
    if isinstance(req.delivery, ReplicateAll):
        wanted = [g for g in reversed(groups) if g.output[0] != "root"]
        receivers = frozenset(g.rank for g in groups)
    else:  # DeliverTo: the path from the target's group nearest the root up to the root
        target = req.delivery.target
        first = next(g for g in reversed(groups) if g.rank == target)
        path, node = [], gr.roots[first.index]
        while id(node) in gr.parent:
            if id(node) in gr.root_ids:
                path.append(groups[gr.index[id(node)]])
            node = gr.parent[id(node)]
        wanted = list(reversed(path))
        receivers = frozenset([target])
    holders, edges = {req.tree.owner}, []
    for g in wanted:
        if g.rank in holders:
            continue
        edges.append(Edge(first_edge + len(edges), "d", parent_rank[g.index], g.rank, nbytes))
        holders.add(g.rank)
    return tuple(edges), receivers


def plan(
    tree: Node,
    delivery: ReplicateAll | DeliverTo | None = None,
    layout: LayoutLike = 1,
    *,
    size: int | None = None,
    coverage: Coverage | None = None,
) -> Plan:
    """Plan `tree` for `size` ranks (default: highest owner + 1): validate, group, lower the
    reduce, lower the delivery (see the module docstring). `delivery`: ReplicateAll() (default)
    or DeliverTo(rank); `layout`: a Layout or an element count. Returns a frozen Plan; refuses
    a malformed tree, coverage, placement, delivery or size by its code."""
    req = validate(tree, delivery, layout, size=size, coverage=coverage)
    gr = group(req)
    groups, up = lower_reduce(req, gr)
    down, receivers = lower_deliver(req, gr, groups, len(up))
    tree = req.tree
    return Plan(
        realization="tree",
        tree=tree,
        delivery=req.delivery,
        layout=req.layout,
        size=req.size,
        coverage=req.coverage,
        topology=classify(tree),
        tree_order_id=tree.order_id,
        layout_order_id=layout_order_id(tree.order_id, req.layout),
        identity=digest("alpha-mpi/plan/v1", tree.identity, req.delivery.key(), req.layout.key(), "tree"),
        receivers=receivers,
        groups=groups,
        edges=up + down,
        root_rank=tree.owner,
    )


__all__ = [
    "Plan",
    "Edge",
    "Group",
    "Grouping",
    "plan",
    "group",
    "lower_reduce",
    "lower_deliver",
    "STACK_LIMIT",
    "MAX_NODES",
]
