"""On-disk layout of a checkpoint directory and the rules that keep reads inside it.

    D/latest                          text: the name of the newest published step directory
    D/step-00000040/manifest.json     root manifest: format, version, step, order id, contract,
                                      config, scalars, and the component manifests it names
    D/step-00000040/params/manifest.json
    D/step-00000040/params/00000000-00024328.safetensors     one shard: a logical coordinate range
    D/step-00000040/optimizer.m/...

A published step directory is never rewritten. Shards are named by logical coordinate range, not
by rank, so a restore on any rank count reads whatever ranges it now owns.
"""

from __future__ import annotations

import os

from ..refusals import CheckpointRefusal

FORMAT = "alpha-mpi-checkpoint"
VERSION = 1
LATEST = "latest"
MANIFEST = "manifest.json"


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def tmp_name(step: int) -> str:
    return f".tmp-{step_name(step)}"


def shard_name(start: int, stop: int) -> str:
    return f"{start:012d}-{stop:012d}.safetensors"


def safe_join(base: str, rel: str, what: str) -> str:
    """Resolve a manifest-relative path; refuse absolute paths, `..` and symlinks that leave `base`."""
    if not isinstance(rel, str) or not rel or os.path.isabs(rel) or rel.startswith("~"):
        raise CheckpointRefusal("checkpoint-path-escape", f"{what} path {rel!r} is absolute or empty", path=rel)
    parts = rel.replace("\\", "/").split("/")
    if any(p in ("..", "") for p in parts):
        raise CheckpointRefusal("checkpoint-path-escape", f"{what} path {rel!r} steps outside with '..'", path=rel)
    full = os.path.join(base, *parts)
    real_base = os.path.realpath(base)
    real = os.path.realpath(full)
    if os.path.commonpath([real_base, real]) != real_base:
        raise CheckpointRefusal(
            "checkpoint-path-escape", f"{what} path {rel!r} resolves to {real}, outside {real_base} (a symlink?)", path=rel
        )
    return full


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: str, data: bytes) -> None:
    """Write a whole file and fsync it (the directory entry is fsynced by the caller)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
