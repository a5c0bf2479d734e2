"""What this process runs on: `environment()`, the Python form of `alpha-mpi env`.

One dict, JSON-able, with:

- `alpha_mpi`: the package version;
- `mpi`: the MPI library's version line (`MPI.Get_library_version()`), the standard version it
  implements, and mpi4py's version;
- `compute`: the compute identity (alpha_mpi.kernel.compute_identity: numpy, its SIMD targets
  and BLAS library, kernel and threads; torch's version, ATen CPU capability, backends,
  deterministic flag, threads and device when torch is importable; the processor, the kernel's
  ISA path and build id) as `fields`, its `digest` (of the fields that change bits) and which
  fields those are (`compared`; the rest are only recorded);
- `kernel`: alpha_mpi's compiled kernel (build id, compiler, flags, ISA path);
- `calibration`: the α-β-γ cost model `auto` chooses realizations by (ALPHA_MPI_CALIBRATION or
  the built-in defaults; tools/bench/calibrate.py measures one);
- `cpu_check`: whether the CPU whose /proc/cpuinfo is read (`cpuinfo`) has the instructions the
  BLAS kernel in use needs (tools/cpu_support.py): `blas` is kernel_check()'s verdict, "missing"
  where a BLAS call would die of SIGILL (`OPENBLAS_CORETYPE=SkylakeX` on an AVX2-only CPU).

torch is imported only when it is installed (importlib.util.find_spec); `torch=False` leaves it
out. Under MPI, `alpha-mpi env` also compares the ranks' identities (ranks_differing).
"""

from __future__ import annotations

import importlib.util

from .. import __version__

__all__ = ["environment"]


def environment(torch: bool | None = None, cpuinfo: str = "/proc/cpuinfo") -> dict:
    """This process's environment (see the module docstring). `torch`: report torch's fields
    (None: when torch is installed; never imported otherwise). `cpuinfo`: the /proc/cpuinfo
    file the BLAS kernel is checked against (another node's, saved, to ask whether it can run
    the kernel chosen here)."""
    from mpi4py import MPI
    from mpi4py import __version__ as mpi4py_version

    from .. import kernel
    from ..model.compute import COMPARED
    from ..planning.cost import load_calibration
    from .cpu_support import cpu_flags, kernel_check

    if torch is None:
        torch = importlib.util.find_spec("torch") is not None
    identity = kernel.compute_identity(torch=torch, numpy=True)
    lib = MPI.Get_library_version().strip().splitlines()
    major, minor = MPI.Get_version()
    build = kernel.build_info()
    calibration = (
        load_calibration().to_dict()
    )  # its `source`: the file ALPHA_MPI_CALIBRATION names, or built-in
    return {
        "alpha_mpi": __version__,
        "mpi": {
            "library": " ".join(lib[0].split()) if lib else "unknown",
            "standard": f"{major}.{minor}",
            "mpi4py": mpi4py_version,
        },
        "compute": {
            "fields": dict(identity.fields),
            "digest": identity.digest,
            "compared": [k for k, _ in identity.fields if k in COMPARED],
        },
        "kernel": {
            "build_id": build["build_id"],
            "isa_path": identity.get("kernel.isa"),  # the identity's reading (a bad ALPHA_MPI_ISA named)
            "isa_paths": kernel.isa_paths(),
            "compiler": build["compiler"],
            "flags": build["flags"],
        },
        "calibration": calibration,
        "cpu_check": {
            "cpuinfo": cpuinfo,
            "blas": kernel_check(identity.get("blas.kernel") or "none", cpu_flags(cpuinfo)),
        },
    }
