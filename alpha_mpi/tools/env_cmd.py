"""`alpha-mpi env`: what this process (and, under MPI, every rank) runs on, and whether the ranks
compute alike. The Python form is `alpha_mpi.environment()` (tools/environment.py)."""

from __future__ import annotations

import json
import sys

from ._args import path, subparser

EXAMPLES = (
    "alpha-mpi env                      # this process: MPI, numpy and its BLAS, torch, kernel, calibration",
    "alpha-mpi env --json               # the same as JSON (alpha_mpi.environment())",
    "mpiexec -n 4 alpha-mpi env         # also: do the ranks compute alike? (which field differs, where)",
    "alpha-mpi env --no-torch           # leave torch out (it is imported only when installed)",
    "alpha-mpi env --cpuinfo node.txt   # can the CPU of that /proc/cpuinfo run this BLAS kernel?",
)


def run(argv) -> int:
    p = subparser(
        "env",
        "Print the environment alpha_mpi runs in: the MPI library and mpi4py, the compute identity "
        "(numpy and its SIMD targets, its BLAS library, kernel and threads; torch's version, CPU "
        "capability and backends when torch is installed; the processor), alpha_mpi's kernel and the "
        "cost-model calibration. Under mpiexec every rank's compute identity is compared and rank 0 "
        "says which ranks differ in which field: ranks that differ compute a BLAS or torch model's "
        "slots with other bits (compute-mismatch). The `blas check` line says whether the CPU has the "
        "instructions the BLAS kernel in use needs (OPENBLAS_CORETYPE can force one it lacks: Illegal "
        "instruction at the first matrix product).",
        EXAMPLES,
    )
    p.add_argument("--json", action="store_true", help="print the environment as JSON (rank 0)")
    p.add_argument("--no-torch", action="store_true", help="do not import torch, even where it is installed")
    p.add_argument(
        "--cpuinfo",
        type=path,
        default="/proc/cpuinfo",
        metavar="FILE",
        help="check the BLAS kernel against this /proc/cpuinfo (e.g. a compute node's, saved) "
        "instead of this machine's (default /proc/cpuinfo)",
    )
    a = p.parse_args(argv)
    from .cpu_support import cpu_flags

    if a.cpuinfo != "/proc/cpuinfo" and cpu_flags(a.cpuinfo) is None:
        p.error(f"--cpuinfo {a.cpuinfo}: not a readable /proc/cpuinfo copy with a flags (or Features) line")
    from mpi4py import MPI

    from ..learning.compute_check import ComputeCheck
    from ..model.compute import ComputeIdentity, MachineIndependent
    from .environment import environment

    comm = MPI.COMM_WORLD
    env = environment(torch=False if a.no_torch else None, cpuinfo=a.cpuinfo)
    identity = ComputeIdentity.of(env["compute"]["fields"])
    # Every rank's identity, compared field by field (recorded, never refused) in one round.
    ranks = ComputeCheck(identity, MachineIndependent("caller")).agree(comm, what="alpha-mpi env")
    differ = ranks.explain(range(comm.Get_size()))
    env["ranks"] = {"size": comm.Get_size(), "classes": list(ranks.classes), "differing": differ}
    if comm.Get_rank() != 0:
        if env["cpu_check"]["blas"]["verdict"] == "missing":  # its own CPU, which rank 0 does not see
            print(f"alpha-mpi env (rank {comm.Get_rank()}): {_blas_check(env['cpu_check'])}", file=sys.stderr)
        return 0
    if a.json:
        print(json.dumps(env, indent=2))
        return 0
    for label, value in lines(env):
        print(f"{label:<18s} {value}")
    return 0


def lines(env: dict) -> list:
    """(label, value) rows of the human-readable form."""
    mpi, comp, ker, cal = env["mpi"], env["compute"], env["kernel"], env["calibration"]
    f = comp["fields"]
    rows = [
        ("alpha_mpi", env["alpha_mpi"]),
        ("mpi", f"{mpi['library']} (MPI {mpi['standard']}), mpi4py {mpi['mpi4py']}"),
        ("machine", f"{f.get('machine')}; {f.get('cpu')}"),
        ("numpy", f"{f.get('numpy.version')}; SIMD {f.get('numpy.simd')}"),
        ("blas", f"{f.get('blas.library')}; kernel {f.get('blas.kernel')}; threads {f.get('blas.threads')}"),
        ("blas check", _blas_check(env["cpu_check"])),
    ]
    if "torch.version" in f:
        rows.append(
            (
                "torch",
                f"{f['torch.version']}; capability {f['torch.capability']}; {f['torch.backends']}; "
                f"deterministic {f['torch.deterministic']}; threads {f['torch.threads']}; {f['torch.device']}",
            )
        )
    else:
        rows.append(("torch", "not reported (not installed, or --no-torch)"))
    rows += [
        (
            "kernel",
            f"isa {ker['isa_path']} (of {', '.join(ker['isa_paths'])}); build {ker['build_id'][:16]}; "
            f"{ker['compiler']}; {' '.join(ker['flags'])}",
        ),
        (
            "calibration",
            f"alpha {cal['alpha'] * 1e6:.1f} us, alpha_msg {cal['alpha_msg'] * 1e6:.1f} us, "
            f"beta {cal['beta'] * 1e9:.2f} ns/B, gamma {cal['gamma'] * 1e9:.2f} ns/B ({cal['source']})",
        ),
        ("compute identity", f"{comp['digest'][:16]} (of {', '.join(comp['compared'])})"),
    ]
    r = env["ranks"]
    if r["size"] > 1:
        same = "all compute alike" if not r["differing"] else f"they differ: {r['differing']}"
        rows.append(("ranks", f"{r['size']}: {same}"))
    return rows


def _blas_check(check: dict) -> str:
    from .cpu_support import describe

    where = "this CPU" if check["cpuinfo"] == "/proc/cpuinfo" else f"the CPU of {check['cpuinfo']}"
    line = describe(check["blas"], where)
    return ("WARNING: " + line) if check["blas"]["verdict"] == "missing" else line
