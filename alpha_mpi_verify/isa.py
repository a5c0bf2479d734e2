"""Instruction sets: build, run and compare the ISA driver (csrc/conformance_driver.c).

Used by tests/test_isa_conformance.py; also usable on its own from a source checkout (it
builds csrc/ of the repository this package sits in):

    python -m alpha_mpi_verify.isa [WORKDIR]

prints a JSON report: the kernel build_id (sha256 of the C sources and flags), the
targets, and per output section the number of elements whose bits differ (NaNs compared
by class: any NaN equals any NaN, because x86-64 and AArch64 produce different default
NaN payloads and signs).

The flags come from alpha_mpi/kernel/build.py (BASE_CFLAGS), the one place they live.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from alpha_mpi.kernel.build import BASE_CFLAGS, build_id

__all__ = [
    "N_DEFAULT",
    "APT_PACKAGES",
    "toolchain",
    "base_cflags",
    "kernel_build_id",
    "build_commands",
    "build_all",
    "run_driver",
    "read_sections",
    "compare",
    "run_conformance",
]

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"
DRIVER = CSRC / "conformance_driver.c"
KERNEL = CSRC / "alpha_kernel.c"
FRAME = CSRC / "frame.c"  # CRC32C and the header patch (the instruction paths differ by ISA)
MAGIC = b"AKCONF01"
N_DEFAULT = 1 << 20  # >= 1e6 elements per function

CROSS_CC = "aarch64-linux-gnu-gcc"
QEMU = ("qemu-aarch64", "qemu-aarch64-static")
APT_PACKAGES = ("gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross", "qemu-user")


def base_cflags() -> list:
    """The kernel's compile flags (alpha_mpi/kernel/build.py BASE_CFLAGS)."""
    return list(BASE_CFLAGS)


def kernel_build_id(flags) -> str:
    """sha256 of the kernel sources and `flags`: the build id evidence names."""
    return build_id(flags)


