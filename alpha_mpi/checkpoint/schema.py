"""Strict reading of checkpoint manifests: JSON as data, every field typed and validated.

Every malformed field is a named refusal (`checkpoint-manifest`), never a KeyError, TypeError or
RecursionError: duplicate keys, NaN/Infinity, unknown keys, wrong types, out-of-range numbers
and nesting deeper than a manifest needs are all refused with the field's name.

Fields that can be derived are checked against their derivation: the step in the directory name,
the scalars' step, the data position (step x batch), the contract digest (recomputed from the
contract), the layout order id (one of the contract's), and Adam's carried bias powers b1^t, b2^t
(recomputed by the same repeated multiplication the optimizer does).

The compute identity rank 0 ran under is stored as `compute` (ComputeIdentity.to_dict(): every
field, compared and recorded); its compared fields must equal the contract's `compute` where that
is an identity (a derivation, checked). `compute_history` lists the resumes under another
identity (or from a manifest without one): at_step, how (accepted, machine-independent,
unrecorded), from and to (the compared fields; from null when unknown). Manifests saved before
the identity was recorded have neither field and are read as before.

The layout order id is stored as `layout_order_id`, beside a contract of format version 2.
Manifests of early 0.2 store it as `order_id`, beside a contract of format version 1 and that
version's digest: both forms are read (`order_key`, `layout_order_id_of`); a mixture is refused.
"""

from __future__ import annotations

import json
import math
import re

from ..refusals import CheckpointRefusal
from .paths import FORMAT, HEX64, MANIFEST, VERSION, shard_name

MAX_DEPTH = 32
NAME_RE = re.compile(r"[a-z][a-z0-9_]*(\.[a-z0-9_]+)*")
ROOT_REQUIRED = {"format", "version", "step", "components"}
ROOT_OPTIONAL = {
    "layout_order_id",
    "order_id",  # the former name of layout_order_id (LEGACY_ORDER_KEY)
    "contract",
    "contract_digest",
    "contract_history",
    "resume_history",
    "compute",
    "compute_history",
    "config",
    "scalars",
    "data",
    "saved_on_ranks",
}
LEARNER_FIELDS = ("layout_order_id", "contract", "contract_digest", "config", "scalars", "data")
LEGACY_ORDER_KEY = "order_id"  # layout_order_id as manifests of early 0.2 (contract format 1) name it
CONTRACT_VERSION_OF_KEY = {"layout_order_id": 2, LEGACY_ORDER_KEY: 1}
PARTITIONS = ("none", "state", "grads", "params")
STREAMS = ("permutation-v1",)


def bad(message: str, code: str = "checkpoint-manifest", **context):
    return CheckpointRefusal(code, message, **context)


