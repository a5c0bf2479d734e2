"""The scatter realization of a declared tree: where each coordinate is computed (pure).

A declared tree fixes the floating-point order per coordinate, not the rank that computes it.
The scatter realization cuts the payload's coordinates into `size` contiguous chunks (sizes
differ by at most one; chunk c belongs to rank c; with fewer coordinates than ranks some chunks
are empty and nobody sends anything for them) and evaluates the WHOLE tree for chunk c at rank c:

1. scatter phase: every leaf owner o sends chunk c of each slot it owns to rank c, all of its
   slots' pieces packed into one frame per (sender, chunk owner) and segment (below);
2. rank c evaluates the tree over its chunk with the fused kernel: one `tree_eval` over all
   leaves' pieces, the program being the tree's postfix order with leaves as inputs, cut where
   the stack would exceed the kernel's depth exactly as the tree planner cuts (the groups come
   from `plan()` of the same tree placed on one rank);
3. gather phase: rank c sends its reduced chunk to every receiver (`ReplicateAll`: every rank
   that owns a node of the tree, the same ranks the tree realization delivers to;
   `DeliverTo(t)`: rank t only), or keeps it (`ReduceScatter`: every rank ends with only its own
   chunk; a header-only frame per peer still carries the finiteness flag, so that all ranks
   refuse a non-finite combine together).

Every coordinate still follows the declared tree, so the bits equal the tree realization's;
each rank moves 2(p-1)/p of the vector (one slot per rank), like a ring or Rabenseifner
allreduce. Chunks longer than `segment` elements travel as several frames of at most `segment`
elements (one per segment; a chunk that fits travels as one frame), so that transfers, the
kernel and the copies pipeline through small reused buffers that stay in cache.

The plan has its own identity (realization "scatter", the chunking and the segment length are
in the digest) and the SAME order id as the tree plan: two realizations of one numerical
contract. Frames carry the phase (scatter / gather), the segment index as the edge, sender,
receiver, and a layout digest naming the coordinate range, so a misrouted piece is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..model.coverage import check_coverage, default_coverage
from ..model.delivery import DeliverTo, ReduceScatter, ReplicateAll, check_delivery
from ..model.layout import Layout, as_layout
from ..model.topology import classify
from ..model.tree import Branch, Leaf, Node, expression, leaf_sequence, postorder
from ..refusals import ModelRefusal, PlanRefusal
from .combine_plan import MAX_NODES, Plan, _digest, _validate_owners, order_id_with_layout
from .combine_plan import plan as plan_tree
from .steps import Step

# Elements per segment: 64 Ki binary64 = 512 KiB per piece, small enough that the reused frame
# buffers of a 2-4 deep pipeline stay in L2/L3, large enough that per-frame overhead (~10 us of
# Python and MPI) stays under a few percent of the copy time.
DEFAULT_SEGMENT = 1 << 16


def chunk_bounds(n: int, size: int) -> tuple:
    """Contiguous chunks of 0..n-1, one per rank, sizes differing by at most one.

    The first n % size chunks hold one element more; with n < size the chunks of ranks
    n..size-1 are empty.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ModelRefusal("layout-invalid", f"need a coordinate count >= 0, got {n!r}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise PlanRefusal("plan-rank-mismatch", f"size must be an int >= 1, got {size!r}")
    q, r = divmod(n, size)
    out = []
    for c in range(size):
        start = c * q + min(c, r)
        out.append((start, start + q + (1 if c < r else 0)))
    return tuple(out)


def segment_bounds(start: int, stop: int, segment: int) -> tuple:
    """[start, stop) cut into pieces of `segment` elements (the last may be shorter)."""
    return tuple((a, min(a + segment, stop)) for a in range(start, stop, segment))


@dataclass(frozen=True)
class Frame:
    """One planned scatter-realization message (payload bytes exclude the 128-byte header)."""

    phase: str  # "s" scatter (leaf pieces to the chunk owner), "g" gather (reduced chunk out)
    src: int
    dst: int
    segment: int  # index of the segment within the chunk; the frame header's edge field
    start: int  # coordinate range [start, stop) of the chunk segment it carries
    stop: int
    pieces: int  # slot pieces packed (scatter), 1 (gather), 0 (a header-only flag frame)

    @property
    def count(self) -> int:
        return self.pieces * (self.stop - self.start)

    @property
    def nbytes(self) -> int:
        return 8 * self.count

    def layout_key(self, layout: Layout) -> str:
        return f"{layout.key()}|{self.phase}:{self.start}:{self.stop}x{self.pieces}"


@dataclass(frozen=True)
class ScatterPlan:
    tree: Node = field(repr=False)
    delivery: object
    layout: Layout
    size: int
    coverage: object
    topology: str
    tree_order_id: str
    order_id: str  # the same as the tree plan's: one declared order, two realizations
    identity: str
    chunks: tuple  # chunks[c] = (start, stop) of rank c
    segment: int
    owner_slots: tuple  # owner_slots[r] = slots of rank r, in the tree's left-to-right order
    groups: tuple  # Group(inputs ("leaf", slot) | ("group", g), postfix program, output)
    receivers: frozenset  # ranks whose run returns the (whole) result
    realization: str = "scatter"

    @property
    def payload_bytes(self) -> int:
        return self.layout.nbytes

    @property
    def mode(self) -> str:
        return "reduce-scatter" if isinstance(self.delivery, ReduceScatter) else "allreduce"

    def chunk(self, rank: int) -> tuple:
        return self.chunks[rank]

    def segments(self, rank: int) -> tuple:
        start, stop = self.chunks[rank]
        return segment_bounds(start, stop, self.segment)

    def slots_of(self, rank: int) -> tuple:
        if not 0 <= rank < self.size:
            raise PlanRefusal("plan-rank-mismatch", f"rank {rank} outside a plan for {self.size} ranks")
        return self.owner_slots[rank]

    def gather_targets(self, c: int) -> tuple:
        """Ranks chunk owner c sends its reduced chunk (or, reduce-scatter, its flag) to."""
        if self.mode == "reduce-scatter":
            if self.chunks[c][1] == self.chunks[c][0]:
                return ()
            return tuple(r for r in _rotation(c, self.size) if r != c)
        if self.chunks[c][1] == self.chunks[c][0]:
            return ()
        return tuple(r for r in _rotation(c, self.size) if r != c and r in self.receivers)

    def frames_from(self, rank: int) -> tuple:
        """Frames `rank` sends, in the order it sends them (segment by segment, destinations
        rotating from rank+1 so that no chunk owner is everybody's first target)."""
        out = []
        k = len(self.owner_slots[rank])
        if k:
            dests = [
                c for c in _rotation(rank, self.size) if c != rank and self.chunks[c][1] > self.chunks[c][0]
            ]
            segs = {c: self.segments(c) for c in dests}
            for j in range(max((len(s) for s in segs.values()), default=0)):
                for c in dests:
                    if j < len(segs[c]):
                        a, b = segs[c][j]
                        out.append(Frame("s", rank, c, j, a, b, k))
        out.extend(self._gather_frames(rank))
        return tuple(out)

    def _gather_frames(self, c: int) -> list:
        targets = self.gather_targets(c)
        if not targets:
            return []
        if self.mode == "reduce-scatter":
            a, b = self.chunks[c]
            return [Frame("g", c, r, 0, a, b, 0) for r in targets]
        return [Frame("g", c, r, j, a, b, 1) for j, (a, b) in enumerate(self.segments(c)) for r in targets]

    def frames_to(self, rank: int) -> tuple:
        """Frames `rank` receives: scatter pieces of its chunk, then gathered chunks / flags."""
        out = []
        segs = self.segments(rank)
        for o in _rotation(rank, self.size):
            k = len(self.owner_slots[o])
            if o != rank and k:
                out.extend(Frame("s", o, rank, j, a, b, k) for j, (a, b) in enumerate(segs))
        for c in _rotation(rank, self.size):
            if c != rank:
                out.extend(f for f in self._gather_frames(c) if f.dst == rank)
        return tuple(out)

    def rank_program(self, rank: int) -> tuple:
        """The rank's protocol as Steps (for printing): sends and receives of the scatter phase,
        one evaluation per segment of its chunk, then the gather phase. Steps name the segment
        index as their edge."""
        if not 0 <= rank < self.size:
            raise PlanRefusal("plan-rank-mismatch", f"rank {rank} outside a plan for {self.size} ranks")
        sends = self.frames_from(rank)
        recvs = self.frames_to(rank)
        steps = [Step("S", f.segment, "s", f.dst, f.nbytes) for f in sends if f.phase == "s"]
        steps += [Step("R", f.segment, "s", f.src, f.nbytes) for f in recvs if f.phase == "s"]
        steps += [Step("E", j) for j in range(len(self.segments(rank)))]
        steps += [Step("S", f.segment, "g", f.dst, f.nbytes) for f in sends if f.phase == "g"]
        steps += [Step("R", f.segment, "g", f.src, f.nbytes) for f in recvs if f.phase == "g"]
        return tuple(steps)

    @property
    def programs(self) -> tuple:
        return tuple(self.rank_program(r) for r in range(self.size))

    # -- printing ---------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "realization": self.realization,
            "mode": self.mode,
            "topology": self.topology,
            "delivery": repr(self.delivery),
            "layout": self.layout.key(),
            "size": self.size,
            "order_id": self.order_id,
            "tree_order_id": self.tree_order_id,
            "identity": self.identity,
            "segment": self.segment,
            "chunks": [list(c) for c in self.chunks],
            "receivers": sorted(self.receivers),
            "tree": expression(self.tree, placed=True),
            "groups": [
                {"index": g.index, "expression": g.expression(), "output": list(g.output)}
                for g in self.groups
            ],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def describe(self, traffic=None) -> str:
        lines = [
            f"tree        {expression(self.tree, placed=True)}",
            f"realization scatter ({self.mode})   topology {self.topology}   delivery {self.delivery!r}   "
            f"layout {self.layout.key()}",
            f"order id    {self.order_id}",
            f"identity    {self.identity}",
            f"segment     {self.segment} elements   receivers {sorted(self.receivers)}",
            "chunks:",
        ]
        for c, (a, b) in enumerate(self.chunks):
            lines.append(f"  r{c}: [{a}, {b}) {len(self.segments(c))} segment(s)")
        lines.append("evaluated at every chunk owner:")
        for g in self.groups:
            out = {"group": f"-> group {g.output[1]}", "root": "-> chunk result"}[g.output[0]]
            lines.append(f"  g{g.index}: {g.expression()} {out}")
        lines.append("schedule:")
        for r in range(self.size):
            steps = self.rank_program(r)
            lines.append(f"  r{r}: " + (" ".join(map(str, steps)) if steps else "(idle)"))
        if traffic is not None:
            lines.append(traffic.table())
        return "\n".join(lines)


def _rotation(rank: int, size: int):
    return [(rank + i) % size for i in range(size)]


def _single_owner_copy(tree: Node) -> Node:
    """The same order with every node on rank 0 (for reusing the planner's program cutting)."""
    built = {}
    for node in postorder(tree):
        if isinstance(node, Leaf):
            built[id(node)] = Leaf(node.slot, 0)
        else:
            built[id(node)] = Branch(built.pop(id(node.left)), built.pop(id(node.right)), 0)
    return built[id(tree)]


def plan_scatter(
    tree, delivery=None, layout=1, *, size: int | None = None, coverage=None, segment: int | None = None
) -> ScatterPlan:
    """Plan the scatter realization of `tree` (a Node, or a tree Plan whose tree, delivery,
    layout, size and coverage are reused). `delivery`: ReplicateAll(), DeliverTo(rank) or
    ReduceScatter(). See the module docstring."""
    if isinstance(tree, Plan):
        base = tree
        tree = base.tree
        delivery = base.delivery if delivery is None else delivery
        layout = base.layout
        size = base.size if size is None else size
        coverage = base.coverage if coverage is None else coverage
    if not isinstance(tree, Node):
        raise ModelRefusal("tree-malformed", f"expected a Leaf or Branch, got {type(tree).__name__}")
    delivery = ReplicateAll() if delivery is None else delivery
    if not isinstance(delivery, ReduceScatter):
        check_delivery(delivery)
    layout = as_layout(layout)
    if segment is None:
        segment = DEFAULT_SEGMENT
    if isinstance(segment, bool) or not isinstance(segment, int) or segment < 1:
        raise PlanRefusal("plan-rank-mismatch", f"segment must be an int >= 1 (elements), got {segment!r}")
    nodes = postorder(tree)
    if len(nodes) > MAX_NODES:
        raise ModelRefusal("tree-too-large", f"{len(nodes)} nodes exceed the limit of {MAX_NODES}")
    coverage = default_coverage(tree) if coverage is None else coverage
    check_coverage(tree, coverage)
    if size is None:
        size = max(n.owner for n in nodes) + 1
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise PlanRefusal("plan-rank-mismatch", f"size must be an int >= 1, got {size!r}")
    _validate_owners(tree, size)
    leaves = leaf_sequence(tree)
    if isinstance(delivery, DeliverTo):
        if delivery.target >= size or not any(leaf.owner == delivery.target for leaf in leaves):
            raise ModelRefusal(
                "delivery-target-not-owner",
                f"DeliverTo({delivery.target}) names a rank that owns no leaf of this tree",
            )
        receivers = frozenset([delivery.target])
    elif isinstance(delivery, ReduceScatter):
        receivers = frozenset()
    else:  # the same ranks the tree realization delivers to: every owner of a node
        receivers = frozenset(n.owner for n in nodes)

    owner_slots = [[] for _ in range(size)]
    for leaf in leaves:
        owner_slots[leaf.owner].append(leaf.slot)
    # The whole tree at one rank: the planner's groups, cut where the kernel's stack would
    # overflow, with leaves as inputs. Every chunk owner runs these programs over its chunk.
    local = plan_tree(_single_owner_copy(tree), ReplicateAll(), layout, size=1, coverage=coverage)
    chunks = chunk_bounds(layout.total, size)
    tree_order = tree.order_id
    chunking = f"chunks={size}x{layout.total};segment={segment};" + ",".join(f"{a}:{b}" for a, b in chunks)
    return ScatterPlan(
        tree=tree,
        delivery=delivery,
        layout=layout,
        size=size,
        coverage=coverage,
        topology=classify(tree),
        tree_order_id=tree_order,
        order_id=order_id_with_layout(tree_order, layout),
        identity=_digest(
            "alpha-mpi/plan/v1", tree.identity, delivery.key(), layout.key(), "scatter", chunking
        ),
        chunks=chunks,
        segment=segment,
        owner_slots=tuple(tuple(s) for s in owner_slots),
        groups=local.groups,
        receivers=receivers,
    )


def scatter_traffic(splan: ScatterPlan):
    """Count every planned frame (payload bytes, as the tree simulator counts) and check that
    each one is received exactly once by its addressee; returns a simulate.Traffic."""
    from .simulate import Traffic

    p = splan.size
    t = Traffic(p, [0] * p, [0] * p, [0] * p, [0] * p)
    sent = {}
    for r in range(p):
        for f in splan.frames_from(r):
            key = (f.phase, f.src, f.dst, f.segment)
            if key in sent:
                raise PlanRefusal("plan-simulation-failed", f"frame {key} planned twice")
            sent[key] = f
            t.sent_msgs[r] += 1
            t.sent_bytes[r] += f.nbytes
    got = set()
    for r in range(p):
        for f in splan.frames_to(r):
            key = (f.phase, f.src, f.dst, f.segment)
            if sent.get(key) != f:
                raise PlanRefusal("plan-simulation-failed", f"rank {r} expects frame {key} that nobody sends")
            got.add(key)
            t.recv_msgs[r] += 1
            t.recv_bytes[r] += f.nbytes
    if got != set(sent):
        raise PlanRefusal(
            "plan-simulation-failed", f"frames sent but never received: {sorted(set(sent) - got)[:4]}"
        )
    for i, key in enumerate(sorted(sent)):
        f = sent[key]
        t.per_edge[(f.phase, i)] = (f.src, f.dst, f.nbytes)
    return t
