"""Start-up cost: the imports, then a program's first reduction (issue 42 item 5).

    python benchmarks/startup.py [repetitions] [launches]

1. Import: `python -c "import mpi4py.MPI, numpy"` (the baseline), the same followed by
   `import alpha_mpi`, by `import alpha_mpi.arrays` and by `from alpha_mpi import allreduce`;
   wall time of the whole interpreter as the shell sees it, the four taking turns
   `repetitions` times (10 unless given), run from a directory outside the source tree.
   Prints each median with its spread (min-max), each package's median minus the baseline's
   (target: <= 0.12 s), and the ratio to the baseline.
2. First reduction: `mpiexec -n 2`, each rank times from the end of its imports to the end of
   its first reduction of 8 bytes (one float64): `alpha_mpi.allreduce(comm, x)` after `import
   alpha_mpi` (the call loads the executor and the planner), `allreduce(comm, x)` after `from
   alpha_mpi import allreduce` (the import loads them) and `arrays.sum(comm, x, rank, 2)`,
   each in its own job, `launches` jobs each (5 unless given);
   the time of a launch is the slower rank's. Target: <= 20 ms with the engine's C round
   already built (this script builds it first: `alpha-mpi native --build`).

The bytecode caches are written before measuring (a warm-up run of each command without
PYTHONDONTWRITEBYTECODE): an installed package has them (pip compiles a wheel at install), and
without them every module is compiled from source at each start (several times the cost).
The load average is printed before and after: on a shared machine the figures are indicative.
"""

import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

BASE = "import mpi4py.MPI, numpy"
IMPORTS = {
    "mpi4py.MPI, numpy": BASE,
    "+ alpha_mpi": BASE + "; import alpha_mpi",
    "+ alpha_mpi.arrays": BASE + "; import alpha_mpi.arrays",
    "+ from alpha_mpi import allreduce": BASE + "; from alpha_mpi import allreduce",
}
FIRST = {
    "allreduce(comm, x)": (
        "import alpha_mpi",
        "alpha_mpi.allreduce(comm, x)",
    ),
    # the name imported: the executor and the planner load with the import, not in the call
    "from ... import allreduce": (
        "from alpha_mpi import allreduce",
        "allreduce(comm, x)",
    ),
    "arrays.sum(comm, x, rank, 2)": (
        "from alpha_mpi import arrays",
        "arrays.sum(comm, x, comm.rank, comm.size)",
    ),
}
# One rank's program: the timer starts where the imports end.
PROGRAM = """
import time
import numpy as np
from mpi4py import MPI
{imp}
comm = MPI.COMM_WORLD
x = np.array([1.0 + comm.rank])
t0, c0 = time.perf_counter(), time.process_time()
{call}
mine = np.array([time.perf_counter() - t0, time.process_time() - c0])
every = np.zeros((comm.size, 2)) if comm.rank == 0 else None
comm.Gather(mine, every, root=0)  # after the timing: the benchmark's own channel
if comm.rank == 0:
    for r, (wall, cpu) in enumerate(every):
        print("first", r, wall, cpu)
"""


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _mpiexec() -> str:
    local = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return local if os.path.exists(local) else "mpiexec"


def _spread(xs) -> str:
    return f"{statistics.median(xs) * 1e3:7.1f} ms  ({min(xs) * 1e3:.1f}-{max(xs) * 1e3:.1f})"


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def imports(reps: int, cwd: str) -> tuple:
    """(wall times, CPU times of the child) per command."""
    env = _env()
    for code in IMPORTS.values():  # warm-up: bytecode caches, the OS's file cache
        subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=cwd)
    wall: dict = {k: [] for k in IMPORTS}
    cpu: dict = {k: [] for k in IMPORTS}
    for _ in range(reps):
        for name, code in IMPORTS.items():
            t0, c0 = time.perf_counter(), _cpu()
            subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=cwd)
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(_cpu() - c0)
    return wall, cpu


def first_reductions(launches: int, cwd: str) -> dict:
    env = _env()
    subprocess.run([sys.executable, "-m", "alpha_mpi", "native", "--build"], check=True, env=env, cwd=cwd)
    wall: dict = {k: [] for k in FIRST}
    cpu: dict = {k: [] for k in FIRST}
    for i in range(launches + 1):  # the first launch warms the caches and is not counted
        for name, (imp, call) in FIRST.items():
            cmd = [_mpiexec(), "-n", "2", sys.executable, "-c", PROGRAM.format(imp=imp, call=call)]
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
            if r.returncode != 0:
                raise SystemExit(f"{name}: exit {r.returncode}\n{r.stdout}\n{r.stderr[-2000:]}")
            ranks = [(float(a), float(b)) for a, b in re.findall(r"^first \d+ (\S+) (\S+)$", r.stdout, re.M)]
            if len(ranks) != 2:
                raise SystemExit(f"{name}: expected two ranks' times\n{r.stdout}")
            if i:
                wall[name].append(max(a for a, _ in ranks))
                cpu[name].append(max(b for _, b in ranks))
    return wall, cpu


def main(argv) -> None:
    reps = int(argv[0]) if argv else 10
    launches = int(argv[1]) if len(argv) > 1 else 5
    with tempfile.TemporaryDirectory() as cwd:  # outside the source tree
        load0 = os.getloadavg()[0]
        t, tc = imports(reps, cwd)
        f, fc = first_reductions(launches, cwd)
        load1 = os.getloadavg()[0]
    print(
        f"# python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {load0:.1f} -> {load1:.1f}"
    )
    print("# (the targets are wall times; the CPU times beside them say what a loaded machine inflates)")
    for what, times in (("wall", t), ("CPU", tc)):
        base = statistics.median(times["mpi4py.MPI, numpy"])
        print(f"# import: python -c {what} time, median (min-max) of {reps}, interleaved")
        for name, xs in times.items():
            extra = ""
            if name != "mpi4py.MPI, numpy":
                m = statistics.median(xs)
                extra = f"  over baseline {(m - base) * 1e3:+.1f} ms (target <= +120), ratio {m / base:.2f}"
            print(f"{name:34s} {_spread(xs)}{extra}")
    for what, times in (("wall", f), ("CPU", fc)):
        print(
            f"# first reduction, 8 B, p = 2, from the end of the import, {what} time (slower rank), median of {launches}"
        )
        for name, xs in times.items():
            print(f"{name:30s} {_spread(xs)}  (target <= 20 ms)")


if __name__ == "__main__":
    main(sys.argv[1:])
