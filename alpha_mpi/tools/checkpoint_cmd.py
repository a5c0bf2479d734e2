"""`alpha-mpi checkpoint verify|inspect DIR`: check or describe a checkpoint (no MPI needed)."""

from __future__ import annotations

import json
import os

from ..cli import subparser


def run(argv) -> int:
    p = subparser(
        "checkpoint",
        "Verify or inspect a sharded checkpoint. DIR is the checkpoint directory "
        "(its `latest` is read, as data) or one step directory.",
    )
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    v = sub.add_parser(
        "verify",
        help="check the seal, every manifest field, every shard's sha256 and header; exit 3 on any refusal",
    )
    v.add_argument("dir")
    v.add_argument(
        "--all",
        action="store_true",
        help="verify every step directory in DIR (newest first) and say which pass; exit 3 if any fails",
    )
    v.add_argument("--json", action="store_true", help="print the summary as JSON")
    i = sub.add_parser(
        "inspect", help="print the root manifest: step, order id, contract, config, components"
    )
    i.add_argument("dir")
    i.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    from ..checkpoint import open_checkpoint

    if a.action == "verify" and a.all:
        return _verify_all(a.dir, a.json)
    ck = open_checkpoint(a.dir)
    if a.action == "verify":
        s = ck.verify()
        if a.json:
            print(json.dumps(s, indent=2))
        else:
            print(f"ok: {s['path']} step {s['step']}, {s['bytes']} shard bytes verified")
            print(f"  manifest  sha256 {s['manifest_sha256']} (sealed)")
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
    print(f"  manifest sha256 {ck.manifest_sha256}")
    print(f"  order id        {m.get('order_id')}")
    print(f"  contract        {m.get('contract_digest')}")
    for h in m.get("contract_history", []):
        print(f"  adopted         {h['from'][:16]} -> {h['to'][:16]} at step {h['at_step']}")
    for h in m.get("resume_history", []):
        print(f"  changed         {h['field']} {h['from']} -> {h['to']} at step {h['at_step']}")
    for k, val in sorted(m.get("config", {}).items()):
        print(f"  config.{k:<9s} {val}")
    for k, val in sorted(m.get("scalars", {}).items()):
        print(f"  {k:<15s} {val}")
    for k, val in sorted(m.get("data", {}).items()):
        print(f"  data.{k:<10s} {val}")
    for name, c in ck.components.items():
        print(f"  {name:16s} {c['length']:>12d} values in {len(c['shards'])} shard(s)")
    return 0


def _verify_all(root: str, as_json: bool) -> int:
    from ..checkpoint.layout import published_steps, step_name
    from ..checkpoint.reader import Checkpoint, read_latest
    from ..refusals import CheckpointRefusal, Refusal

    steps = published_steps(root)
    if not steps:
        raise CheckpointRefusal("checkpoint-missing", f"{root} holds no step directory")
    try:
        found = read_latest(root)
        latest = os.path.basename(found[0]) if found else None
        latest_note = latest or "missing"
    except Refusal as e:
        latest, latest_note = None, f"[{e.code}] {e.message}"
    rows, failed = [], 0
    for k in reversed(steps):
        name = step_name(k)
        try:
            s = Checkpoint(os.path.join(root, name)).verify()
            rows.append({"step": k, "dir": name, "ok": True, "bytes": s["bytes"], "latest": name == latest})
        except Refusal as e:
            failed += 1
            rows.append(
                {
                    "step": k,
                    "dir": name,
                    "ok": False,
                    "code": e.code,
                    "message": e.message,
                    "latest": name == latest,
                }
            )
    if as_json:
        print(json.dumps({"root": root, "latest": latest_note, "steps": rows}, indent=2))
    else:
        print(f"{root}: latest {latest_note}")
        for r in rows:
            mark = "  <- latest" if r["latest"] else ""
            if r["ok"]:
                print(f"  ok    {r['dir']}  {r['bytes']} shard bytes{mark}")
            else:
                print(f"  FAIL  {r['dir']}  [{r['code']}] {r['message']}{mark}")
    return 3 if failed else 0
