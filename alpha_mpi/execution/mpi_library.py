"""MPI loaded with a named refusal: `require_mpi`, the first thing the execution layer does.

mpi4py from PyPI carries no MPI library: it loads one at its first `from mpi4py import MPI`
(the `mpich` wheel's, or a cluster's MPI module's). Where there is none it raises
`RuntimeError: cannot load MPI library`, which says nothing about what to install; a Python
install of `alpha_mpi[torch]` without the `mpich` extra met exactly that. This turns it into the
refusal `mpi-unavailable` whose advice says what to install or load.
"""

from __future__ import annotations

from types import ModuleType

from ..refusals import Refusal

__all__ = ["require_mpi"]


def require_mpi() -> ModuleType:
    """mpi4py's `MPI` module, or `mpi-unavailable` when mpi4py cannot load an MPI library."""
    try:
        from mpi4py import MPI
    except (RuntimeError, ImportError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise Refusal(
            "mpi-unavailable", f"alpha_mpi needs an MPI library and mpi4py could not load one ({first})"
        ) from None
    return MPI
