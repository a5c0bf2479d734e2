"""Writing shards and publishing a checkpoint: write into a temporary directory, fsync files and
directories, rename into place, then atomically move the `latest` pointer.

These functions do no MPI: the Checkpointer runs them on each rank (shards) and on rank 0
(publication) with synchronisation in between. `ALPHA_MPI_CKPT_CRASH_AT=k` kills the process
with SIGKILL at the k-th publication filesystem operation (fault injection for the crash tests).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal

import numpy as np
from safetensors.numpy import save as st_save

from ..refusals import CheckpointRefusal
from .layout import FORMAT, LATEST, MANIFEST, VERSION, fsync_dir, shard_name, step_name, tmp_name, write_durable

_ops = 0


def _point(what: str) -> None:
    """A publication step; the crash tests kill the process here."""
    global _ops
    _ops += 1
    crash = os.environ.get("ALPHA_MPI_CKPT_CRASH_AT")
    if crash and int(crash) == _ops:
        os.kill(os.getpid(), signal.SIGKILL)


def prepare_tmp(root: str, step: int):
    """(rank 0) A fresh temporary directory for `step`, or None when `step` was published but a
    crash came before `latest` moved (then `latest` is moved now and nothing is rewritten).

    A step that is published and named by `latest` is refused: it is never rewritten.
    """
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, step_name(step))
    if os.path.exists(final):
        pointer = os.path.join(root, LATEST)
        current = open(pointer).read().strip() if os.path.exists(pointer) else None
        if current == step_name(step) or _newer_than(current, step):
            raise CheckpointRefusal("checkpoint-exists", f"{final} is already published; a published step is never rewritten")
        from .reader import Checkpoint

        Checkpoint(final).verify()  # complete and intact: finish its publication
        _move_latest(root, step)
        return None
    tmp = os.path.join(root, tmp_name(step))
    if os.path.exists(tmp):  # left by a crashed save: never published, safe to discard
        shutil.rmtree(tmp)
    _point("mkdir tmp")
    os.makedirs(tmp)
    return tmp


def _newer_than(name, step) -> bool:
    try:
        return name is not None and int(name.rsplit("-", 1)[1]) > step
    except (IndexError, ValueError):
        return False


def _move_latest(root: str, step: int) -> None:
    pointer = os.path.join(root, f".{LATEST}.tmp")
    _point("write latest.tmp")
    write_durable(pointer, (step_name(step) + "\n").encode())
    _point("rename latest")
    os.replace(pointer, os.path.join(root, LATEST))
    fsync_dir(root)


def write_shards(tmp: str, component: str, pieces) -> list:
    """Write (start, stop, array) pieces of one logical vector; return their manifest entries."""
    cdir = os.path.join(tmp, component)
    os.makedirs(cdir, exist_ok=True)
    entries = []
    for start, stop, arr in pieces:
        arr = np.ascontiguousarray(arr, dtype="<f8")
        if arr.size != stop - start:
            raise CheckpointRefusal("checkpoint-manifest", f"{component} piece [{start}, {stop}) has {arr.size} values")
        data = st_save({"values": arr}, metadata={"component": component, "start": str(start), "stop": str(stop)})
        name = shard_name(start, stop)
        _point(f"write {component}/{name}")
        write_durable(os.path.join(cdir, name), data)
        entries.append({
            "path": name, "start": start, "stop": stop, "dtype": "float64", "shape": [stop - start],
            "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
        })
    fsync_dir(cdir)
    return entries


def _json(obj) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def publish(root: str, step: int, tmp: str, root_manifest: dict, components: dict) -> str:
    """(rank 0) Write the manifest tree, rename the step into place, then move `latest` to it.

    `components` maps name -> {"length": n, "shards": [entries]}. Until the final rename the
    step does not exist; until the `latest` rename, readers still see the previous step.
    """
    names = {}
    for name, comp in sorted(components.items()):
        shards = sorted(comp["shards"], key=lambda e: e["start"])
        body = _json({"format": FORMAT, "version": VERSION, "component": name, "length": comp["length"],
                      "dtype": "float64", "shards": shards})
        _point(f"write {name}/manifest")
        write_durable(os.path.join(tmp, name, MANIFEST), body)
        fsync_dir(os.path.join(tmp, name))
        names[name] = {"path": f"{name}/{MANIFEST}", "sha256": hashlib.sha256(body).hexdigest()}
    manifest = dict(root_manifest, format=FORMAT, version=VERSION, step=step, components=names)
    _point("write root manifest")
    write_durable(os.path.join(tmp, MANIFEST), _json(manifest))
    fsync_dir(tmp)
    final = os.path.join(root, step_name(step))
    if os.path.exists(final):
        raise CheckpointRefusal("checkpoint-exists", f"{final} appeared while saving; refusing to overwrite it")
    _point("rename step")
    os.rename(tmp, final)
    fsync_dir(root)
    _move_latest(root, step)
    return final
