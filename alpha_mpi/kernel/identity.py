"""The compute identity of this process, read from the live libraries (layer 3).

`compute_identity(torch=False)` returns an `alpha_mpi.model.compute.ComputeIdentity`: the
machine; numpy's version and the SIMD targets it dispatches to on this CPU, numpy's BLAS
(library, version and threading layer, the kernel it chose for this CPU and its threads, as
threadpoolctl reports them) — for a learner whose slots compute with numpy; with `torch=True`
(a learner whose slots compute with torch: numpy's fields are then left out unless `numpy=True`,
since numpy's BLAS does not compute those slots) torch's version, ATen CPU capability, backends (BLAS, MKL and its
MKL_CBWR mode, oneDNN on/off), deterministic-algorithms flag, intra-op threads and device; and
the recorded-only facts (processor model, alpha_mpi's kernel ISA path and build id). Which fields
change bits and which are only recorded: alpha_mpi.model.compute (its docstring's table).

torch is imported only with `torch=True`. The stand-ins for other machines on one host:
`OPENBLAS_CORETYPE` (OpenBLAS's kernel, e.g. Haswell, SkylakeX, Sandybridge),
`NPY_DISABLE_CPU_FEATURES` (numpy's SIMD targets), `ATEN_CPU_CAPABILITY` (default, avx2, avx512);
each must be set before the library is first imported, and each changes the identity.
"""

from __future__ import annotations

import hashlib
import os
import platform

from ..model.compute import ComputeIdentity
from ..refusals import KernelRefusal
from .dense import isa_path
from .env import build_info

__all__ = ["compute_identity"]

_LIMIT = 200  # a field's text is at most this long (ComputeIdentity refuses longer ones)


def _text(value: object) -> str:
    """A field's text: `value` as a string, never empty, shortened (with a digest of the whole)
    when longer than a field may be."""
    s = " ".join(str(value).split()) or "none"
    if len(s) <= _LIMIT:
        return s
    return s[: _LIMIT - 20] + " ~" + hashlib.sha256(s.encode()).hexdigest()[:16]


def _numpy_simd() -> str:
    """numpy's baseline SIMD targets and those it dispatches to on this CPU."""
    try:
        from numpy._core import _multiarray_umath as m  # numpy >= 2
    except ImportError:  # numpy 1.x
        from numpy.core import _multiarray_umath as m
    features = getattr(m, "__cpu_features__", {})
    baseline = list(getattr(m, "__cpu_baseline__", []))
    dispatched = [t for t in getattr(m, "__cpu_dispatch__", []) if features.get(t)]
    return " ".join(baseline + dispatched) or "none"


def _numpy_blas() -> list[dict]:
    """threadpoolctl's records of the BLAS libraries numpy uses: those loaded from numpy's own
    directories (a wheel's bundled OpenBLAS), else every BLAS threadpoolctl sees (a numpy linked
    to the system's BLAS)."""
    import numpy as np
    import threadpoolctl

    blas = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
    pkg = os.path.dirname(os.path.abspath(np.__file__))
    own = (pkg + os.sep, pkg + ".libs" + os.sep)
    mine = [i for i in blas if str(i.get("filepath", "")).startswith(own)]
    return mine or blas


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "cpu model", "hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _torch_fields(device: str) -> dict:
    import torch

    config = torch.__config__.show()
    blas = next(
        (ln.split("=", 1)[1] for ln in config.replace(",", "\n").split("\n") if "BLAS_INFO=" in ln), "?"
    )
    mkl = "mkl" if torch.backends.mkl.is_available() else "no mkl"
    cbwr = os.environ.get("MKL_CBWR", "unset")
    onednn = torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled
    return {
        "torch.version": torch.__version__,
        "torch.capability": torch.backends.cpu.get_cpu_capability(),
        "torch.backends": f"blas {blas.strip()}; {mkl} (MKL_CBWR {cbwr}); onednn {'on' if onednn else 'off'}",
        "torch.deterministic": str(bool(torch.are_deterministic_algorithms_enabled())).lower(),
        "torch.threads": str(torch.get_num_threads()),
        "torch.device": device,
    }


def _isa() -> str:
    # An ALPHA_MPI_ISA this rank cannot run is refused where the model chooses its path, inside
    # the learner's start agreement (every rank refuses by name); reading the identity must not
    # raise it first on one rank alone, outside any round.
    try:
        return isa_path()
    except KernelRefusal as e:
        return f"unavailable ({e.context.get('path')})"


def compute_identity(torch: bool = False, device: str = "cpu", numpy: bool | None = None) -> ComputeIdentity:
    """This process's compute identity (alpha_mpi.model.compute.ComputeIdentity).

    `torch`: add torch's fields (imports torch; a learner passes it when its slots compute with
    torch). `numpy`: add numpy's and its BLAS's fields (default: when `torch` is False; `alpha-mpi
    env` asks for both). `device`: the torch device's name, as the contract names it ("cpu", or a
    GPU's name, capability and CUDA version). Read it after the settings it reports are fixed
    (torch's threads and deterministic flag: DataParallel reads it after setting them)."""
    fields = {"machine": platform.machine() or "unknown"}
    if numpy if numpy is not None else not torch:
        import numpy as np

        libs = _numpy_blas()
        fields.update(
            {
                "numpy.version": np.__version__,
                "numpy.simd": _numpy_simd(),
                "blas.library": " + ".join(
                    f"{i.get('internal_api')} {i.get('version')} {i.get('threading_layer', '')}".strip()
                    for i in libs
                )
                or "none",
                "blas.kernel": " + ".join(str(i.get("architecture")) for i in libs) or "none",
                "blas.threads": " + ".join(str(i.get("num_threads")) for i in libs) or "none",
            }
        )
    if torch:
        fields.update(_torch_fields(device))
    fields.update({"cpu": _cpu(), "kernel.isa": _isa(), "kernel.build": build_info()["build_id"][:16]})
    return ComputeIdentity.of({k: _text(v) for k, v in fields.items()})
