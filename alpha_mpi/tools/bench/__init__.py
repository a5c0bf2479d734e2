"""Benchmarks, in the style of mpi4py's bench.py: `alpha-mpi bench COMMAND [options]` or
`python -m alpha_mpi.tools.bench COMMAND [options]`, under mpiexec.

Each command is a module with `cmd(comm, argv) -> int` and its own argparse; it prints on rank 0
only. Commands are imported on first use, so a missing optional one (e.g. `train`, which lives
in train_bench.py) is reported, not fatal to the others. An unknown command is an error on
rank 0 and exits 2 on every rank.

The modules: allreduce_bench (the loop) with allreduce_args, allreduce_variants and
allreduce_report; floor (the bare mpi4py exchange the allreduce table compares with); dot_bench,
train_bench, torch_bench (with torch_models), calibrate, kernel_bench; summary (a sweep's summary
and merged results); harness and results (what they share); baseline.

Collectives: the harness may time and aggregate with MPI collectives (Barrier, gather of
timings); MPI_Allreduce on data appears only in baseline.py, the reference being measured.
alpha_mpi's own combines never use a collective.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "allreduce": (
        "alpha_mpi.tools.bench.allreduce_bench",
        "declared-order allreduce (every realization, auto) vs MPI_Allreduce",
    ),
    "dot": (
        "alpha_mpi.tools.bench.dot_bench",
        "sum/dot of distributed arrays (pairwise over global indices) vs MPI_Allreduce(np.dot)",
    ),
    "train": ("alpha_mpi.tools.bench.train_bench", "data-parallel training step time"),
    "audit": (
        "alpha_mpi.tools.bench.audit_bench",
        "step time with audited slots (K = 0, 1, S) and replica digests every 10 steps",
    ),
    "calibrate": (
        "alpha_mpi.tools.bench.calibrate",
        "measure the α, β, γ of auto's cost model (writes a JSON for ALPHA_MPI_CALIBRATION)",
    ),
    "torch": (
        "alpha_mpi.tools.bench.torch_bench",
        "alpha_mpi.torch vs torch DDP (gloo) step time (needs .[torch])",
    ),
    "kernel": (
        "alpha_mpi.tools.bench.kernel_bench",
        "the C kernel alone: fused k-input add vs copy bandwidth, C Adam vs numpy (one process)",
    ),
    "summary": (
        "alpha_mpi.tools.bench.summary",
        "summarize allreduce runs of an MPI algorithm sweep; --merge them into one file per p",
    ),
}

EXIT_USAGE = 2


def _comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _usage() -> str:
    lines = [
        "usage: alpha-mpi bench COMMAND [options]   (python -m alpha_mpi.tools.bench COMMAND ...)",
        "",
        "commands:",
    ]
    lines += [f"  {name:10s} {help_text}" for name, (_, help_text) in COMMANDS.items()]
    lines.append("\nRun `alpha-mpi bench COMMAND --help` for a command's options (under mpiexec -n P).")
    lines += [
        "",
        "examples:",
        "  mpiexec -n 2 alpha-mpi bench allreduce --sizes 8,1K,1M --iters 20 --json out.json --plot out.png",
        "  mpiexec -n 2 alpha-mpi bench calibrate --out cal.json     # then ALPHA_MPI_CALIBRATION=cal.json",
        "  mpiexec -n 2 alpha-mpi bench train --steps 20",
        "  alpha-mpi bench summary benchmarks/results/mpich-sweep-p2.json",
        "  alpha-mpi bench kernel --sizes 1e6,1e7 --repeat 10",
    ]
    return "\n".join(lines)


def run(argv=None) -> int:
    """Dispatch `argv` = [COMMAND, options...]; returns the exit status (the same on every rank)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    comm = _comm()
    rank = comm.Get_rank()
    if not argv or argv[0] in ("-h", "--help"):
        if rank == 0:
            print(_usage())
        return 0 if argv else EXIT_USAGE
    name, rest = argv[0], argv[1:]
    entry = COMMANDS.get(name)
    if entry is None:
        if rank == 0:
            print(
                f"alpha-mpi bench: error [usage] unknown command {name!r}; choose from {', '.join(COMMANDS)}",
                file=sys.stderr,
            )
        return EXIT_USAGE
    module_name = entry[0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name:
            raise
        if rank == 0:
            print(
                f"alpha-mpi bench: error [usage] the {name!r} benchmark is not available in this installation "
                f"(module {module_name} is missing)",
                file=sys.stderr,
            )
        return EXIT_USAGE
    fn = getattr(module, "cmd", None)
    if fn is not None:
        return int(fn(comm, rest) or 0)
    return int(module.run(rest) or 0)  # a command written as run(argv) like the CLI's tools
