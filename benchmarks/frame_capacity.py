"""What the arrays' frame capacity costs a dot: frames kept at the bound of any table (132
records) against frames that follow what the rows ask for (alpha_mpi.arrays.tiles.Capacity),
in one launch, so that the machine's moods between launches cancel.

    mpiexec -n 2 python benchmarks/frame_capacity.py [elements per rank] [rounds] [calls]

Two duplicates of COMM_WORLD: on one the channel's capacities never shrink, on the other they
follow the rows (the default). For a 1-D block and for a 2-D tile (the rank's rows of a
(p * m, m) array, m = sqrt(elements)), each call with a new array as solvers make them, a barrier
before each call and 1 MB written between calls (the program's own work evicts the engine's
state): the median of `rounds` (15) medians of `calls` (200) calls, the two communicators alternating
round by round; prints both, their difference and each one's capacity at the end. Checks its
own results: both communicators give the same bits for the same data every round, and the
frames that follow the rows end smaller (exit 1 otherwise; tests/test_frame_capacity_bench.py).
"""

import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

from alpha_mpi import arrays
from alpha_mpi.arrays import tiles
from alpha_mpi.arrays.api import _channel

W = MPI.COMM_WORLD


class Fixed(tiles.Capacity):
    """A capacity that never shrinks (the frames before they followed the rows)."""

    SHRINK_AFTER = 1 << 62


def main(argv) -> int:
    per_rank = int(argv[0]) if argv else 4096
    rounds = int(argv[1]) if len(argv) > 1 else 15
    calls = int(argv[2]) if len(argv) > 2 else 200
    p, r = W.Get_size(), W.Get_rank()
    fixed, follows = W.Dup(), W.Dup()
    arrays.sum(fixed, np.ones(1), r, p)  # makes the channel, whose capacities are then replaced
    ch = _channel(fixed)
    ch.capacity, ch.block_capacity = Fixed(), Fixed()
    side = int(per_rank**0.5)
    x = np.random.default_rng(r).random(per_rank)
    t = np.random.default_rng(r).random((side, side))
    trash = np.zeros(1 << 17)
    programs = {
        "1-D block": lambda c: arrays.dot(c, x.copy(), x, r * per_rank, p * per_rank),
        "2-D tile": lambda c: arrays.dot(c, t.copy(), t, (r * side, 0), (p * side, side)),
    }

    def timed(call, comm, n):
        ts = []
        for _ in range(n):
            trash[:] += 1.0
            W.Barrier()
            t0 = time.perf_counter()
            got = call(comm)
            ts.append(time.perf_counter() - t0)
        bits[comm is fixed] = np.float64(got).view(np.uint64)
        return statistics.median(ts)

    bits = {}
    ok = True

    for name, call in programs.items():
        for comm in (fixed, follows):
            timed(call, comm, 100)  # the first calls: the exchanges built, the frames shrunk
        a, b = [], []
        for _ in range(rounds):
            a.append(timed(call, fixed, calls))
            b.append(timed(call, follows, calls))
            ok = ok and bits[True] == bits[False]
        ma, mb = statistics.median(a), statistics.median(b)
        cap = "block_capacity" if name.startswith("1-D") else "capacity"
        caps = [getattr(_channel(c), cap).current for c in (fixed, follows)]
        ok = ok and caps[1] < caps[0]
        if r == 0:
            print(
                f"p={p} {name} of {per_rank}: frames of {caps[0]} records {ma * 1e6:.2f} us, "
                f"of {caps[1]} records {mb * 1e6:.2f} us, difference {(mb - ma) * 1e6:+.2f} us"
            )
    for c in (fixed, follows):
        arrays.reset(c)
        c.Free()
    ok = W.allreduce(int(ok), op=MPI.MIN)  # the benchmark's own bookkeeping, after the timing
    if not ok and r == 0:
        print("!! the two communicators gave other bits, or the frames did not shrink")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
