"""A/B of the two receive modes in one MPI job (issue 45 item 1): for each size, two Allreducers
over the same tree, one built with ALPHA_MPI_RECEIVES=posted (the old way on an executor's own
tag block) and one matched (the default), run in alternating blocks of iterations, so that a
loaded machine slows both alike. Prints per size the median and the minimum of the per-iteration
time (rank 0, microseconds) of each, and matched/posted. Bits are checked equal every block.

    mpiexec -n 2 python benchmarks/receives_ab.py [SIZES_BYTES...]
"""

import os
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

from alpha_mpi import pairwise
from alpha_mpi.execution import Allreducer

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
sizes = [int(s) for s in sys.argv[1:]] or [8, 1024, 8192, 65536, 1 << 20, 4 << 20]
BLOCKS = int(os.environ.get("AB_BLOCKS", "10"))
if rank == 0:
    print(f"# {size} ranks, {BLOCKS} alternating blocks per mode; per-iteration us at rank 0")
    print(
        f"{'bytes':>9} {'posted med':>10} {'matched med':>11} {'ratio':>6} {'posted min':>10} {'matched min':>11} {'ratio':>6}"
    )
for nbytes in sizes:
    n = max(1, nbytes // 8)
    tree = pairwise(range(size), size)
    made = {}
    for mode in ("posted", "matched"):
        os.environ["ALPHA_MPI_RECEIVES"] = "posted" if mode == "posted" else ""
        made[mode] = Allreducer(comm, tree, n)
    os.environ.pop("ALPHA_MPI_RECEIVES", None)
    x = {rank: np.random.default_rng(rank).standard_normal(n)}
    out = {m: np.empty(n) for m in made}
    iters = max(5, min(200, (64 << 20) // max(nbytes, 1) // 16))
    times = {m: [] for m in made}
    for b in range(BLOCKS + 1):  # block 0: warm-up
        for mode, a in made.items():
            comm.Barrier()
            for _ in range(iters):
                t0 = time.perf_counter()
                a(x, out=out[mode])
                if b:
                    times[mode].append(time.perf_counter() - t0)
        assert np.array_equal(out["posted"].view(np.uint64), out["matched"].view(np.uint64))
    assert made["posted"].executor.probe is False and made["matched"].executor.probe is True
    if rank == 0:
        med = {m: statistics.median(t) * 1e6 for m, t in times.items()}
        low = {m: min(t) * 1e6 for m, t in times.items()}
        print(
            f"{nbytes:>9} {med['posted']:>10.1f} {med['matched']:>11.1f} {med['matched'] / med['posted']:>6.3f}"
            f" {low['posted']:>10.1f} {low['matched']:>11.1f} {low['matched'] / low['posted']:>6.3f}",
            flush=True,
        )
    for a in made.values():
        a.free()
