"""What the benchmark commands share: a rank-0 parser, the machine line, per-rank statistics,
the slowest rank's time, interleaved step timing and the step-time table.

The harness may time and aggregate with MPI collectives on buffers (Barrier, Gather, Allreduce
of timings, never pickles); it never touches the data of a combine.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import socket
import statistics
import time

import mpi4py
import numpy as np
from mpi4py import MPI


class RankParser(argparse.ArgumentParser):
    """argparse that prints on rank 0 only; every rank exits with the same status."""

    def __init__(self, rank, **kw):
        self._rank = rank
        super().__init__(**kw)

    def _print_message(self, message, file=None):
        if self._rank == 0:
            super()._print_message(message, file)


def memory_refusal(nbytes: int, what: str):
    """A `usage` Refusal when `what` would need `nbytes` of arrays, more than half this machine's
    memory (None when it fits, or when the machine does not say): a size too large for the
    machine is a named usage error, not a MemoryError traceback halfway through a run."""
    from ...refusals import Refusal

    try:
        have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    if nbytes <= have // 2:
        return None
    return Refusal(
        "usage",
        f"{what} needs {nbytes / 2**30:.1f} GiB, more than half of this machine's {have / 2**30:.1f} GiB",
    )


def check_outputs(comm, outputs, root: int = 0) -> None:
    """Refuse on every rank, before any work, an output path `root` (the rank that writes the
    outputs) could not write: `outputs` is [(flag, path or None, the writer makes missing
    folders)]. The verdict and its message travel from `root` to every rank by buffer
    broadcasts, so the whole job refuses by name (`output-unwritable`) instead of one rank
    raising while the others wait for it in the benchmark's first collective."""
    from ...refusals import Refusal
    from .._args import check_output

    message = b""
    if comm.Get_rank() == root:
        try:
            for flag, path, make_folder in outputs:
                if path is not None:
                    check_output(path, flag, make_folder=make_folder)
        except Refusal as e:
            message = e.message.encode()
    size = np.array([len(message)], dtype=np.int64)
    comm.Bcast(size, root=root)  # harness bookkeeping through buffers, never pickles
    if size[0] == 0:
        return
    text = np.frombuffer(message, dtype=np.uint8).copy() if message else np.empty(size[0], dtype=np.uint8)
    comm.Bcast(text, root=root)
    said = text.tobytes().decode(errors="replace")
    raise Refusal("output-unwritable", said if comm.Get_rank() == root else f"{said} (rank {root} writes it)")


STATISTICS = {"mean": np.mean, "median": np.median, "min": np.min}


def statistic(times, how: str) -> float:
    """The per-rank statistic (`mean`, `median` or `min`) of a list of times; nan when empty."""
    return float(STATISTICS[how](times)) if len(times) else float("nan")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(comm) -> dict:
    """Host, CPU, cores, MPI library, versions, rank count and whether ranks outnumber cores."""
    lib = MPI.Get_library_version().strip().splitlines()
    mpi = " ".join(lib[0].split())
    device = next((" ".join(line.split()) for line in lib if "Device" in line), "")
    cores = os.cpu_count() or 1
    p = comm.Get_size()
    return {
        "hostname": socket.gethostname(),
        "cpu": cpu_name(),
        "cores": cores,
        "mpi": mpi + (f" ({device})" if device else ""),
        "mpi4py": mpi4py.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "p": p,
        "oversubscribed": p > cores,
    }


def slowest(comm, seconds: float) -> float:
    """The largest of one value over ranks (harness timing through a buffer, never a pickle)."""
    worst = np.empty(1)
    comm.Allreduce(np.array([float(seconds)]), worst, op=MPI.MAX)
    return float(worst[0])


def timed(comm, fn) -> tuple:
    """Barrier, then fn(): (its wall time on this rank, what it returned)."""
    comm.Barrier()  # harness synchronisation only; no data
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def interleaved_steps(comm, steps: dict, *, warmup: int, count: int, block: int, inputs=None) -> dict:
    """Step times of several learners run in one job, interleaved in blocks of `block` steps.

    `steps` maps a name to the step to time. `inputs`, where given, maps a name to a function run
    before each of its steps outside the timed region, whose result is the step's argument. Each
    learner first runs `warmup` untimed steps; then the learners take turns until each has
    `count` timed steps. Returns {name: [seconds of the slowest rank, one per timed step]}.
    """
    times = {name: [] for name in steps}

    def run(name, k, record):
        for _ in range(k):
            step = functools.partial(steps[name], inputs[name]()) if inputs else steps[name]
            dt, _ = timed(comm, step)
            if record:
                times[name].append(slowest(comm, dt))

    for name in steps:
        run(name, warmup, False)
    first = next(iter(steps))
    while len(times[first]) < count:
        k = min(block, count - len(times[first]))
        for name in steps:
            run(name, k, True)
    return times


def report_step_times(title: str, times: dict, label: str) -> tuple:
    """Rank 0 calls it: the title, the median / min / max step time per learner, and the ratio of
    the first learner's median to the second's, named `label`. Returns (medians, ratio)."""
    med = {k: statistics.median(v) for k, v in times.items()}
    print(title)
    print("# learner            median ms      min ms      max ms")
    for k, v in times.items():
        print(f"  {k:16s} {1e3 * med[k]:11.3f} {1e3 * min(v):11.3f} {1e3 * max(v):11.3f}")
    ours, theirs = list(med)[:2]
    ratio = med[ours] / med[theirs]
    print(f"# step-time ratio {ours} / {label}: {ratio:.3f}  (target <= 1.0)")
    return med, ratio
