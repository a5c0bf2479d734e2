"""On-disk layout of a checkpoint directory and the rules that keep reads inside it.

    D/latest                          text, one line: `step-00000040 <sha256 of its manifest.json>`
    D/.lock                           advisory lock (fcntl.flock) held by the one trainer writing D
    D/step-00000040/manifest.json     root manifest: format, version, step, layout order id, contract,
                                      config, scalars, data position and the component manifests
                                      it names by sha256
    D/step-00000040/manifest.sha256   `<sha256>  manifest.json` (the seal: `sha256sum -c` reads it)
    D/step-00000040/params/manifest.json
    D/step-00000040/params/000000000000-000000024328.safetensors   one shard: a logical range
    D/step-00000040/optimizer.m/...

A published step directory is never rewritten. Shards are named by logical coordinate range, not
by rank, so a restore on any rank count reads whatever ranges it now owns. Every byte of a step
is covered: the seal (and `latest`) name the root manifest's sha256, the root manifest names each
component manifest's sha256, each component manifest names each shard's sha256, size, dtype and
shape.
"""

from __future__ import annotations

import errno
import os
import re
import stat

from ..refusals import CheckpointRefusal

FORMAT = "alpha-mpi-checkpoint"
VERSION = 2
LATEST = "latest"
MANIFEST = "manifest.json"
SEAL = "manifest.sha256"
LOCK = ".lock"

STEP_RE = re.compile(r"step-(\d{8})")
HEX64 = re.compile(r"[0-9a-f]{64}")
_LATEST_RE = re.compile(rb"(step-\d{8}) ([0-9a-f]{64})\n")
_SEAL_RE = re.compile(rb"([0-9a-f]{64})  manifest\.json\n")
MAX_POINTER = 256  # bytes: `latest` and the seal are one short line


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def step_of(name: str):
    """The step number a directory name `step-NNNNNNNN` gives, else None."""
    m = STEP_RE.fullmatch(name)
    return int(m.group(1)) if m else None


def tmp_name(step: int) -> str:
    return f".tmp-{step_name(step)}"


def shard_name(start: int, stop: int) -> str:
    return f"{start:012d}-{stop:012d}.safetensors"


def latest_line(step: int, sha256: str) -> bytes:
    return f"{step_name(step)} {sha256}\n".encode("ascii")


def seal_line(sha256: str) -> bytes:
    return f"{sha256}  {MANIFEST}\n".encode("ascii")


def read_small(path: str, what: str, limit: int, missing_code: str = "checkpoint-missing") -> bytes:
    """Read a small file as data: never through a symlink, never a device or a FIFO, never more
    than `limit` bytes. The content is never echoed in a refusal."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise CheckpointRefusal(missing_code, f"{what} {path} is missing", path=path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CheckpointRefusal(
                "checkpoint-latest-invalid" if what == "latest pointer" else "checkpoint-path-escape",
                f"{what} {path} is a symbolic link; alpha_mpi writes it as a regular file and "
                f"never follows it",
                path=path,
            )
        raise CheckpointRefusal(missing_code, f"cannot open {what} {path}: {e.strerror}", path=path)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointRefusal(
                "checkpoint-latest-invalid" if what == "latest pointer" else "checkpoint-manifest",
                f"{what} {path} is not a regular file",
                path=path,
            )
        if st.st_size > limit:
            raise CheckpointRefusal(
                "checkpoint-latest-invalid" if what == "latest pointer" else "checkpoint-manifest",
                f"{what} {path} holds {st.st_size} bytes, more than the {limit} it may",
                path=path,
            )
        chunks, total = [], 0
        while True:
            b = os.read(fd, min(1 << 20, limit + 1 - total))
            if not b:
                break
            chunks.append(b)
            total += len(b)
            if total > limit:
                raise CheckpointRefusal(
                    "checkpoint-manifest", f"{what} {path} grew past {limit} bytes while read"
                )
        return b"".join(chunks)
    finally:
        os.close(fd)


def open_shard(path: str, size: int):
    """Open a shard for reading as data, like `latest`: never through a symlink, never a device,
    a FIFO or a directory (O_NONBLOCK, so opening a FIFO cannot wait for a writer), and only when
    it holds exactly the `size` bytes its manifest entry says, so no read can run past that.
    Returns a binary file object; refuses with `checkpoint-shard-missing`, `checkpoint-path-escape`
    (a symlink) or `checkpoint-corrupt` (not a regular file of that size)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise CheckpointRefusal(
            "checkpoint-shard-missing", f"shard {path} named by the manifest is missing", path=path
        )
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CheckpointRefusal(
                "checkpoint-path-escape",
                f"shard {path} is a symbolic link; alpha_mpi writes shards as regular files and never follows them",
                path=path,
            )
        raise CheckpointRefusal("checkpoint-corrupt", f"cannot open shard {path}: {e.strerror}", path=path)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointRefusal(
                "checkpoint-corrupt", f"shard {path} is not a regular file ({_kind(st.st_mode)})", path=path
            )
        if st.st_size != size:
            raise CheckpointRefusal(
                "checkpoint-corrupt",
                f"shard {path} holds {st.st_size} bytes, its manifest entry says {size}",
                path=path,
            )
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"


def parse_latest(data: bytes, path: str):
    """(step directory name, manifest sha256) from the bytes of `latest`; never echoes them."""
    m = _LATEST_RE.fullmatch(data)
    if m is None:
        raise CheckpointRefusal(
            "checkpoint-latest-invalid",
            f"{path} ({len(data)} bytes) is not one line `step-NNNNNNNN <sha256 of its manifest>` "
            "as alpha_mpi "
            f"writes it (its content is not shown)",
            path=path,
        )
    return m.group(1).decode("ascii"), m.group(2).decode("ascii")


def parse_seal(data: bytes, path: str) -> str:
    m = _SEAL_RE.fullmatch(data)
    if m is None:
        raise CheckpointRefusal(
            "checkpoint-corrupt", f"{path} is not one line `<sha256>  {MANIFEST}`", path=path
        )
    return m.group(1).decode("ascii")


def is_real_dir(path: str) -> bool:
    """A directory that is not a symlink."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def published_steps(root: str) -> list:
    """Step numbers of the `step-NNNNNNNN` directories (not symlinks) in `root`, ascending."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    out = []
    for name in names:
        k = step_of(name)
        if k is not None and is_real_dir(os.path.join(root, name)):
            out.append(k)
    return sorted(out)


def safe_join(base: str, rel: str, what: str) -> str:
    """Resolve a manifest-relative path; refuse absolute paths, `..` and symlinks that leave `base`."""
    if not isinstance(rel, str) or not rel or os.path.isabs(rel) or rel.startswith("~") or "\0" in rel:
        raise CheckpointRefusal(
            "checkpoint-path-escape", f"{what} path {rel!r} is absolute, empty or holds NUL", path=rel
        )
    parts = rel.replace("\\", "/").split("/")
    if any(p in ("..", "") for p in parts):
        raise CheckpointRefusal(
            "checkpoint-path-escape", f"{what} path {rel!r} steps outside with '..'", path=rel
        )
    full = os.path.join(base, *parts)
    real_base = os.path.realpath(base)
    real = os.path.realpath(full)
    if os.path.commonpath([real_base, real]) != real_base:
        raise CheckpointRefusal(
            "checkpoint-path-escape",
            f"{what} path {rel!r} resolves outside {real_base} (a symlink?)",
            path=rel,
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
