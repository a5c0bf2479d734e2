"""`alpha-mpi native [--build]`: which MPI, compiler and file the engine's C round uses.

The engine's round is C built by the MPI library's own mpicc at first use (alpha_mpi/execution/
native.py). This command says what that build uses in this environment (the libmpi mpi4py
loads, its mpicc, the cache file) and with --build makes it now: on a login node with a
compiler for compute nodes without one (a shared cache, ALPHA_MPI_NATIVE_CACHE), or in CI.
"""

from __future__ import annotations

from ._args import subparser

EXAMPLES = (
    "alpha-mpi native                 # what the C round is built with, and whether it is built",
    "alpha-mpi native --build         # build it now (then load it and check its MPI)",
    "ALPHA_MPI_NATIVE_CACHE=/shared/alpha alpha-mpi native --build",
)


def run(argv) -> int:
    p = subparser(
        "native",
        "Show (and with --build, make) the engine's C round for the MPI library mpi4py loads: built "
        "by that MPI's own mpicc (ALPHA_MPI_MPICC overrides), cached under ALPHA_MPI_NATIVE_CACHE "
        "(default ~/.cache/alpha_mpi/native).",
        EXAMPLES,
    )
    p.add_argument(
        "--build", action="store_true", help="build it now if it is not built, load it and check it"
    )
    a = p.parse_args(argv)
    from ..execution import native

    b = native.Build()
    if a.build:
        native.load()  # builds, loads and checks MPI_Get_library_version (refused by name)
    print(b.describe())
    return 0
