"""Writing shards and publishing a checkpoint: write into a temporary directory, fsync files and
directories, rename into place, then atomically move the `latest` pointer.

These functions do no MPI: the Checkpointer runs them on each rank (shards) and on rank 0
(publication) with synchronisation in between.

Test hook: `hooks.point` (None in production) is called as `hooks.point(what, k)` at the k-th
publication filesystem operation of the process (`hooks.count` counts them). The crash tests set
it to a function that SIGKILLs the process at a chosen k (tests/mpi_scripts/ckpt_saver.py); the
product reads no environment variable for it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil

import numpy as np

from ..refusals import CheckpointRefusal
from . import shardfile
from .paths import (
    FORMAT,
    LATEST,
    MANIFEST,
    SEAL,
    VERSION,
    fsync_dir,
    latest_line,
    parse_latest,
    read_small,
    seal_line,
    shard_name,
    step_name,
    step_of,
    tmp_name,
    write_durable,
)


class Hooks:
    """Explicit fault-injection points for tests. `point`: None or a callable(what, k)."""

    def __init__(self):
        self.point = None
        self.count = 0


hooks = Hooks()


def _point(what: str) -> None:
    """A publication step; the crash tests kill the process here (through `hooks.point`)."""
    hooks.count += 1
    if hooks.point is not None:
        hooks.point(what, hooks.count)


def write_failed(e: OSError, what: str) -> CheckpointRefusal:
    """An OSError while writing, named: a full disk, a quota or a permission says so."""
    name = errno.errorcode.get(e.errno, "") if e.errno else ""
    hint = {
        "ENOSPC": " (the disk is full)",
        "EDQUOT": " (disk quota exceeded)",
        "EACCES": " (permission denied)",
        "EROFS": " (read-only file system)",
        "EPERM": " (operation not permitted)",
    }.get(name, "")
    return CheckpointRefusal("checkpoint-write-failed", f"{what}: {e.strerror or e}{hint}", errno=name)


def current_latest(root: str):
    """The step `root/latest` names, None when there is none; a malformed pointer is refused."""
    pointer = os.path.join(root, LATEST)
    if not os.path.lexists(pointer):
        return None
    name, _ = parse_latest(read_small(pointer, "latest pointer", 256), pointer)
    return step_of(name)


def prepare_tmp(root: str, step: int):
    """(rank 0) A fresh temporary directory for `step`, or None when `step` was published but a
    crash came before `latest` moved (then `latest` is moved now and nothing is rewritten).

    A step that is published and named by `latest` (or older than it) is refused: it is never
    rewritten.
    """
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, step_name(step))
    current = current_latest(root)
    if current is not None and current > step:
        raise CheckpointRefusal(
            "checkpoint-exists",
            f"{root}/{LATEST} names step {current}, newer than step {step}; "
            f"published steps are never rewritten or superseded by older ones",
        )
    if os.path.lexists(final):
        if current == step:
            raise CheckpointRefusal(
                "checkpoint-exists", f"{final} is already published; a published step is never rewritten"
            )
        from .reader import Checkpoint

        ck = Checkpoint(final)
        ck.verify()  # complete and intact: finish its publication
        _move_latest(root, step, ck.manifest_sha256)
        return None
    tmp = os.path.join(root, tmp_name(step))
    if os.path.lexists(tmp):  # left by a crashed save: never published, safe to discard
        shutil.rmtree(tmp)
    _point("mkdir tmp")
    os.makedirs(tmp)
    return tmp


def _move_latest(root: str, step: int, sha256: str) -> None:
    pointer = os.path.join(root, f".{LATEST}.tmp")
    _point("write latest.tmp")
    write_durable(pointer, latest_line(step, sha256))
    _point("rename latest")
    os.replace(pointer, os.path.join(root, LATEST))
    fsync_dir(root)


def set_aside(root: str, steps, folder: str) -> str:
    """(rank 0) Move the published `steps` out of the step namespace into `root/folder` (a new
    directory; `folder.2`, `folder.3` ... when taken), newest first, renamed whole: nothing is
    deleted or rewritten, and a resume no longer sees them. Returns the folder's path.

    Called before `latest` moves back (point_latest / drop_latest): a crash in between leaves a
    `latest` that names a missing step, which a resume refuses by name (`checkpoint-missing`),
    never a silent resume from a step that was to be set aside."""
    base, n = os.path.join(root, folder), 1
    dest = base
    while os.path.lexists(dest):
        n += 1
        dest = f"{base}.{n}"
    os.makedirs(dest)
    for k in sorted(steps, reverse=True):
        os.rename(os.path.join(root, step_name(k)), os.path.join(dest, step_name(k)))
    fsync_dir(dest)
    fsync_dir(root)
    return dest


def point_latest(root: str, step: int) -> None:
    """(rank 0) Make `latest` name the published `step`, also when that moves it back (after
    `set_aside` took the newer steps away); nothing is written when it names it already."""
    from .reader import Checkpoint

    if current_latest(root) == step:
        return
    _move_latest(root, step, Checkpoint(os.path.join(root, step_name(step))).manifest_sha256)


def drop_latest(root: str) -> None:
    """(rank 0) Remove `latest` (a resume then takes the newest step that verifies, or starts
    at step 0 when none is left)."""
    pointer = os.path.join(root, LATEST)
    if os.path.lexists(pointer):
        os.remove(pointer)
        fsync_dir(root)


def write_shards(tmp: str, component: str, pieces) -> list:
    """Write (start, stop, array) pieces of one logical vector; return their manifest entries.
    The same values give the same file bytes (shardfile.encode)."""
    cdir = os.path.join(tmp, component)
    os.makedirs(cdir, exist_ok=True)
    entries = []
    for start, stop, arr in pieces:
        data = shardfile.encode(component, start, stop, np.asarray(arr))
        name = shard_name(start, stop)
        _point(f"write {component}/{name}")
        write_durable(os.path.join(cdir, name), data)
        entries.append(
            {
                "path": name,
                "start": start,
                "stop": stop,
                "dtype": "float64",
                "shape": [stop - start],
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
    fsync_dir(cdir)
    return entries


def manifest_bytes(obj) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=True, allow_nan=False) + "\n").encode(
        "ascii"
    )


def publish(root: str, step: int, tmp: str, root_manifest: dict, components: dict) -> str:
    """(rank 0) Write the manifest tree and its seal, rename the step into place, then move
    `latest` to it (naming the root manifest's sha256).

    `components` maps name -> {"length": n, "shards": [entries]}. Until the final rename the
    step does not exist; until the `latest` rename, readers still see the previous step.
    """
    names = {}
    for name, comp in sorted(components.items()):
        shards = sorted(comp["shards"], key=lambda e: e["start"])
        body = manifest_bytes(
            {
                "format": FORMAT,
                "version": VERSION,
                "component": name,
                "length": comp["length"],
                "dtype": "float64",
                "shards": shards,
            }
        )
        _point(f"write {name}/manifest")
        write_durable(os.path.join(tmp, name, MANIFEST), body)
        fsync_dir(os.path.join(tmp, name))
        names[name] = {"path": f"{name}/{MANIFEST}", "sha256": hashlib.sha256(body).hexdigest()}
    body = manifest_bytes(dict(root_manifest, format=FORMAT, version=VERSION, step=step, components=names))
    sha = hashlib.sha256(body).hexdigest()
    _point("write root manifest")
    write_durable(os.path.join(tmp, MANIFEST), body)
    _point("write seal")
    write_durable(os.path.join(tmp, SEAL), seal_line(sha))
    fsync_dir(tmp)
    final = os.path.join(root, step_name(step))
    if os.path.lexists(final):
        raise CheckpointRefusal(
            "checkpoint-exists", f"{final} appeared while saving; refusing to overwrite it"
        )
    _point("rename step")
    os.rename(tmp, final)
    fsync_dir(root)
    _move_latest(root, step, sha)
    return final
