"""Can this CPU run the BLAS kernel numpy uses? The check behind `alpha-mpi env`'s `blas check`.

OpenBLAS picks a kernel for the CPU it finds, but `OPENBLAS_CORETYPE` forces one, and OpenBLAS
does not ask whether the CPU has the instructions that kernel was compiled for: numpy imports, the
identity reads `kernel SkylakeX`, and the first matrix product on an AVX2-only CPU dies of
`Illegal instruction` (SIGILL). This module compares the flags a kernel needs (KERNEL_FLAGS: the
instruction-set extensions its `-march` enables, as /proc/cpuinfo spells them) with the CPU's.

Both inputs are parameters, so a test (or an operator checking a compute node's
`/proc/cpuinfo` from a login node: `alpha-mpi env --cpuinfo node-cpuinfo.txt`) can ask about
another CPU or kernel than this process's. No MPI, nothing read at import.
"""

from __future__ import annotations

import os
import stat

_SKYLAKEX = ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl")
_ARMV8_SVE = ("sve",)

#: OpenBLAS kernel (core) name, lower-case -> the CPU flags it needs (x86: /proc/cpuinfo
#: `flags`; AArch64: `Features`). A name not listed is reported as not checked.
KERNEL_FLAGS = {
    "prescott": ("pni",),
    "core2": ("ssse3",),
    "atom": ("ssse3",),
    "penryn": ("ssse3", "sse4_1"),
    "dunnington": ("ssse3", "sse4_1"),
    "nehalem": ("ssse3", "sse4_1", "sse4_2"),
    "sandybridge": ("avx",),
    "bulldozer": ("avx", "fma4"),
    "piledriver": ("avx", "fma"),
    "steamroller": ("avx", "fma"),
    "excavator": ("avx2", "fma"),
    "haswell": ("avx2", "fma"),
    "zen": ("avx2", "fma"),
    "skylakex": _SKYLAKEX,
    "cooperlake": _SKYLAKEX + ("avx512_bf16",),
    "sapphirerapids": _SKYLAKEX + ("avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16"),
    "armv8": ("asimd",),
    "cortexa57": ("asimd",),
    "neoversen1": ("asimd",),
    "thunderx2t99": ("asimd",),
    "armv8sve": _ARMV8_SVE,
    "neoversev1": _ARMV8_SVE,
    "neoversen2": _ARMV8_SVE,
    "a64fx": _ARMV8_SVE,
}


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset | None:
    """The flags of the first processor in `cpuinfo` (a /proc/cpuinfo file: the `flags` line on
    x86, `Features` on AArch64); None when it is not a regular file (a FIFO would block), cannot
    be read or names none."""
    try:
        if not stat.S_ISREG(os.stat(cpuinfo).st_mode):
            return None
        with open(cpuinfo, errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip().lower() in ("flags", "features"):
                    return frozenset(value.split())
    except OSError:
        return None
    return None


def kernel_check(kernel: str, flags) -> dict:
    """Whether a CPU with `flags` (a set of /proc/cpuinfo flags, or None: unknown) can run the
    BLAS kernel(s) `kernel` (the identity's `blas.kernel`: one name, or several joined by
    ' + ' when numpy loads several BLAS libraries). Returns {"kernel", "needs", "missing",
    "verdict"}: verdict "ok", "missing" (a BLAS call would die of SIGILL), or "unchecked" (a
    kernel this table does not know, or no flags to compare with)."""
    names = [k.strip() for k in str(kernel).split("+") if k.strip() and k.strip().lower() != "none"]
    known = [n for n in names if n.lower() in KERNEL_FLAGS]
    needs = sorted({f for n in known for f in KERNEL_FLAGS[n.lower()]})
    if not known or flags is None or len(known) < len(names):
        missing, verdict = [], "unchecked"
    else:
        missing = sorted(set(needs) - set(flags))
        verdict = "missing" if missing else "ok"
    return {"kernel": kernel, "needs": needs, "missing": missing, "verdict": verdict}


def describe(check: dict, where: str = "this CPU") -> str:
    """The `blas check` line of `alpha-mpi env` for a kernel_check() result."""
    kernel, needs = check["kernel"], ", ".join(check["needs"])
    if check["verdict"] == "ok":
        return f"kernel {kernel} runs on {where} (needs {needs})"
    if check["verdict"] == "missing":
        return (
            f"kernel {kernel} needs {', '.join(check['missing'])}, which {where} lacks: the first BLAS "
            "call (a matrix product) dies of Illegal instruction (SIGILL); unset OPENBLAS_CORETYPE or "
            "name a kernel this CPU runs (docs/same-bits.md)"
        )
    return f"kernel {kernel}: not checked (no flags for {where}, or a kernel alpha_mpi does not know)"
