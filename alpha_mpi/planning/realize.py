"""Realizations of one declared tree, lowered to the one program format (pure).

Every realization of a tree gives the tree's bits and shares its order id; each has its own
identity (named by every frame), so a peer running another realization is refused by name:

    tree       reduce up the placed tree, deliver down (any tree; the declared placement)
    scatter    each chunk's whole tree at one rank, chunks gathered (any tree)
    replicate  allgather the top's operands (Bruck), every rank evaluates the top (any tree)
    butterfly  recursive doubling over a balanced rank-level top (p a power of two)
    halving    recursive halving reduce-scatter + recursive doubling allgather (same shape)

`realize(tree_plan, name)` builds the Program; `applicable(tree_plan)` lists the names that
apply with the reason for each that does not.
"""

from __future__ import annotations

from collections.abc import Callable

from ..model.coverage import Coverage
from ..model.delivery import DeliverTo, Delivery, ReduceScatter, ReplicateAll
from ..model.layout import LayoutLike
from ..model.tree import Node
from ..refusals import PlanRefusal, Refusal
from .base import digest
from .builder import RankBuilder, is_split
from .butterfly import lower_butterfly
from .combine_plan import Plan
from .combine_plan import plan as plan_tree
from .gather import DEFAULT_SEGMENT, chunk_bounds, lower_replicate, lower_scatter
from .halving import lower_halving
from .program import Eval, Message, Program, RankProgram
from .ranktop import top_of

REALIZATIONS = ("tree", "scatter", "replicate", "butterfly", "halving")
# Realizations that can stop after their reduce-scatter half (the learners' grads/params modes).
REDUCE_SCATTER = ("halving", "scatter")


def as_tree_plan(
    tree: Node | Plan,
    delivery: ReplicateAll | DeliverTo | None = None,
    layout: LayoutLike = 1,
    *,
    size: int | None = None,
    coverage: Coverage | None = None,
) -> Plan:
    """A tree Plan (validation once: tree, coverage, owners, delivery, layout)."""
    if isinstance(tree, Plan):
        return tree
    return plan_tree(tree, delivery, layout, size=size, coverage=coverage)


def _check_name(name: str) -> None:
    if name not in REALIZATIONS:
        raise Refusal(
            "usage", f"realization must be one of {', '.join(REALIZATIONS)} (or auto), got {name!r}"
        )


def applicable(tp: Plan, mode: str = "allreduce") -> dict[str, str | None]:
    """name -> None if it applies to this tree plan, else the reason it does not."""
    out: dict[str, str | None] = {}
    for name in REALIZATIONS:
        try:
            _why_not(tp, name, mode)
            out[name] = None
        except PlanRefusal as e:
            out[name] = e.message
    return out


def _why_not(tp: Plan, name: str, mode: str) -> dict | None:
    if mode == "reduce-scatter" and name not in REDUCE_SCATTER:
        raise PlanRefusal(
            "realization-inapplicable",
            f"{name}: has no reduce-scatter form (use halving or scatter)",
            realization=name,
        )
    if name in ("butterfly", "halving"):
        return top_of(tp.tree, tp.size, name)
    return None


def realize(
    tree: Node | Plan,
    name: str,
    *,
    delivery: Delivery | None = None,
    layout: LayoutLike | None = None,
    size: int | None = None,
    coverage: Coverage | None = None,
    mode: str = "allreduce",
    segment: int | None = None,
) -> Program:
    """Lower one realization of `tree` (a Node with layout/size, or a tree Plan) to a Program.
    `mode`: "allreduce" (the plan's delivery) or "reduce-scatter" (rank r ends with chunks[r]);
    `delivery=ReduceScatter()` is the same as mode="reduce-scatter". Refuses a realization that
    does not apply (`realization-inapplicable`, naming those that do)."""
    _check_name(name)
    if isinstance(delivery, ReduceScatter):
        delivery, mode = None, "reduce-scatter"
    if isinstance(tree, Plan) and delivery is not None and delivery != tree.delivery:
        tree = plan_tree(tree.tree, delivery, tree.layout, size=tree.size, coverage=tree.coverage)
    tp = as_tree_plan(tree, delivery, 1 if layout is None else layout, size=size, coverage=coverage)
    if mode not in ("allreduce", "reduce-scatter"):
        raise Refusal("usage", f"mode must be allreduce or reduce-scatter, got {mode!r}")
    try:
        top = _why_not(tp, name, mode)
    except PlanRefusal as e:
        ok = [k for k, v in applicable(tp, mode).items() if v is None]
        raise PlanRefusal(
            "realization-inapplicable",
            f"{e.message}; realizations that apply here: {', '.join(ok)}",
            realization=name,
            applicable=ok,
        ) from None
    if segment is None:
        segment = DEFAULT_SEGMENT
    if isinstance(segment, bool) or not isinstance(segment, int) or segment < 1:
        raise PlanRefusal("segment-invalid", f"segment must be an int >= 1 (elements), got {segment!r}")
    n, p = tp.layout.total, tp.size
    receivers = frozenset() if mode == "reduce-scatter" else tp.receivers
    delivery = ReduceScatter() if mode == "reduce-scatter" else tp.delivery
    chunks, rounds, extra = None, 0, ""
    if name == "tree":
        builder, rounds = lower_tree(tp), _tree_rounds(tp)
    elif name == "butterfly":
        builder, rounds = lower_butterfly(top, tp.layout, p, receivers)
    elif name == "halving":
        builder, rounds, chunks = lower_halving(top, tp.layout, p, receivers, mode)
        extra = "chunks=" + ",".join(f"{a}:{b}" for a, b in chunks)
    elif name == "replicate":
        builder = lower_replicate(tp.tree, tp.layout, p, receivers)
        rounds = (p - 1).bit_length()
    else:
        builder, chunks = lower_scatter(tp.tree, tp.layout, p, receivers, mode, segment)
        rounds = 2 if mode == "allreduce" else 1 + (p - 1).bit_length()
        extra = f"segment={segment};chunks=" + ",".join(f"{a}:{b}" for a, b in chunk_bounds(n, p))
        if mode == "allreduce":
            chunks = None
    identity = (
        tp.identity
        if name == "tree"
        else digest(
            "alpha-mpi/realization/v1", tp.tree.identity, delivery.key(), tp.layout.key(), name, mode, extra
        )
    )
    return Program(
        realization=name,
        tree=tp.tree,
        delivery=delivery,
        layout=tp.layout,
        size=p,
        coverage=tp.coverage,
        topology=tp.topology,
        tree_order_id=tp.tree_order_id,
        layout_order_id=tp.layout_order_id,
        identity=identity,
        receivers=receivers,
        builder=builder,
        mode=mode,
        chunks=chunks,
        rounds=rounds,
        details={"segment": segment} if name == "scatter" else {},
    )


