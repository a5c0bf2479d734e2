"""The planner: tree + delivery + payload layout -> every rank's protocol (pure, deterministic).

Protocol, as every rank runs it (execution/ follows this and nothing else):
1. Post one receive per `R` step of the rank, from the named peer, of exactly the frame size.
2. Walk the steps in order. `E g` waits for the receives feeding group g, then evaluates the
   group's postfix program over its inputs (local contributions, received payloads, results of
   earlier local groups) in one fused kernel pass, writing straight into the payload of the
   outgoing frame, a scratch buffer, or the result. `S e` starts the send of edge e.
3. Deliver phase: a rank waits for its single `dR` (unless it is the root) and starts its `dS`
   sends of the same value.
Groups run in the global postorder of their roots, so any group waits only on groups that come
earlier in that order: no cycle, hence no deadlock, with non-blocking sends.

A group is a maximal connected piece of the tree with one owner. Its program is cut further
where the postfix stack would exceed the kernel's fixed depth (a right-deep chain on one rank),
into local groups that write a scratch buffer.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from ..model.coverage import check_coverage, default_coverage
from ..model.delivery import DeliverTo, ReplicateAll, check_delivery
from ..model.layout import Layout, as_layout
from ..model.topology import classify
from ..model.tree import Branch, Leaf, Node, expression, postorder
from ..refusals import ModelRefusal, PlanRefusal
from .steps import Edge, Step

# The kernel evaluates programs with a fixed stack of block buffers; keep well inside it.
STACK_LIMIT = 32
# Frames name edges in 32-bit fields and MPI tags must stay under MPI_TAG_UB (>= 32767).
MAX_NODES = 1 << 20


@dataclass(frozen=True)
class Group:
    index: int
    rank: int
    inputs: tuple  # ("leaf", slot) | ("edge", e) | ("group", g)
    program: tuple  # postfix: i >= 0 pushes inputs[i]; -1 adds (left operand pushed first)
    output: tuple  # ("edge", e) | ("group", g) | ("root", 0)

    def expression(self) -> str:
        stack = []
        for op in self.program:
            if op == -1:
                right, left = stack.pop(), stack.pop()
                stack.append(f"({left}+{right})")
            else:
                kind, v = self.inputs[op]
                stack.append({"leaf": "s", "edge": "e", "group": "g"}[kind] + str(v))
        return stack[0]


@dataclass(frozen=True)
class Plan:
    tree: Node = field(repr=False)
    delivery: object
    layout: Layout
    size: int
    coverage: object
    topology: str
    tree_order_id: str
    order_id: str
    identity: str
    groups: tuple
    edges: tuple
    programs: tuple  # programs[rank] = tuple of Steps
    root_rank: int
    receivers: frozenset  # ranks whose combine() returns the result
    realization: str = "tree"

    @property
    def payload_bytes(self) -> int:
        return self.layout.nbytes

    def rank_program(self, rank: int) -> tuple:
        if not 0 <= rank < self.size:
            raise PlanRefusal("plan-rank-mismatch", f"rank {rank} outside a plan for {self.size} ranks")
        return self.programs[rank]

    def slots_of(self, rank: int) -> tuple:
        return tuple(s for g in self.groups if g.rank == rank for k, s in g.inputs if k == "leaf")

    def edge(self, phase: str, index: int) -> Edge:
        return self._edge_map()[(phase, index)]

    def _edge_map(self):
        m = self.__dict__.get("_edges_by_key")
        if m is None:
            m = {(e.phase, e.index): e for e in self.edges}
            object.__setattr__(self, "_edges_by_key", m)
        return m

    # -- printing ---------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "realization": self.realization,
            "topology": self.topology,
            "delivery": repr(self.delivery),
            "layout": self.layout.key(),
            "size": self.size,
            "order_id": self.order_id,
            "tree_order_id": self.tree_order_id,
            "identity": self.identity,
            "tree": expression(self.tree, placed=True),
            "root_rank": self.root_rank,
            "receivers": sorted(self.receivers),
            "groups": [
                {"index": g.index, "rank": g.rank, "expression": g.expression(), "output": list(g.output)}
                for g in self.groups
            ],
            "ranks": {str(r): [str(s) for s in steps] for r, steps in enumerate(self.programs)},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def describe(self, traffic=None) -> str:
        lines = [
            f"tree        {expression(self.tree, placed=True)}",
            f"topology    {self.topology}   delivery {self.delivery!r}   layout {self.layout.key()}",
            f"order id    {self.order_id}",
            f"identity    {self.identity}",
            f"root rank   {self.root_rank}   receivers {sorted(self.receivers)}",
            "groups:",
        ]
        for g in self.groups:
            out = {"edge": f"-> edge {g.output[1]}", "group": f"-> group {g.output[1]}", "root": "-> result"}[
                g.output[0]
            ]
            lines.append(f"  g{g.index} @r{g.rank}: {g.expression()} {out}")
        lines.append("schedule:")
        for r, steps in enumerate(self.programs):
            lines.append(f"  r{r}: " + (" ".join(map(str, steps)) if steps else "(idle)"))
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


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


def order_id_with_layout(tree_order_id: str, layout: Layout) -> str:
    """The declared order bound to a payload layout: what numerical contracts and frames name."""
    return _digest("alpha-mpi/order+layout/v1", tree_order_id, layout.key())


def _validate_owners(tree: Node, size: int) -> None:
    for node in postorder(tree):
        if node.owner >= size:
            kind = "leaf slot %d" % node.slot if isinstance(node, Leaf) else "a branch"
            raise ModelRefusal(
                "owner-out-of-range",
                f"{kind} is placed on rank {node.owner} but the plan has {size} rank(s)",
                owner=node.owner,
            )


def _cut_deep(nodes_in_group, owner_of_group) -> set:
    """Nodes whose subtree must be evaluated as a separate local group to bound stack depth."""
    need, cuts = {}, set()
    for node in nodes_in_group:  # postorder
        if isinstance(node, Leaf):
            need[id(node)] = 1
            continue
        nl = need.get(id(node.left), 1)
        nr = need.get(id(node.right), 1)
        if nl >= STACK_LIMIT:
            cuts.add(id(node.left))
            nl = 1
        if nr >= STACK_LIMIT:
            cuts.add(id(node.right))
            nr = 1
        need[id(node)] = max(nl, nr + 1)
    return cuts


def plan(tree: Node, delivery=None, layout=1, *, size: int | None = None, coverage=None) -> Plan:
    """Plan `tree` for `size` ranks (default: highest owner + 1). See the module docstring."""
    if not isinstance(tree, Node):
        raise ModelRefusal("tree-malformed", f"expected a Leaf or Branch, got {type(tree).__name__}")
    delivery = ReplicateAll() if delivery is None else delivery
    check_delivery(delivery)
    layout = as_layout(layout)
    nodes = postorder(tree)
    if len(nodes) > MAX_NODES:
        raise ModelRefusal("tree-too-large", f"{len(nodes)} nodes exceed the limit of {MAX_NODES}")
    coverage = default_coverage(tree) if coverage is None else coverage
    check_coverage(tree, coverage)
    top_owner = max(n.owner for n in nodes)
    if size is None:
        size = top_owner + 1
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise PlanRefusal("plan-rank-mismatch", f"size must be an int >= 1, got {size!r}")
    _validate_owners(tree, size)
    if isinstance(delivery, DeliverTo):
        if delivery.target >= size or not any(
            isinstance(n, Leaf) and n.owner == delivery.target for n in nodes
        ):
            raise ModelRefusal(
                "delivery-target-not-owner",
                f"DeliverTo({delivery.target}) names a rank that owns no leaf of this tree",
            )

    parent = {}
    for node in nodes:
        if isinstance(node, Branch):
            parent[id(node.left)] = node
            parent[id(node.right)] = node
    roots = [n for n in nodes if id(n) not in parent or parent[id(n)].owner != n.owner]

    # Stack-depth cuts become extra group roots on the same rank.
    members: dict[int, list] = {}
    for r in roots:
        members[id(r)] = []
    root_of = {}
    for node in reversed(nodes):  # preorder-ish: parents before children
        p = parent.get(id(node))
        root_of[id(node)] = node if (p is None or p.owner != node.owner) else root_of[id(p)]
    for node in nodes:
        members[id(root_of[id(node)])].append(node)
    cut_ids = set()
    for r in roots:
        cut_ids |= _cut_deep(members[id(r)], r.owner)
    root_ids = {id(r) for r in roots} | cut_ids
    group_roots = [n for n in nodes if id(n) in root_ids]  # global postorder
    gindex = {id(n): i for i, n in enumerate(group_roots)}
    # Edges: one per group root whose parent lives on another rank, numbered in postorder.
    edge_of = {}
    for n in group_roots:
        p = parent.get(id(n))
        if p is not None and p.owner != n.owner:
            edge_of[id(n)] = len(edge_of)

    nbytes = layout.nbytes
    groups, edges = [], []
    for g, root in enumerate(group_roots):
        inputs, prog = [], []
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if node is not root and id(node) in root_ids:
                if id(node) in edge_of:
                    inputs.append(("edge", edge_of[id(node)]))
                else:
                    inputs.append(("group", gindex[id(node)]))
                prog.append(len(inputs) - 1)
            elif isinstance(node, Leaf):
                inputs.append(("leaf", node.slot))
                prog.append(len(inputs) - 1)
            elif expanded:
                prog.append(-1)
            else:
                stack.append((node, True))
                stack.append((node.right, False))
                stack.append((node.left, False))
        if id(root) in edge_of:
            e = edge_of[id(root)]
            output = ("edge", e)
            edges.append(Edge(e, "r", root.owner, parent[id(root)].owner, nbytes))
        elif id(root) in parent:
            output = ("group", g)
        else:
            output = ("root", 0)
        groups.append(Group(g, root.owner, tuple(inputs), tuple(prog), output))

    programs: list[list] = [[] for _ in range(size)]
    for grp in groups:
        steps = programs[grp.rank]
        for kind, v in grp.inputs:
            if kind == "edge":
                steps.append(Step("R", v, "r", edges[v].src, nbytes))
        steps.append(Step("E", grp.index))
        if grp.output[0] == "edge":
            e = grp.output[1]
            steps.append(Step("S", e, "r", edges[e].dst, nbytes))

    # Deliver phase: down the group tree, each rank receiving at most once.
    root_rank = tree.owner
    group_parent_rank = {}
    for n in group_roots:
        p = parent.get(id(n))
        if p is not None:
            group_parent_rank[gindex[id(n)]] = p.owner
    if isinstance(delivery, ReplicateAll):
        wanted = [gr for gr in reversed(groups) if gr.output[0] != "root"]
        receivers = frozenset(g.rank for g in groups)
    else:
        target = delivery.target
        # Path from the target's first group (nearest the root) up to the root.
        first = next(gr for gr in reversed(groups) if gr.rank == target)
        path = []
        node = group_roots[first.index]
        while id(node) in parent:
            if id(node) in root_ids:
                path.append(groups[gindex[id(node)]])
            node = parent[id(node)]
        wanted = list(reversed(path))
        receivers = frozenset([target])
    holders = {root_rank}
    deliver_steps: dict[int, list] = {r: [] for r in range(size)}
    for gr in wanted:
        if gr.rank in holders:
            continue
        src = group_parent_rank[gr.index]
        e = len(edges)
        edges.append(Edge(e, "d", src, gr.rank, nbytes))
        deliver_steps[gr.rank].insert(0, Step("R", e, "d", src, nbytes))
        deliver_steps[src].append(Step("S", e, "d", gr.rank, nbytes))
        holders.add(gr.rank)
    for r in range(size):
        programs[r].extend(deliver_steps[r])

    tree_order = tree.order_id
    return Plan(
        tree=tree,
        delivery=delivery,
        layout=layout,
        size=size,
        coverage=coverage,
        topology=classify(tree),
        tree_order_id=tree_order,
        order_id=order_id_with_layout(tree_order, layout),
        identity=_digest("alpha-mpi/plan/v1", tree.identity, delivery.key(), layout.key(), "tree"),
        groups=tuple(groups),
        edges=tuple(edges),
        programs=tuple(tuple(p) for p in programs),
        root_rank=root_rank,
        receivers=receivers,
    )
