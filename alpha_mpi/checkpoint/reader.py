"""Reading a checkpoint from its path alone: the manifest tree is self-describing.

`open_checkpoint(path)` accepts the checkpoint directory (follows `latest`) or a step directory.
Every path in a manifest is checked to stay inside the step directory; every shard that is read
is hashed against its manifest entry first; the shards of each component must tile its length.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
from safetensors import safe_open

from ..refusals import CheckpointRefusal
from .layout import FORMAT, LATEST, MANIFEST, VERSION, safe_join


def _load_json(path: str, what: str, sha256: str | None = None) -> dict:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise CheckpointRefusal("checkpoint-shard-missing" if sha256 else "checkpoint-missing", f"{what} {path} is missing")
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise CheckpointRefusal("checkpoint-corrupt", f"{what} {path} does not match the sha256 its parent manifest names")
    try:
        obj = json.loads(data)
    except ValueError as e:
        raise CheckpointRefusal("checkpoint-manifest", f"{what} {path} is not valid JSON: {e}")
    if not isinstance(obj, dict):
        raise CheckpointRefusal("checkpoint-manifest", f"{what} {path} is not a JSON object")
    return obj


def _check_format(obj: dict, path: str) -> None:
    if obj.get("format") != FORMAT:
        raise CheckpointRefusal("checkpoint-manifest", f"{path} is not an {FORMAT} manifest")
    if obj.get("version") != VERSION:
        raise CheckpointRefusal(
            "checkpoint-format-version", f"{path} has format version {obj.get('version')!r}; this alpha_mpi reads {VERSION}"
        )


def resolve(path: str) -> str:
    """The step directory a path names: itself, or the one its `latest` pointer names."""
    if os.path.isfile(os.path.join(path, MANIFEST)):
        return path
    pointer = os.path.join(path, LATEST)
    if not os.path.isfile(pointer):
        raise CheckpointRefusal("checkpoint-missing", f"{path} has neither {MANIFEST} nor a {LATEST} pointer")
    with open(pointer) as f:
        name = f.read().strip()
    step_dir = safe_join(path, name, "latest pointer")
    if not os.path.isfile(os.path.join(step_dir, MANIFEST)):
        raise CheckpointRefusal("checkpoint-missing", f"{LATEST} names {name}, which has no {MANIFEST}")
    return step_dir


class Checkpoint:
    def __init__(self, path: str):
        self.dir = resolve(path)
        self.manifest = _load_json(os.path.join(self.dir, MANIFEST), "root manifest")
        _check_format(self.manifest, self.dir)
        self.step = self.manifest.get("step")
        comps = self.manifest.get("components")
        if not isinstance(comps, dict) or not comps or not isinstance(self.step, int):
            raise CheckpointRefusal("checkpoint-manifest", f"{self.dir}: root manifest lacks step or components")
        self.components = {}
        for name, ref in sorted(comps.items()):
            if not isinstance(ref, dict) or "path" not in ref or "sha256" not in ref:
                raise CheckpointRefusal("checkpoint-manifest", f"component {name!r} entry is malformed")
            mpath = safe_join(self.dir, ref["path"], f"component {name}")
            comp = _load_json(mpath, f"component manifest {name}", ref["sha256"])
            _check_format(comp, mpath)
            self.components[name] = self._validate_component(name, comp, os.path.dirname(mpath))
        self._verified = set()

    def _validate_component(self, name, comp, cdir):
        length = comp.get("length")
        shards = comp.get("shards")
        if not isinstance(length, int) or length < 1 or not isinstance(shards, list) or not shards:
            raise CheckpointRefusal("checkpoint-manifest", f"component {name}: length or shards missing")
        pos = 0
        out = []
        for e in sorted(shards, key=lambda e: e.get("start", -1) if isinstance(e, dict) else -1):
            if not isinstance(e, dict) or not all(k in e for k in ("path", "start", "stop", "sha256", "bytes", "dtype")):
                raise CheckpointRefusal("checkpoint-manifest", f"component {name}: a shard entry is malformed")
            if e["dtype"] != "float64" or e["start"] != pos or e["stop"] <= e["start"]:
                raise CheckpointRefusal(
                    "checkpoint-manifest", f"component {name}: shards do not tile [0, {length}) at {pos} ({e['start']}..{e['stop']})"
                )
            pos = e["stop"]
            out.append(dict(e, file=safe_join(cdir, e["path"], f"shard of {name}")))
        if pos != length:
            raise CheckpointRefusal("checkpoint-manifest", f"component {name}: shards end at {pos}, length is {length}")
        return {"length": length, "shards": out}

    def _verify_shard(self, e) -> None:
        if e["file"] in self._verified:
            return
        h = hashlib.sha256()
        size = 0
        try:
            with open(e["file"], "rb") as f:
                for block in iter(lambda: f.read(1 << 22), b""):
                    h.update(block)
                    size += len(block)
        except FileNotFoundError:
            raise CheckpointRefusal("checkpoint-shard-missing", f"shard {e['file']} named by the manifest is missing")
        if size != e["bytes"] or h.hexdigest() != e["sha256"]:
            raise CheckpointRefusal("checkpoint-corrupt", f"shard {e['file']} does not match its manifest sha256/size")
        self._verified.add(e["file"])

    def length(self, component: str) -> int:
        return self.components[component]["length"]

    def read_range(self, component: str, start: int, stop: int) -> np.ndarray:
        """Values [start, stop) of a component, read partially from whichever shards hold them."""
        comp = self.components.get(component)
        if comp is None:
            raise CheckpointRefusal("checkpoint-manifest", f"no component {component!r} (has {sorted(self.components)})")
        if not 0 <= start <= stop <= comp["length"]:
            raise CheckpointRefusal("checkpoint-manifest", f"{component}: range [{start}, {stop}) outside [0, {comp['length']})")
        out = np.empty(stop - start)
        for e in comp["shards"]:
            lo, hi = max(start, e["start"]), min(stop, e["stop"])
            if lo >= hi:
                continue
            self._verify_shard(e)
            with safe_open(e["file"], framework="numpy") as f:
                piece = f.get_slice("values")[lo - e["start"] : hi - e["start"]]
            out[lo - start : hi - start] = piece
        return out

    def verify(self) -> dict:
        """Re-hash every shard and check the manifest tree; returns a summary."""
        total = 0
        for comp in self.components.values():
            for e in comp["shards"]:
                self._verified.discard(e["file"])
                self._verify_shard(e)
                total += e["bytes"]
        return {
            "path": self.dir, "step": self.step, "order_id": self.manifest.get("order_id"),
            "contract_digest": self.manifest.get("contract_digest"),
            "components": {k: {"length": v["length"], "shards": len(v["shards"])} for k, v in self.components.items()},
            "bytes": total,
        }


def open_checkpoint(path: str) -> Checkpoint:
    return Checkpoint(path)