def plan_scatter(
    tree: Node | Plan,
    delivery: Delivery | None = None,
    layout: LayoutLike = 1,
    *,
    size: int | None = None,
    coverage: Coverage | None = None,
    segment: int | None = None,
) -> Program:
    """The scatter realization of `tree` (a Node, or a tree Plan whose tree, layout, size and
    coverage are reused): `realize(tree, "scatter", ...)`. `delivery`: ReplicateAll() (default),
    DeliverTo(rank), or ReduceScatter() (rank r keeps chunk r of the result)."""
    return realize(
        tree, "scatter", delivery=delivery, layout=layout, size=size, coverage=coverage, segment=segment
    )


def _tree_rounds(tp: Plan) -> int:
    """Sequential hops on the tree realization's critical path (reduce up, deliver down)."""
    depth = {}
    producer = {g.output[1]: g.index for g in tp.groups if g.output[0] == "edge"}
    for g in tp.groups:
        d = 0
        for kind, v in g.inputs:
            if kind == "edge":
                d = max(d, depth[producer[v]] + 1)
            elif kind == "group":
                d = max(d, depth[v])
        depth[g.index] = d
    up = max(depth.values(), default=0)
    down: dict = {tp.root_rank: 0}
    for e in tp.edges:
        if e.phase == "d":
            down[e.dst] = down.get(e.src, 0) + 1
    return up + max(down.values(), default=0)


def lower_tree(tp: Plan) -> Callable[[int], RankProgram]:
    """The tree Plan's groups and edges as programs: reduce frames are written by the kernel
    straight into framed buffers; the deliver phase sends the result down the tree."""
    n = tp.layout.total
    key = tp.layout.key()
    seq, count = {}, {}
    for e in tp.edges:  # the k-th frame between a pair in edge order: its MPI tags
        k = (e.src, e.dst)
        seq[e.index] = count.get(k, 0)
        count[k] = seq[e.index] + 1

    def msg(e) -> Message:
        return Message(e.index, e.phase, e.src, e.dst, seq[e.index], n, f"{key}|{e.phase}{e.index}")

    def build(r: int):
        b = RankBuilder(r, n)
        receiver = r in tp.receivers
        res = b.out() if receiver else None
        group_out, recv_at = {}, {}
        holder = None
        for s in tp.programs[r]:
            if s.kind == "R" and s.phase == "r":
                recv_at[s.index] = b.recv(msg(tp.edge("r", s.index)), None)
            elif s.kind == "E":
                g = tp.groups[s.index]
                kind, v = g.output
                if kind == "edge":
                    dest = b.work(n, framed=True)  # the kernel writes the frame's payload
                elif kind == "group":
                    dest = b.work(n)
                else:
                    dest = res if res is not None else b.work(n, framed=not is_split(n))
                    holder = dest
                group_out[g.index] = dest
                inputs = tuple(
                    b.leaf(x, n) if k == "leaf" else recv_at[x] if k == "edge" else group_out[x]
                    for k, x in g.inputs
                )
                prog = g.program
                if len(prog) == 1:
                    b.copy(inputs[0], dest)
                else:
                    b.eval(Eval(inputs, prog, dest))
                if kind == "root":
                    b.check(dest)
                elif kind == "edge":
                    b.send(msg(tp.edge("r", v)), dest)
            elif s.kind == "R":  # deliver: the result, from the parent
                holder = b.recv(msg(tp.edge("d", s.index)), res)
            elif s.kind == "S" and s.phase == "r":
                pass  # sent right after its group was evaluated (above)
            else:
                holder = b.send(msg(tp.edge("d", s.index)), holder)
        slots = tp.slots_of(r)
        return b.build(slots, res)

    return build


def reduce_scatter_chunks(program: Program) -> tuple[tuple[int, int], ...]:
    if program.chunks is None:
        raise PlanRefusal(
            "plan-delivery-mismatch",
            f"the {program.realization} program delivers the whole result, not chunks",
        )
    return program.chunks


__all__ = [
    "REALIZATIONS",
    "REDUCE_SCATTER",
    "realize",
    "plan_scatter",
    "applicable",
    "as_tree_plan",
    "lower_tree",
    "reduce_scatter_chunks",
    "DeliverTo",
]
