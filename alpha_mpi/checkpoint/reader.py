"""Reading a checkpoint from its path alone: the manifest tree is self-describing.

`open_checkpoint(path)` accepts the checkpoint directory (reads `latest` as data) or a step
directory. Before any field is used, the root manifest's sha256 is compared with its seal
(`manifest.sha256`, and with `latest` when reached through it); every field is then typed and
validated (schema.py). Every path in a manifest is checked to stay inside the step directory;
every shard that is read is hashed against its manifest entry and its safetensors header is
compared with the entry's dtype and shape; the shards of each component must tile its length.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from ..refusals import CheckpointRefusal, Refusal
from . import schema, shardfile
from .paths import (
    LATEST,
    MANIFEST,
    MAX_POINTER,
    SEAL,
    is_real_dir,
    open_shard,
    parse_latest,
    parse_seal,
    published_steps,
    read_small,
    safe_join,
    step_name,
    step_of,
)

MAX_ROOT_MANIFEST = 16 << 20
MAX_COMPONENT_MANIFEST = 256 << 20


def read_latest(root: str):
    """(step directory, manifest sha256) that `root/latest` names, or None when there is none.

    `latest` is read as data: a symlink, a device, a FIFO, an oversized file or anything but
    `step-NNNNNNNN <sha256>` is refused (`checkpoint-latest-invalid`) and its content is never
    shown; the step it names must be a real directory inside `root`.
    """
    pointer = os.path.join(root, LATEST)
    if not os.path.lexists(pointer):
        return None
    name, sha = parse_latest(read_small(pointer, "latest pointer", MAX_POINTER), pointer)
    step_dir = os.path.join(root, name)
    if not is_real_dir(step_dir):
        raise CheckpointRefusal(
            "checkpoint-missing", f"{pointer} names {name}, which is not a directory in {root}", path=step_dir
        )
    return step_dir, sha


def is_step_dir(path: str) -> bool:
    return os.path.lexists(os.path.join(path, MANIFEST))


def resolve(path: str):
    """(step directory, expected manifest sha256 or None) that a path names: itself, or the step
    its `latest` names."""
    if is_step_dir(path):
        return path, None
    found = read_latest(path)
    if found is None:
        steps = published_steps(path)
        extra = (
            (
                f"; it holds {', '.join(step_name(k) for k in steps[-3:])} but no {LATEST} pointer "
                f"(`alpha-mpi checkpoint verify {path} --all` shows which verify)"
            )
            if steps
            else ""
        )
        raise CheckpointRefusal(
            "checkpoint-missing", f"{path} has neither {MANIFEST} nor a {LATEST} pointer{extra}", path=path
        )
    return found


def _root_bytes(step_dir: str, expected: str | None):
    data = read_small(os.path.join(step_dir, MANIFEST), "root manifest", MAX_ROOT_MANIFEST)
    actual = hashlib.sha256(data).hexdigest()
    seal_path = os.path.join(step_dir, SEAL)
    if not os.path.lexists(seal_path):
        try:
            version = schema.loads(data, "root manifest").get("version")
        except Refusal:
            version = None
        if version not in (None, 2) and type(version) is int:
            raise CheckpointRefusal(
                "checkpoint-format-version",
                f"{step_dir} has format version {version} (no {SEAL} seal); this alpha_mpi reads 2",
            )
        raise CheckpointRefusal(
            "checkpoint-corrupt", f"{step_dir} has no {SEAL}: its root manifest is not sealed", path=step_dir
        )
    sealed = parse_seal(read_small(seal_path, "manifest seal", MAX_POINTER, "checkpoint-corrupt"), seal_path)
    if sealed != actual:
        raise CheckpointRefusal(
            "checkpoint-corrupt",
            f"{step_dir}/{MANIFEST} does not match the sha256 in its {SEAL}",
            path=step_dir,
        )
    if expected is not None and expected != actual:
        raise CheckpointRefusal(
            "checkpoint-corrupt",
            f"{step_dir}/{MANIFEST} does not match the sha256 the {LATEST} pointer names",
            path=step_dir,
        )
    return data, actual


class Checkpoint:
    """One published step, opened from its path (see `open_checkpoint`): `dir`, `step`,
    `manifest` (validated), `manifest_sha256`, `components` (name -> length and shards).
    `length(name)`, `read_range(name, start, stop)` (hashing each shard it touches first) and
    `verify()` (re-hashing every shard). `expected_sha256`: the manifest sha256 the caller
    expects (else the one `latest` names, when reached through it)."""

    def __init__(self, path: str, expected_sha256: str | None = None) -> None:
        self.dir, latest_sha = resolve(path)
        data, self.manifest_sha256 = _root_bytes(self.dir, expected_sha256 or latest_sha)
        where = os.path.join(self.dir, MANIFEST)
        self.manifest = schema.loads(data, f"root manifest {where}")
        schema.validate_root(self.manifest, step_of(os.path.basename(os.path.normpath(self.dir))), where)
        self.step = self.manifest["step"]
        self.components = {}
        for name, ref in sorted(self.manifest["components"].items()):
            mpath = safe_join(self.dir, ref["path"], f"component {name}")
            body = read_small(
                mpath, f"component manifest {name}", MAX_COMPONENT_MANIFEST, "checkpoint-shard-missing"
            )
            if hashlib.sha256(body).hexdigest() != ref["sha256"]:
                raise CheckpointRefusal(
                    "checkpoint-corrupt",
                    f"component manifest {mpath} does not match the sha256 its root manifest names",
                )
            comp = schema.loads(body, f"component manifest {mpath}")
            shards = schema.validate_component(name, comp, mpath)
            cdir = os.path.dirname(mpath)
            self.components[name] = {
                "length": comp["length"],
                "shards": [dict(e, file=safe_join(cdir, e["path"], f"shard of {name}")) for e in shards],
            }
        self._verified = set()

    def _verify_shard(self, name: str, e) -> None:
        if e["file"] in self._verified:
            return
        h = hashlib.sha256()
        size = 0
        # Opened as data (regular file, no symlink, no FIFO, exactly its size): reads are bounded.
        with open_shard(e["file"], e["bytes"]) as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
                size += len(block)
                if size > e["bytes"]:
                    break
            if size == e["bytes"] and h.hexdigest() == e["sha256"]:
                f.seek(0)
                shardfile.check_header(f, e["file"], size, name, e["start"], e["stop"])
        if size != e["bytes"] or h.hexdigest() != e["sha256"]:
            raise CheckpointRefusal(
                "checkpoint-corrupt", f"shard {e['file']} does not match its manifest sha256/size"
            )
        self._verified.add(e["file"])

    def length(self, component: str) -> int:
        comp = self.components.get(component)
        if comp is None:
            raise CheckpointRefusal(
                "checkpoint-manifest", f"no component {component!r} (has {sorted(self.components)})"
            )
        return comp["length"]

    def read_range(self, component: str, start: int, stop: int) -> np.ndarray:
        """Values [start, stop) of a component, read partially from whichever shards hold them."""
        length = self.length(component)
        if not 0 <= start <= stop <= length:
            raise CheckpointRefusal(
                "checkpoint-manifest", f"{component}: range [{start}, {stop}) outside [0, {length})"
            )
        out = np.empty(stop - start)
        for e in self.components[component]["shards"]:
            lo, hi = max(start, e["start"]), min(stop, e["stop"])
            if lo >= hi:
                continue
            self._verify_shard(component, e)
            out[lo - start : hi - start] = shardfile.read_values(
                e["file"], e["bytes"], component, e["start"], e["stop"], lo, hi
            )
        return out

    def verify(self) -> dict:
        """Re-hash every shard and check its header; returns a summary."""
        total = 0
        for name, comp in self.components.items():
            for e in comp["shards"]:
                self._verified.discard(e["file"])
                self._verify_shard(name, e)
                total += e["bytes"]
        return {
            "path": self.dir,
            "step": self.step,
            "manifest_sha256": self.manifest_sha256,
            "layout_order_id": schema.layout_order_id_of(self.manifest),
            "contract_digest": self.manifest.get("contract_digest"),
            "components": {
                k: {"length": v["length"], "shards": len(v["shards"])} for k, v in self.components.items()
            },
            "bytes": total,
        }


def open_checkpoint(path: str) -> Checkpoint:
    """The checkpoint at `path`: a checkpoint directory (the step its `latest` names, read as
    data) or a step directory. Its seal and every manifest field are checked on opening;
    `verify()` re-hashes every shard, `read_range(component, start, stop)` reads values
    (hashing each shard it touches first). Refusals: `checkpoint-*` codes (docs/errors.md)."""
    return Checkpoint(path)


def newest_verifying(root: str, below=None):
    """(Checkpoint, [(step, refusal code)] of newer steps that did not verify) for the newest
    step directory in `root` that verifies completely, or (None, skipped)."""
    skipped = []
    for k in reversed(published_steps(root)):
        if below is not None and k >= below:
            continue
        try:
            ck = Checkpoint(os.path.join(root, step_name(k)))
            ck.verify()
            return ck, skipped
        except Refusal as e:
            skipped.append((k, e.code))
    return None, skipped
