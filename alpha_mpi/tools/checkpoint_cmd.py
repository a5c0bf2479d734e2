"""`alpha-mpi checkpoint verify|inspect DIR`: check or describe a checkpoint (no MPI needed)."""

from __future__ import annotations

import argparse
import json
import os

from ..checkpoint.schema import layout_order_id_of
from ._args import EXIT_REFUSAL, examples_epilog, path, subparser, wrap

VERIFY_EXAMPLES = (
    "alpha-mpi checkpoint verify ckpt                  # the step `latest` names",
    "alpha-mpi checkpoint verify ckpt --all            # every step, newest first",
    "alpha-mpi checkpoint verify ckpt/step-00000020 --json",
)
INSPECT_EXAMPLES = (
    "alpha-mpi checkpoint inspect ckpt",
    "alpha-mpi checkpoint inspect ckpt/step-00000020 --json",
)


def run(argv) -> int:
    p = subparser(
        "checkpoint",
        "Verify or inspect a sharded checkpoint. DIR is the checkpoint directory "
        "(its `latest` is read, as data) or one step directory.",
        VERIFY_EXAMPLES[:2] + INSPECT_EXAMPLES[:1],
    )
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    v = _action(
        sub,
        "verify",
        "check the seal, every manifest field, every shard's sha256 and header; exit 3 on any refusal",
        VERIFY_EXAMPLES,
    )
    v.add_argument(
        "--all",
        action="store_true",
        help="verify every step directory in DIR (newest first) and say which pass; exit 3 if any fails",
    )
    v.add_argument("--json", action="store_true", help="print the summary as JSON")
    i = _action(
        sub,
        "inspect",
        "print the root manifest: step, layout order id, contract, config, scalars, data, components",
        INSPECT_EXAMPLES,
    )
    i.add_argument("--json", action="store_true", help="print the manifest as JSON")
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
            rows = [
                ("manifest sha256", f"{s['manifest_sha256']} (sealed)"),
                ("layout order id", s["layout_order_id"]),
                ("contract", s["contract_digest"]),
            ]
            print(_table(rows))
            _print_components({name: c["shards"] for name, c in s["components"].items()}, s["components"])
        return 0
    m = ck.manifest
    if a.json:
        print(json.dumps(m, indent=2))
        return 0
    print(f"checkpoint {ck.dir}")
    print(_table(_inspect_rows(m, ck.manifest_sha256)))
    print("components:")
    _print_components({name: len(c["shards"]) for name, c in ck.components.items()}, ck.components)
    return 0


def _action(sub, name: str, help_text: str, examples) -> argparse.ArgumentParser:
    """`alpha-mpi checkpoint NAME DIR`: its one-line help, the same as its description, and examples."""
    q = sub.add_parser(
        name,
        help=help_text,
        description=wrap(help_text[0].upper() + help_text[1:] + "."),
        epilog=examples_epilog(examples),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    q.add_argument(
        "dir", type=path, help="a checkpoint directory (the step its `latest` names) or one step directory"
    )
    return q


def _inspect_rows(m: dict, manifest_sha256: str) -> list:
    """(label, value) rows of `checkpoint inspect`: each field once, `step` first."""
    rows = [
        ("step", f"{m['step']}  (saved on {m.get('saved_on_ranks')} ranks)"),
        ("manifest sha256", manifest_sha256),
        ("layout order id", layout_order_id_of(m)),
        ("contract", m.get("contract_digest")),
    ]
    rows += [
        ("adopted", f"{h['from'][:16]} -> {h['to'][:16]} at step {h['at_step']}")
        for h in m.get("contract_history", [])
    ]
    rows += [
        ("changed", f"{h['field']} {h['from']} -> {h['to']} at step {h['at_step']}")
        for h in m.get("resume_history", [])
    ]
    if "compute" in m:
        rows.append(("compute", "; ".join(f"{k} {v}" for k, v in m["compute"]["fields"].items())))
    rows += [("compute changed", _compute_change(h)) for h in m.get("compute_history", [])]
    rows += [(f"config.{k}", val) for k, val in sorted(m.get("config", {}).items())]
    scalars = dict(m.get("scalars", {}))
    if scalars.get("step") == m["step"]:
        del scalars["step"]  # the learner's own copy of the step: shown once, above (else both, named)
    rows += [(f"scalars.{k}", val) for k, val in sorted(scalars.items())]
    rows += [(f"data.{k}", val) for k, val in sorted(m.get("data", {}).items())]
    return rows


def _compute_change(h: dict) -> str:
    """One compute_history entry: the compared fields that changed, how, and when."""
    if h["from"] is None:
        return f"resumed at step {h['at_step']} from a manifest without a compute identity ({h['how']})"
    old, new = h["from"], h["to"]
    diffs = [
        f"{k} {old.get(k, 'absent')} -> {new.get(k, 'absent')}" for k in new | old if old.get(k) != new.get(k)
    ]
    return f"{'; '.join(diffs)} at step {h['at_step']} ({h['how']})"


def _table(rows: list) -> str:
    """Two columns, the labels padded to the longest."""
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"  {label:<{width}s}  {value}" for label, value in rows)


def _print_components(shards: dict, components: dict) -> None:
    """One aligned row per component: its name, its length in values and its shard count."""
    width = max((len(name) for name in components), default=0)
    for name, c in components.items():
        print(f"  {name:<{width}s}  {c['length']:>12d} values in {shards[name]} shard(s)")


def _verify_all(root: str, as_json: bool) -> int:
    from ..checkpoint.paths import published_steps, step_name
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
    return EXIT_REFUSAL if failed else 0
