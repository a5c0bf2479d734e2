"""The floating-point environment and the identity of the compiled kernel (layer 3).

- `fpenv_state()` / `fpenv_check()`: the calling thread's rounding mode and FTZ/DAZ as the
  kernel sees them; the check refuses (`fp-environment-off-profile`) anything but
  round-to-nearest with subnormals preserved. The product only ever checks these bits.
- `build_info()`: flags, compiler, machine and `build_id` (sha256 of the C sources and flags)
  of the compiled kernel, the identity conformance evidence names.
- `isa_path()`: the instruction-set path the kernel runs (recorded in the compute identity).
- `_set_ftz_daz`: the verification hook (see its docstring); not product API.

`alpha_mpi.kernel` re-exports the public names.
"""

from __future__ import annotations

import platform
from typing import TypedDict

from ..refusals import KernelRefusal
from .compiled import ffi, lib

__all__ = ["fpenv_state", "fpenv_check", "build_info", "isa_path"]

# ----------------------------------------------------------------------------- FP environment

_REGISTER = {"x86_64": "MXCSR", "aarch64": "FPCR"}


class FpEnvState(TypedDict):
    """What `fpenv_state()` returns: `arch`, the control `register` read (`MXCSR`, `FPCR` or
    `none`) and its `raw` value, whether rounding is to nearest, FTZ and DAZ, and `on_profile`
    (round-to-nearest with subnormals preserved)."""

    arch: str
    register: str
    raw: int
    rounding_nearest: bool
    ftz: bool
    daz: bool
    on_profile: bool


def fpenv_state() -> FpEnvState:
    """The floating-point environment of the calling thread, as the kernel sees it."""
    raw = ffi.new("uint32_t *")
    flags = lib.ak_fpenv_check(raw)
    arch = ffi.string(lib.ak_arch()).decode()
    return {
        "arch": arch,
        "register": _REGISTER.get(arch, "none"),
        "raw": int(raw[0]),
        "rounding_nearest": not (flags & lib.AK_FPENV_ROUNDING),
        "ftz": bool(flags & lib.AK_FPENV_FTZ),
        "daz": bool(flags & lib.AK_FPENV_DAZ),
        "on_profile": flags == 0,
    }


def fpenv_check() -> FpEnvState:
    """Refuse (fp-environment-off-profile) unless rounding is to nearest and FTZ/DAZ are off.
    Returns fpenv_state() when the environment is on profile."""
    s = fpenv_state()
    if s["on_profile"]:
        return s
    wrong = []
    if not s["rounding_nearest"]:
        wrong.append("rounding mode is not round-to-nearest-even")
    if s["ftz"]:
        wrong.append("flush-to-zero (FTZ) is on")
    if s["daz"]:
        wrong.append("denormals-are-zero (DAZ) is on")
    raise KernelRefusal(
        "fp-environment-off-profile",
        f"expected round-to-nearest with subnormals preserved, found: {'; '.join(wrong)} "
        f"({s['register']} = 0x{s['raw']:08x})",
        **s,
    )


# ------------------------------------------------------------------ verification hook


def _set_ftz_daz(ftz: bool, daz: bool) -> None:
    """Verification hook, not product API: switch FTZ / DAZ of the calling thread (x86-64,
    AArch64) so that the fp-environment refusal can be exercised in-process. Reached only from
    `alpha_mpi_verify.fpenv` (set_ftz_daz, ftz_daz); no product code calls it."""
    if lib.ak_fpenv_set_ftz_daz(1 if ftz else 0, 1 if daz else 0):
        raise KernelRefusal("kernel-bad-argument", f"cannot set FTZ/DAZ on {platform.machine()}")


# ----------------------------------------------------------------------------- identity


class BuildInfo(TypedDict):
    """What `build_info()` returns: `build_id` (sha256 hex of the C sources and flags), the
    compiler `flags`, `compiler`, `arch`, `machine`, and the compiled `module`'s file (or None)."""

    build_id: str
    flags: list[str]
    compiler: str
    arch: str
    machine: str
    module: str | None


def build_info() -> BuildInfo:
    """Flags, compiler and machine of the compiled kernel, and its build_id (sha256 of the
    C sources and flags at build time): the identity conformance evidence names."""
    flags = ffi.string(lib.ak_build_flags()).decode()
    return {
        "build_id": ffi.string(lib.ak_build_id()).decode(),
        "flags": flags.split(),
        "compiler": ffi.string(lib.ak_compiler()).decode(),
        "arch": ffi.string(lib.ak_arch()).decode(),
        "machine": platform.machine(),
        "module": getattr(__import__("alpha_mpi.kernel._alpha_kernel", fromlist=["x"]), "__file__", None),
    }


def isa_path() -> str:
    """The instruction-set path of the compiled kernel: its architecture as the C code reports
    it (`x86_64`, `aarch64`, ...). Its fixed-order functions give the same bits on every path, so
    the compute identity records it without comparing it. (One small function: the dense kernels
    name their SIMD path here, e.g. "avx512", "avx2", "sse2", "neon", "generic".)"""
    return ffi.string(lib.ak_arch()).decode()