def toolchain():
    """Paths of the tools, or (None, reason) when something is missing."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return (
            None,
            f"the conformance pair is x86-64 native + AArch64 emulated; this host is {platform.machine()}",
        )
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if not cc:
        return None, "no native C compiler (gcc) on PATH"
    cross = shutil.which(CROSS_CC)
    qemu = next((q for q in map(shutil.which, QEMU) if q), None)
    missing = [name for name, path in ((CROSS_CC, cross), ("qemu-aarch64", qemu)) if not path]
    if missing:
        return None, (
            f"{' and '.join(missing)} not found; install the Debian packages {' '.join(APT_PACKAGES)}"
        )
    return {"cc": cc, "cross": cross, "qemu": qemu}, None


def with_contract(flags, mode):
    """`flags` with -ffp-contract set to `mode` (the FMA negative control uses `fast`)."""
    return [f for f in flags if not f.startswith("-ffp-contract")] + [f"-ffp-contract={mode}"]


def build_commands(tools, workdir, flags):
    """name -> compile command. The same sources and flags everywhere; the negative
    controls change exactly one thing each."""
    src = [str(DRIVER), str(KERNEL), str(FRAME)]
    inc = [f"-I{CSRC}"]
    w = Path(workdir)
    return {
        "x86_64": [tools["cc"], *flags, *inc, *src, "-o", str(w / "drv_x86_64"), "-lm"],
        "aarch64": [tools["cross"], *flags, *inc, *src, "-static", "-o", str(w / "drv_aarch64"), "-lm"],
        # negative control 1: FMA contraction allowed (AArch64 has fmadd/fmla)
        "aarch64_fma": [
            tools["cross"],
            *with_contract(flags, "fast"),
            *inc,
            *src,
            "-static",
            "-o",
            str(w / "drv_aarch64_fma"),
            "-lm",
        ],
        # negative control 2: reciprocal-square-root route for Adam (driver-only macro)
        "x86_64_rsqrt": [
            tools["cc"],
            *flags,
            "-DAK_CONFORMANCE_RSQRT",
            *inc,
            *src,
            "-o",
            str(w / "drv_x86_64_rsqrt"),
            "-lm",
        ],
    }


def build_all(tools, workdir, flags, names=None):
    """Compile the drivers `names` (default: all) in parallel; name -> executable path."""
    cmds = build_commands(tools, workdir, flags)
    names = list(cmds) if names is None else names
    procs = {
        n: subprocess.Popen(cmds[n], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for n in names
    }
    for n, p in procs.items():
        out, _ = p.communicate(timeout=300)
        if p.returncode:
            raise RuntimeError(f"building the {n} driver failed:\n{' '.join(cmds[n])}\n{out}")
    return {n: Path(cmds[n][cmds[n].index("-o") + 1]) for n in names}


def run_driver(tools, name, exe, workdir, n=N_DEFAULT, seed=20240601):
    """Run one driver (AArch64 ones under qemu) over n generated elements; its sections."""
    out = Path(workdir) / f"out_{name}.bin"
    cmd = [str(exe), str(out), str(n), str(seed)]
    if name.startswith("aarch64"):
        cmd = [tools["qemu"], *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr}")
    try:
        return read_sections(out)
    finally:
        out.unlink()  # ~100 MB each; the arrays are in memory now


def read_sections(path):
    """name -> numpy array (uint64 for 8-byte, uint32 for 4-byte elements)."""
    data = Path(path).read_bytes()
    if data[:8] != MAGIC:
        raise ValueError(f"{path}: not a conformance output (magic {data[:8]!r})")
    pos, out = 8, {}
    while pos < len(data):
        name = data[pos : pos + 16].rstrip(b"\0").decode()
        count, elem = np.frombuffer(data, dtype="<u8", count=2, offset=pos + 16)
        pos += 32
        dt = {8: "<u8", 4: "<u4"}[int(elem)]
        out[name] = np.frombuffer(data, dtype=dt, count=int(count), offset=pos).copy()
        pos += int(count) * int(elem)
    return out


def _is_nan(bits):
    if bits.dtype == np.dtype("<u4"):
        return (bits & 0x7F800000 == 0x7F800000) & (bits & 0x007FFFFF != 0)
    return (bits & 0x7FF0000000000000 == 0x7FF0000000000000) & (bits & 0x000FFFFFFFFFFFFF != 0)


FLOAT_SECTIONS = {
    "add",
    "tree_eval",
    "fold",
    "chain_prog",
    "adam_p",
    "adam_m",
    "adam_v",
    "sgd_p",
    "sgd_buf",
    "sgd0_p",
    "round_binary64",
    "widen_binary32",
}


def compare(a, b):
    """section -> {'elements', 'differ', 'nan'}; float sections compare NaNs by class,
    integer sections (statuses, indices) exactly."""
    if set(a) != set(b):
        raise ValueError(f"different sections: {sorted(set(a) ^ set(b))}")
    res = {}
    for name in a:
        x, y = a[name], b[name]
        if x.shape != y.shape:
            res[name] = {"elements": int(x.size), "differ": int(max(x.size, y.size)), "nan": 0}
            continue
        if name in FLOAT_SECTIONS:
            nx, ny = _is_nan(x), _is_nan(y)
            differ = (nx != ny) | ((x != y) & ~(nx & ny))
            res[name] = {"elements": int(x.size), "differ": int(differ.sum()), "nan": int((nx & ny).sum())}
        else:
            res[name] = {"elements": int(x.size), "differ": int((x != y).sum()), "nan": 0}
    return res


def run_conformance(workdir=None, n=N_DEFAULT):
    """Build all four drivers, run them, and compare. Returns a JSON-able report."""
    tools, why = toolchain()
    if tools is None:
        return {"skipped": why}
    workdir = Path(workdir or tempfile.mkdtemp(prefix="alpha_conf_"))
    workdir.mkdir(parents=True, exist_ok=True)
    flags = base_cflags()
    exes = build_all(tools, workdir, flags)
    outs = {name: run_driver(tools, name, exe, workdir, n) for name, exe in exes.items()}
    return {
        "build_id": kernel_build_id(flags),
        "flags": flags,
        "n": n,
        "reference": "x86_64",
        "targets": {name: compare(outs["x86_64"], outs[name]) for name in exes if name != "x86_64"},
        "outputs": outs,
    }


if __name__ == "__main__":
    rep = run_conformance(sys.argv[1] if len(sys.argv) > 1 else None)
    rep.pop("outputs", None)
    print(json.dumps(rep, indent=1))
