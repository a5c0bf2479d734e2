"""`alpha-mpi plan`: show a realization's per-rank schedule, traffic and modelled cost. No MPI."""

from __future__ import annotations

import json
import re

from ..model import DeliverTo, Layout, ReplicateAll, build
from ..model.topology import parse_topology
from ..planning import plan, simulate
from ..planning.check import check, count
from ..planning.cost import estimate, load_calibration
from ..planning.realize import REALIZATIONS, applicable, realize
from ._args import at_least, int_option, subparser

SHOWN_RANKS = 16  # schedules printed in text form (the cost covers every rank)
EXAMPLES = (
    "alpha-mpi plan                                   # pairwise tree, 8 slots on 4 ranks",
    "alpha-mpi plan --slots 10 --ranks 4 --topology hierarchy:2 --deliver-to 3",
    "alpha-mpi plan --slots 8 --ranks 8 --elements 1000000 --cost   # every realization's modelled time",
    "alpha-mpi plan --realization butterfly --ranks 4 --slots 4 --check",
    "alpha-mpi plan --format dot | dot -Tpng > plan.png",
)


def run(argv) -> int:
    p = subparser(
        "plan",
        "Plan a combine tree and print each rank's protocol: its schedule, the traffic and, with "
        "--cost, the modelled time of every realization that applies (pure; no MPI needed).",
        EXAMPLES,
    )
    int_option(p, "--slots", 8, "number of logical contributions")
    int_option(p, "--ranks", 4, "ranks the slots are placed on, in contiguous blocks")
    p.add_argument(
        "--topology", default="pairwise", help="pairwise | star | star:HUB | hierarchy:K (default pairwise)"
    )
    p.add_argument(
        "--deliver-to",
        type=at_least(0),
        default=None,
        metavar="R",
        help="deliver only to rank R (default: replicate to all)",
    )
    int_option(p, "--elements", 1, "payload elements per contribution")
    p.add_argument("--mass", action="store_true", help="add a one-element 'mass' component (Σ samples)")
    p.add_argument(
        "--realization",
        choices=REALIZATIONS,
        default="tree",
        help="which realization of the tree to plan (default tree: reduce up, deliver down)",
    )
    p.add_argument(
        "--reduce-scatter", action="store_true", help="plan the reduce-scatter form (halving or scatter)"
    )
    p.add_argument(
        "--cost",
        action="store_true",
        help="print per-rank sends, bytes and rounds, and the α–β–γ estimate of every applicable realization",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="also run the program symbolically on every rank (every receiver must end with the tree)",
    )
    p.add_argument(
        "--calibration",
        default=None,
        metavar="FILE",
        help="α, β, γ from FILE (default ALPHA_MPI_CALIBRATION or built-in)",
    )
    p.add_argument("--format", choices=("text", "json", "dot"), default="text")
    a = p.parse_args(argv)
    layout = Layout.weighted(a.elements) if a.mass else Layout.vector(a.elements)
    tree = build(a.topology, a.slots, a.ranks)
    delivery = ReplicateAll() if a.deliver_to is None else DeliverTo(a.deliver_to)
    tp = plan(tree, delivery, layout, size=a.ranks)
    mode = "reduce-scatter" if a.reduce_scatter else "allreduce"
    topology = topology_label(a.topology, tp.topology, a.slots)
    if a.realization == "tree" and not a.reduce_scatter and not a.cost and not a.check:
        return _tree(tp, a.format, a.topology, topology)  # the tree realization's own, detailed form
    prog = realize(tp, a.realization, mode=mode)
    cost = check(prog) if a.check else count(prog)
    cal = load_calibration(a.calibration)
    est = {k: estimate(tp, k, cal, mode) for k, why in applicable(tp, mode).items() if why is None}
    if a.format == "json":
        d = prog.to_dict(range(min(prog.size, SHOWN_RANKS)) if prog.size > SHOWN_RANKS else None)
        d.update(cost.to_dict())
        d["estimate_s"] = est.get(a.realization)
        d["estimates_s"] = est
        d["calibration"] = cal.to_dict()
        d["checked"] = bool(a.check)
        d["topology_asked"] = a.topology
        print(json.dumps(d, indent=2))
        return 0
    if a.format == "dot":
        print(tp.to_dot())
        return 0
    shown = range(min(prog.size, SHOWN_RANKS))
    print(_with_topology(prog.describe(shown), topology))
    if prog.size > SHOWN_RANKS:
        print(f"  ... {prog.size - SHOWN_RANKS} more ranks")
    print(f"cost ({a.realization}, {mode}):")
    print(
        f"  rounds {cost.rounds}   sends/rank max {cost.sends_per_rank_max}   bytes/rank max "
        f"{cost.bytes_per_rank_max}   adds/rank max {cost.adds_per_rank_max}"
        + ("   (checked symbolically)" if a.check else "")
    )
    print(
        f"  model ({cal.source}: α0 {cal.alpha0 * 1e6:.2f} us/run, α {cal.alpha * 1e6:.2f} us/round, "
        f"α_msg {cal.alpha_msg * 1e6:.2f} us/message, "
        f"β {cal.beta * 1e9:.3f} ns/B, γ {cal.gamma * 1e9:.3f} ns/B):"
    )
    for k, v in sorted(est.items(), key=lambda kv: kv[1]):
        print(f"    {k:<10s} {v * 1e6:12.2f} us" + ("   <-- this plan" if k == a.realization else ""))
    return 0


def _tree(tp, fmt, asked: str, topology: str) -> int:
    prog = realize(tp, "tree")
    traffic = simulate(tp, prog)  # the same Program: every rank's program built once
    if fmt == "json":
        d = tp.to_dict(prog)
        d["traffic"] = traffic.to_dict()
        d["topology_asked"] = asked
        print(json.dumps(d, indent=2))
    elif fmt == "dot":
        print(tp.to_dot())
    else:
        print(_with_topology(tp.describe(traffic, prog), topology))
    return 0


def topology_label(asked: str, shape: str, slots: int) -> str:
    """The topology as asked, and the shape the plan names where that differs: with few slots
    several topologies build one tree (hierarchy:2 over 3 slots is the star), and the plan names
    a tree by its shape (alpha_mpi.model.topology.classify)."""
    kind, arg = parse_topology(asked)
    if kind == "hierarchy":
        kind = f"hierarchy:{arg}"
    if kind == shape:
        return asked
    if shape == "single":
        return f"{asked} (one slot: a single leaf, nothing to combine)"
    return f"{asked} (the same tree as {shape} for {slots} slots)"


def _with_topology(text: str, topology: str) -> str:
    """The plan's description with its `topology` field saying `topology`."""
    return re.sub(r"(\btopology +)\S+", lambda m: m.group(1) + topology, text, count=1)
