"""`alpha-mpi plan`: show the tree, identities, each rank's schedule and the traffic. No MPI."""

from __future__ import annotations

import json

from ..cli import subparser
from ..model import DeliverTo, Layout, ReplicateAll, build
from ..planning import plan, simulate


def run(argv) -> int:
    p = subparser("plan", "Plan a combine tree and print each rank's protocol (pure; no MPI needed).")
    p.add_argument("--slots", type=int, default=8, help="number of logical contributions (default 8)")
    p.add_argument("--ranks", type=int, default=4, help="ranks the slots are placed on, in contiguous blocks (default 4)")
    p.add_argument("--topology", default="pairwise", help="pairwise | star | star:HUB | hierarchy:K (default pairwise)")
    p.add_argument("--deliver-to", type=int, default=None, metavar="R", help="deliver only to rank R (default: replicate to all)")
    p.add_argument("--elements", type=int, default=1, help="payload elements per contribution (default 1)")
    p.add_argument("--mass", action="store_true", help="add a one-element 'mass' component (Σ samples)")
    p.add_argument("--format", choices=("text", "json", "dot"), default="text")
    a = p.parse_args(argv)
    layout = Layout.weighted(a.elements) if a.mass else Layout.vector(a.elements)
    tree = build(a.topology, a.slots, a.ranks)
    delivery = ReplicateAll() if a.deliver_to is None else DeliverTo(a.deliver_to)
    pl = plan(tree, delivery, layout, size=a.ranks)
    traffic = simulate(pl)
    if a.format == "json":
        d = pl.to_dict()
        d["traffic"] = traffic.to_dict()
        print(json.dumps(d, indent=2))
    elif a.format == "dot":
        print(pl.to_dot())
    else:
        print(pl.describe(traffic))
    return 0