def _no_dupes(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise bad(f"key {k!r} appears twice")
        out[k] = v
    return out


def _no_constant(name):
    raise bad(f"{name} is not a JSON number (manifests hold finite numbers only)")


def _depth(obj, limit: int, what: str) -> None:
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if d > limit:
            raise bad(f"{what} nests deeper than {limit} levels")
        if isinstance(o, dict):
            stack.extend((v, d + 1) for v in o.values())
        elif isinstance(o, list):
            stack.extend((v, d + 1) for v in o)


def loads(data: bytes, what: str) -> dict:
    """A JSON object from bytes, strictly (UTF-8, no duplicate keys, no NaN, bounded depth)."""
    try:
        text = data.decode("utf-8")
        obj = json.loads(text, object_pairs_hook=_no_dupes, parse_constant=_no_constant)
    except CheckpointRefusal as e:
        raise bad(f"{what}: {e.message}")
    except UnicodeDecodeError as e:
        raise bad(f"{what} is not UTF-8 text (byte {e.start})")
    except RecursionError:
        raise bad(f"{what} nests too deeply to be a manifest")
    except ValueError as e:
        raise bad(f"{what} is not valid JSON: {str(e)[:120]}")
    if not isinstance(obj, dict):
        raise bad(f"{what} is not a JSON object")
    _depth(obj, MAX_DEPTH, what)
    return obj


# ------------------------------------------------------------------------------ typed fields
def keys(obj, what: str, required, optional=()):
    if not isinstance(obj, dict):
        raise bad(f"{what} must be an object, found {type(obj).__name__}")
    missing = sorted(set(required) - set(obj))
    extra = sorted(set(obj) - set(required) - set(optional))
    if missing or extra:
        raise bad(f"{what}: missing {missing}, unknown {[k[:40] for k in extra[:5]]}")
    return obj


def integer(v, what: str, lo: int = 0, hi: int = 2**53):
    if type(v) is not int or not lo <= v <= hi:
        raise bad(f"{what} must be an integer in [{lo}, {hi}], found {_show(v)}")
    return v


def number(v, what: str, positive: bool = False):
    if type(v) not in (int, float) or not math.isfinite(v) or (positive and not v > 0):
        raise bad(f"{what} must be a finite{' positive' if positive else ''} number, found {_show(v)}")
    return float(v)


def text(v, what: str, pattern=None, choices=None, limit: int = 4096):
    if not isinstance(v, str) or len(v) > limit:
        raise bad(f"{what} must be a string, found {_show(v)}")
    if pattern is not None and not pattern.fullmatch(v):
        raise bad(f"{what} is not of the expected form, found {_show(v)}")
    if choices is not None and v not in choices:
        raise bad(f"{what} must be one of {list(choices)}, found {_show(v)}")
    return v


def digest(v, what: str):
    return text(v, what, HEX64)


def _show(v) -> str:
    r = repr(v) if isinstance(v, (int, float, str, bool, type(None))) else type(v).__name__
    return r if len(r) <= 80 else r[:77] + "..."


def scalar(v, what: str):
    if v is None or type(v) in (bool, int, str) or (type(v) is float and math.isfinite(v)):
        if isinstance(v, str) and len(v) > 4096:
            raise bad(f"{what} is longer than 4096 characters")
        return v
    raise bad(f"{what} must be a JSON scalar (string, number, true/false or null), found {_show(v)}")


def _path_code(path) -> str:
    """A path that would leave the step directory is an escape; any other wrong path is malformed."""
    if isinstance(path, str) and (
        path.startswith(("/", "~", "\\")) or ".." in path.replace("\\", "/").split("/") or "\0" in path
    ):
        return "checkpoint-path-escape"
    return "checkpoint-manifest"


def format_version(m: dict, where: str) -> None:
    """Refuse a manifest (root or component) of another format, or of another format version."""
    if m.get("format") != FORMAT:
        raise bad(f"{where} is not an {FORMAT} manifest")
    if m.get("version") != VERSION:
        raise CheckpointRefusal(
            "checkpoint-format-version",
            f"{where} has format version {_show(m.get('version'))}; this alpha_mpi reads {VERSION}",
        )


# ------------------------------------------------------------------------------ root manifest
def validate_root(m: dict, dir_step, where: str) -> None:
    """Check every field of a root manifest that is present; refuse what is malformed."""
    format_version(m, where)
    keys(m, "root manifest", ROOT_REQUIRED, ROOT_OPTIONAL)
    step = integer(m["step"], "step")
    if dir_step is not None and step != dir_step:
        raise bad(f"root manifest says step {step}, its directory is step {dir_step}")
    comps = m["components"]
    if not isinstance(comps, dict) or not comps:
        raise bad("components must be a non-empty object")
    for name, ref in comps.items():
        text(name, "component name", NAME_RE, limit=64)
        keys(ref, f"component {name}", ("path", "sha256"))
        if ref["path"] != f"{name}/{MANIFEST}":
            raise bad(
                f"component {name} path must be {name}/{MANIFEST}, found {_show(ref['path'])}",
                code=_path_code(ref["path"]),
            )
        digest(ref["sha256"], f"component {name} sha256")
    if "layout_order_id" in m and LEGACY_ORDER_KEY in m:
        raise bad("root manifest has both layout_order_id and its former name order_id")
    fields = learner_fields(m)
    present = [k for k in fields if k in m]
    if present and len(present) != len(fields):
        raise bad(
            f"root manifest has the learner fields {present} but lacks {[k for k in fields if k not in m]}"
        )
    if "saved_on_ranks" in m:
        integer(m["saved_on_ranks"], "saved_on_ranks", 1, 2**31)
    config = m.get("config", {})
    if not isinstance(config, dict):
        raise bad("config must be an object")
    for k, v in config.items():
        text(k, "config key", NAME_RE, limit=64)
        scalar(v, f"config.{k}")
    if "contract" in m or "contract_digest" in m or order_key(m) in m:
        _contract(m)
    for where, h in history(m, "contract_history", ("from", "to", "at_step"), step):
        digest(h["from"], f"{where}.from")
        digest(h["to"], f"{where}.to")
    for where, h in history(m, "resume_history", ("at_step", "field", "from", "to"), step):
        field = text(h["field"], f"{where}.field", choices=("lr", "weight_decay", "steps"))
        for end in ("from", "to"):
            if field == "steps":
                integer(h[end], f"{where}.{end}")
            elif number(h[end], f"{where}.{end}", positive=field == "lr") < 0:
                raise bad(f"{where}.{end} must be a weight decay >= 0, found {h[end]!r}")
    _compute(m, step)
    if "scalars" in m:
        _scalars(m["scalars"], step, config)
    if "data" in m:
        _data(m["data"], step, config)


def _contract(m: dict) -> None:
    from ..numerics import NumericalContract
    from ..refusals import Refusal

    key = order_key(m)
    needed = (key, "contract", "contract_digest")
    for k in needed:
        if k not in m:
            raise bad(f"root manifest has {', '.join(x for x in needed if x in m)} but not {k}")
    oid = text(m[key], key, re.compile(r"[0-9a-zA-Z:_.-]{1,200}"))
    digest(m["contract_digest"], "contract_digest")
    version = CONTRACT_VERSION_OF_KEY[key]
    if isinstance(m["contract"], dict) and m["contract"].get("version") != version:
        raise bad(
            f"the manifest names its order {key}, which goes with a contract of format version "
            f"{version}, but the contract has version {_show(m['contract'].get('version'))}"
        )
    try:
        c = NumericalContract.from_dict(m["contract"])
    except Refusal as e:
        raise bad(f"contract: [{e.code}] {e.message}")
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # a contract parser gap: still named
        raise bad(f"contract is malformed ({type(e).__name__}: {str(e)[:80]})")
    if _canon(c.to_dict(version=version)) != _canon(m["contract"]):
        raise bad("contract is not in the canonical form NumericalContract.to_dict() writes")
    if c.digest_in(version) != m["contract_digest"]:
        raise bad(
            f"contract_digest {m['contract_digest'][:16]}... is not the digest of the contract "
            f"({c.digest_in(version)[:16]}...)"
        )
    if oid not in c.layout_order_ids:
        raise bad(f"{key} {oid[:24]!r} is not an order the contract names")


COMPUTE_HOW = ("accepted", "machine-independent", "unrecorded")


def _identity(d, what: str):
    from ..model.compute import ComputeIdentity
    from ..refusals import Refusal

    keys(d, what, ("kind", "fields"))
    if d["kind"] != "compute-identity" or not isinstance(d["fields"], dict):
        raise bad(f"{what} is not a compute identity (kind compute-identity, fields)")
    try:
        return ComputeIdentity.of(d["fields"])
    except Refusal as e:
        raise bad(f"{what}: {e.message}")


def history(m: dict, name: str, fields, step: int):
    """(where, entry) of the manifest's list `name` (absent: empty), each entry an object with
    exactly `fields`, its `at_step` an integer in [0, step]; the caller checks the rest."""
    entries = m.get(name, [])
    if not isinstance(entries, list):
        raise bad(f"{name} must be a list")
    for i, h in enumerate(entries):
        where = f"{name}[{i}]"
        keys(h, where, fields)
        integer(h["at_step"], f"{where}.at_step", 0, step)
        yield where, h


def _compute(m: dict, step: int) -> None:
    if "compute" in m:
        ident = _identity(m["compute"], "compute")
        c = m.get("contract")
        if isinstance(c, dict) and isinstance(c.get("compute"), dict) and "fields" in c["compute"]:
            if c["compute"]["fields"] != dict(ident.compared().fields):
                raise bad("compute's compared fields differ from the contract's compute identity")
    for where, h in history(m, "compute_history", ("at_step", "how", "from", "to"), step):
        text(h["how"], f"{where}.how", choices=COMPUTE_HOW)
        for end in ("from", "to"):
            if h[end] is None and end == "from" and h["how"] == "unrecorded":
                continue
            _identity({"kind": "compute-identity", "fields": h[end]}, f"{where}.{end}")


def order_key(m: dict) -> str:
    """The key a root manifest names its layout order id by: `layout_order_id`, or the former
    `order_id` in manifests of early 0.2."""
    return LEGACY_ORDER_KEY if LEGACY_ORDER_KEY in m else "layout_order_id"


def learner_fields(m: dict) -> tuple:
    """The fields a learner's root manifest holds (LEARNER_FIELDS, the order under `order_key`)."""
    return (order_key(m), *LEARNER_FIELDS[1:])


def layout_order_id_of(m: dict) -> str | None:
    """The layout order id a (validated) root manifest names, under either name; None if none."""
    return m.get(order_key(m))


def _canon(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _scalars(sc, step: int, config: dict) -> None:
    if not isinstance(sc, dict):
        raise bad("scalars must be an object")
    if "step" in sc and integer(sc["step"], "scalars.step") != step:
        raise bad(f"scalars.step {sc['step']} differs from the manifest step {step}")
    from ..learning.optim import OPTIMIZERS  # each optimizer's class says what it records

    opt = sc.get("optimizer")
    if opt not in OPTIMIZERS or "optimizer_hyper" not in sc:
        # Another learner (e.g. alpha_mpi.torch): its own load validates its scalars; here only JSON.
        return
    kind = OPTIMIZERS[opt]
    keys(sc, "scalars", ("step", "optimizer", "optimizer_hyper", "optimizer_scalars", "partition_saved"))
    text(sc["partition_saved"], "scalars.partition_saved", choices=PARTITIONS)
    if "optimizer" in config and config["optimizer"] != opt:
        raise bad(f"scalars.optimizer {opt!r} differs from config.optimizer {_show(config['optimizer'])}")
    hyper = keys(sc["optimizer_hyper"], "scalars.optimizer_hyper", kind.hyper)
    for k in kind.hyper:  # momentum and weight decay may be 0 (the class checks their ranges)
        number(hyper[k], f"scalars.optimizer_hyper.{k}", positive=k not in ("momentum", "weight_decay"))
    if "lr" in config and config["lr"] != hyper["lr"]:
        raise bad(f"config.lr {_show(config['lr'])} differs from scalars.optimizer_hyper.lr {hyper['lr']!r}")
    wd = config.get("weight_decay")  # None: the optimizer's default
    if wd is not None and "weight_decay" in hyper and wd != hyper["weight_decay"]:
        raise bad(
            f"config.weight_decay {_show(wd)} differs from scalars.optimizer_hyper.weight_decay {hyper['weight_decay']!r}"
        )
    s = keys(sc["optimizer_scalars"], "scalars.optimizer_scalars", kind.carried)
    if integer(s["steps"], "scalars.optimizer_scalars.steps") != step:
        raise bad(f"scalars.optimizer_scalars.steps {s['steps']} differs from the manifest step {step}")
    for k in kind.carried:
        number(s[k], f"scalars.optimizer_scalars.{k}")
    problem = kind.saved_problem(hyper, s, step)  # e.g. Adam's bias powers, by their derivation
    if problem:
        raise bad(problem)


def _data(d, step: int, config: dict) -> None:
    keys(d, "data", ("stream", "position"), ("samples", "sha256", "source"))
    text(d["stream"], "data.stream", choices=STREAMS)
    pos = integer(d["position"], "data.position", 0, 2**62)
    batch = config.get("batch")
    if type(batch) is int and pos != step * batch:
        raise bad(f"data.position {pos} is not step x batch = {step} x {batch}")
    if "samples" in d:
        integer(d["samples"], "data.samples", 1, 2**62)
    if "sha256" in d:
        digest(d["sha256"], "data.sha256")
    if "source" in d:
        text(d["source"], "data.source")


# ------------------------------------------------------------------------------ components
SHARD_KEYS = ("path", "start", "stop", "dtype", "shape", "bytes", "sha256")


def validate_component(name: str, comp: dict, where: str) -> list:
    """The component's shard entries, sorted, checked to tile [0, length) exactly."""
    format_version(comp, where)
    keys(comp, f"component {name}", ("format", "version", "component", "length", "dtype", "shards"))
    if comp["component"] != name:
        raise bad(f"component manifest {where} names component {_show(comp['component'])}, expected {name!r}")
    length = integer(comp["length"], f"component {name} length", 1, 2**48)
    if comp["dtype"] != "float64":
        raise bad(f"component {name} dtype must be float64, found {_show(comp['dtype'])}")
    shards = comp["shards"]
    if not isinstance(shards, list) or not shards:
        raise bad(f"component {name}: shards must be a non-empty list")
    for i, e in enumerate(shards):
        keys(e, f"component {name} shard {i}", SHARD_KEYS)
        a = integer(e["start"], f"{name} shard {i} start", 0, length)
        b = integer(e["stop"], f"{name} shard {i} stop", 0, length)
        if e["dtype"] != "float64" or e["shape"] != [b - a] or b <= a:
            raise bad(
                f"component {name} shard {i}: dtype {_show(e['dtype'])} shape {_show(e['shape'])} is not "
                f"float64 [{b - a}] for range [{a}, {b})"
            )
        if e["path"] != shard_name(a, b):
            raise bad(
                f"component {name} shard {i}: path {_show(e['path'])} is not {shard_name(a, b)}",
                code=_path_code(e["path"]),
            )
        integer(
            e["bytes"], f"{name} shard {i} bytes", 1, 2**62
        )  # the header check says what a wrong size holds
        digest(e["sha256"], f"{name} shard {i} sha256")
    out = sorted(shards, key=lambda e: e["start"])
    pos = 0
    for e in out:
        if e["start"] != pos:
            raise bad(
                f"component {name}: shards do not tile [0, {length}): a gap or overlap at {pos} "
                f"(next shard starts at {e['start']})"
            )
        pos = e["stop"]
    if pos != length:
        raise bad(f"component {name}: shards end at {pos}, length is {length}")
    return out
