"""The compiled kernel module `alpha_mpi.kernel._alpha_kernel` (cffi API mode), loaded once.

`ffi` and `lib` are the cffi objects. On a broken install (no compiled module) both are
stand-ins that refuse every use with `kernel-unavailable`, so that importing the package
still works and the refusal names the cause.
"""

from __future__ import annotations

from ..refusals import KernelRefusal

__all__ = ["ffi", "lib"]

try:
    from ._alpha_kernel import ffi, lib
except ImportError as _exc:  # pragma: no cover - exercised only on a broken install
    _IMPORT_ERROR = _exc

    class _Missing:
        def __getattr__(self, name):
            raise KernelRefusal(
                "kernel-unavailable",
                f"the compiled kernel alpha_mpi.kernel._alpha_kernel could not be imported ({_IMPORT_ERROR})",
            )

    ffi = lib = _Missing()
