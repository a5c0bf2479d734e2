"""`alpha-mpi checkpoint verify|inspect DIR`: check or describe a checkpoint (no MPI needed)."""

from __future__ import annotations

import json

from ..cli import subparser


def run(argv) -> int:
    p = subparser("checkpoint", "Verify or inspect a sharded checkpoint. DIR is the checkpoint directory "
                                "(its `latest` is followed) or one step directory.")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    v = sub.add_parser("verify", help="re-hash every shard and check the manifest tree; exit 3 on any refusal")
    v.add_argument("dir")
    v.add_argument("--json", action="store_true", help="print the summary as JSON")
    i = sub.add_parser("inspect", help="print the root manifest: step, order id, contract, config, components")
    i.add_argument("dir")
    i.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    from ..checkpoint import open_checkpoint

    ck = open_checkpoint(a.dir)
    if a.action == "verify":
        s = ck.verify()
        if a.json:
            print(json.dumps(s, indent=2))
        else:
            print(f"ok: {s['path']} step {s['step']}, {s['bytes']} shard bytes verified")
            print(f"  order id  {s['order_id']}")
            print(f"  contract  {s['contract_digest']}")
            for name, c in s["components"].items():
                print(f"  {name:16s} {c['length']:>12d} values in {c['shards']} shard(s)")
        return 0
    m = ck.manifest
    if a.json:
        print(json.dumps(m, indent=2))
        return 0
    print(f"checkpoint {ck.dir}")
    print(f"  step            {m['step']}  (saved on {m.get('saved_on_ranks')} ranks)")
    print(f"  order id        {m.get('order_id')}")
    print(f"  contract        {m.get('contract_digest')}")
    for h in m.get("contract_history", []):
        print(f"  adopted         {h['from'][:16]} -> {h['to'][:16]} at step {h['at_step']}")
    for k, val in sorted(m.get("config", {}).items()):
        print(f"  config.{k:<9s} {val}")
    for k, val in sorted(m.get("scalars", {}).items()):
        print(f"  {k:<15s} {val}")
    for name, c in ck.components.items():
        print(f"  {name:16s} {c['length']:>12d} values in {len(c['shards'])} shard(s)")
    return 0
