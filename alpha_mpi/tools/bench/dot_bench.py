"""`alpha-mpi bench dot`: alpha_mpi.arrays.dot against comm.Allreduce(np.dot(x_local, y_local)).

    mpiexec -n 2 python -m alpha_mpi.tools.bench dot [--lengths 1e2,1e3,...,1e7] [--iters 300]
        [--warmup 20] [--stat min|median] [--tiles 512x512,64x64x64 | --no-tiles]
        [--kernel-only | --no-kernel] [--json out.json]

Part 1, per call (every rank): for each local length L (global n = p * L, even blocks), in one
run and interleaved iteration by iteration (drift and other load hit both alike), each preceded
by a Barrier:
    alpha      arrays.dot(comm, x, y, offset, n): the pairwise tree over global indices (the
               same arguments every call: after the first, the one C call, arrays/fast.py)
    checked    arrays.dot(..., timeout=the default bound): the same call the ordinary way, every
               check in Python (a timeout= argument is never remembered): what `alpha` cost
               before the one call
    alpha k=2  arrays.dots(comm, [(x, y), (y, y)], ...): two inner products in one exchange
    MPI        send[0] = np.dot(x, y); comm.Allreduce (alpha_mpi.tools.bench.baseline), the reference
Per rank the statistic (--stat, min by default: robust on a shared machine) over iterations;
the table shows the maximum over ranks and ratio = alpha / MPI (< 1: faster). Bits: every result
must equal the first one, and up to --check elements the first equals the whole tree evaluated
on rank 0 over the gathered vector (a mismatch marks the row and the command exits 1).

Part 1b, N-d tiles: for each global shape (--tiles) and every process grid of p ranks in its
dimensions (2x1 and 1x2 of 512 x 512 at p = 2; 2x1x1, 1x2x1, 1x1x2 of 64^3), the row-major
(Create_cart) tile of each rank, held contiguous as a solver holds it, interleaved as above:
    alpha      arrays.dot(comm, x, y, offset, shape): the flattened array's pairwise tree
    MPI        np.dot(x.ravel(), y.ravel()) + comm.Allreduce, the reference
with the size of what the exchange carries: the largest tile summary (records of 3 words: lo,
hi, value) and the largest frame (bytes, header included). Bits: every result equal to the
first, which equals the whole tree over the global arrays (evaluated on rank 0).

Part 2, the local kernel (rank 0 alone, the others wait in a Barrier): alpha_mpi's pairwise
tree over L elements (the C call alone: summary of one block = the whole tree) against np.dot
(which runs the BLAS ddot named in the header), as throughput in GB/s of input read (16 B per
element), and against the memory bandwidth of a copy (np.copyto of 2 x L doubles: 32 B moved
per element) at the same length; interleaved call by call, taking turns, best of many.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from ... import arrays
from ...arrays import local, tiles
from ...execution.waits import timeout_from_env
from ...kernel import ffi, lib
from .._args import at_least, path
from .baseline import MpiAllreduce
from .dot_tiles import TILE_COLUMNS, tile_calls
from .harness import RankParser, check_outputs, machine_info, statistic, timed
from .results import write_json

DEFAULT_LENGTHS = [10**e for e in range(2, 8)]
DEFAULT_TILES = [(512, 512), (64, 64, 64)]


def _lengths(text: str) -> list:
    try:
        out = [int(float(v)) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"cannot read lengths {text!r} (example: 1e2,1e4,1e6)") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("lengths are element counts >= 1")
    return out


def _shapes(text: str) -> list:
    try:
        out = [tuple(int(v) for v in item.lower().split("x")) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"cannot read shapes {text!r} (example: 512x512,64x64x64)") from None
    if not out or any(not 2 <= len(s) <= tiles.MAX_NDIM or min(s) < 1 for s in out):
        raise argparse.ArgumentTypeError(f"shapes have 2 to {tiles.MAX_NDIM} dimensions >= 1: {text!r}")
    return out


def make_parser(rank: int) -> argparse.ArgumentParser:
    p = RankParser(
        rank,
        prog="alpha-mpi bench dot",
        description="Decomposition-independent dot products (alpha_mpi.arrays) vs MPI_Allreduce(np.dot).",
    )
    p.add_argument(
        "--lengths", type=_lengths, default=DEFAULT_LENGTHS, help="local lengths (default 1e2,...,1e7)"
    )
    p.add_argument(
        "--iters", type=at_least(1), default=300, help="timed iterations up to 1e4 elements (default 300)"
    )
    p.add_argument("--min-iters", type=at_least(1), default=10, help="timed iterations at least (default 10)")
    p.add_argument(
        "--warmup", type=at_least(0), default=20, help="untimed iterations per length (default 20)"
    )
    p.add_argument(
        "--stat", choices=("min", "median", "mean"), default="min", help="per-rank statistic (default min)"
    )
    p.add_argument(
        "--check",
        type=at_least(0),
        default=10**6,
        help="check bits against the whole tree up to this L (default 1e6)",
    )
    t = p.add_mutually_exclusive_group()
    t.add_argument(
        "--tiles",
        type=_shapes,
        default=DEFAULT_TILES,
        help="global shapes of the N-d tile rows, every process grid of p (default 512x512,64x64x64)",
    )
    t.add_argument("--no-tiles", action="store_true", help="leave out the N-d tile rows")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--kernel-only", action="store_true", help="only part 2 (the local kernel)")
    g.add_argument("--no-kernel", action="store_true", help="only part 1 (per call)")
    p.add_argument("--json", metavar="PATH", type=path, help="write the results as JSON (rank 0)")
    p.add_argument(
        "--targets",
        action="store_true",
        help="also print the project's development target (docs/performance.md) and whether this run met it",
    )
    return p


def blas_info() -> str:
    """Which BLAS np.dot runs (threadpoolctl: library, version, core type, threads)."""
    try:
        from threadpoolctl import threadpool_info

        for d in threadpool_info():
            if d.get("user_api") == "blas":
                return (
                    f"{d.get('internal_api')} {d.get('version')} kernel {d.get('architecture')} "
                    f"threads {d.get('num_threads')}"
                )
    except Exception:  # pragma: no cover - informational only
        pass
    return "unknown"


def _data(rank: int, length: int):
    rng = np.random.default_rng(1_000_003 * (rank + 1) + length)
    return rng.standard_normal(length), rng.standard_normal(length)


def _bits(v) -> int:
    return int(np.float64(v).view(np.uint64))


def _mpi_dots(comm, pairs):
    """MPI's way: each rank's np.dot of its pieces, then comm.Allreduce (baseline.py)."""
    ref = MpiAllreduce(comm, np.zeros(len(pairs)), np.zeros(len(pairs)))

    def run():
        for i, (a, b) in enumerate(pairs):
            ref.send[i] = np.dot(a, b)
        return ref.run()

    return run


def _calls(comm, pairs, lo: int, n: int) -> dict:
    """The five calls timed per iteration, in this order: one inner product by alpha_mpi (the
    one C call, then the ordinary path) and by MPI, then two in one exchange by alpha_mpi and by
    MPI."""
    (x, y), two = pairs[0], pairs
    bound = timeout_from_env(None)
    return {
        "t_alpha": lambda: arrays.dot(comm, x, y, lo, n),
        "t_checked": lambda: arrays.dot(comm, x, y, lo, n, timeout=bound),
        "t_mpi": _mpi_dots(comm, pairs[:1]),
        "t_alpha_k2": lambda: arrays.dots(comm, two, lo, n),
        "t_mpi_k2": _mpi_dots(comm, two),
    }


def per_call(comm, args) -> tuple:
    p, r = comm.Get_size(), comm.Get_rank()
    rows, failed = [], False
    for L in args.lengths:
        n, lo = p * L, r * L
        x, y = _data(r, L)
        pairs = [(x, y), (y, y)]
        calls = _calls(comm, pairs, lo, n)
        iters = max(args.min_iters, args.iters if L <= 10**4 else int(args.iters * 10**4 / L))
        times = {k: [] for k in calls}
        first = arrays.dot(comm, x, y, lo, n)
        first2 = arrays.dots(comm, pairs, lo, n)
        same = _bits(first2[0]) == _bits(first)
        for it in range(args.warmup + iters):
            got = {}
            for k, fn in calls.items():
                dt, got[k] = timed(comm, fn)
                if it >= args.warmup:
                    times[k].append(dt)
            same &= _bits(got["t_alpha"]) == _bits(first) and got["t_alpha_k2"] == first2
            same &= _bits(got["t_checked"]) == _bits(first)
        mine = np.array([statistic(times[k], args.stat) for k in calls] + [float(same)])
        everyone = np.zeros((p, mine.size)) if r == 0 else None
        comm.Gather(mine, everyone, root=0)  # harness bookkeeping (timings), not reduced data
        oracle_ok = None
        if L <= args.check and r == 0:  # rank 0 rebuilds the global vectors and evaluates the whole tree
            parts = [_data(q, L) for q in range(p)]
            gx, gy = np.concatenate([a for a, _ in parts]), np.concatenate([b for _, b in parts])
            oracle_ok = _bits(local.tree_value(gx, gy)) == _bits(first)
        if r == 0:
            worst = dict(zip(calls, everyone.max(axis=0)))
            ok = bool(everyone[:, -1].all()) and oracle_ok is not False
            failed |= not ok
            row = {"L": L, "n": n, "iters": iters, **worst}
            row.update(
                ratio=worst["t_alpha"] / worst["t_mpi"],
                ratio_checked=worst["t_checked"] / worst["t_mpi"],
                ratio_k2=worst["t_alpha_k2"] / worst["t_mpi_k2"],
            )
            row.update(bits="ok" if ok else "WRONG", tree_checked=oracle_ok is not None)
            rows.append(row)
    return rows, failed


#: Issue 33's target at p = 2: arrays.dot of 100 elements per rank at most 2.0x np.dot +
#: MPI_Allreduce (docs/performance.md).
TARGET_L, TARGET_RATIO = 100, 2.0


def targets(calls: list, p: int) -> list:
    """'#' lines: the issue-33 target where this run measured it (p = 2, L = 100)."""
    return [
        f"# target arrays.dot / (np.dot + MPI_Allreduce) L = {c['L']}: {c['ratio']:.2f} (<= {TARGET_RATIO:g}) "
        + ("met" if c["ratio"] <= TARGET_RATIO else "MISSED")
        for c in calls
        if c["L"] == TARGET_L and p == 2
    ]


def kernel(comm, args) -> list:
    rows = []
    if comm.Get_rank() == 0:
        for L in args.lengths:
            x, y = _data(0, L)
            dst = np.empty((2, L))
            src = np.stack([x, y])
            reps = max(4, min(2000, int(4e6 / L)))
            # the kernel call alone (local.tree_value's argument wrapping is left out of the loop)
            px, py, out = ffi.from_buffer("double[]", x), ffi.from_buffer("double[]", y), ffi.new("double *")
            node = lib.ap_node_value
            if node(px, py, 0, L, L, out) != 0 or out[0] != local.tree_value(x, y):
                raise RuntimeError("the kernel's whole-tree value differs from local.tree_value")
            # Interleaved call by call (load on a shared machine hits all three alike), best of many.
            # The copy evicts x and y from the caches, so the kernel and np.dot take turns at
            # running first after it (cold) and second (warm): neither is favoured.
            tk, tn, tc = [], [], []
            clock = time.perf_counter
            for i in range(reps * 6):
                t0 = clock()
                np.copyto(dst, src)
                t1 = clock()
                tc.append(t1 - t0)
                for first in (0, 1) if i % 2 == 0 else (1, 0):
                    t0 = clock()
                    if first == 0:
                        node(px, py, 0, L, L, out)
                    else:
                        np.dot(x, y)
                    (tk if first == 0 else tn).append(clock() - t0)
            k, d, c = min(tk), min(tn), min(tc)
            rows.append(
                dict(
                    L=L,
                    t_kernel=k,
                    t_npdot=d,
                    t_copy=c,
                    gbs_kernel=16 * L / k / 1e9,
                    gbs_npdot=16 * L / d / 1e9,
                    gbs_copy=32 * L / c / 1e9,
                    vs_npdot=d / k,
                    vs_copy=(16 * L / k) / (32 * L / c),
                )
            )
    comm.Barrier()
    return rows


#: The tables' columns: "HEADER" or "HEADER=KEY" of the row (KEY defaults to HEADER). A header
#: ending in _us shows seconds as microseconds; floats show two decimals.
CALL_COLUMNS = (
    "L n iters alpha_us=t_alpha checked_us=t_checked MPI_us=t_mpi ratio ratio_checked alpha_k2_us=t_alpha_k2 "
    "MPI_k2_us=t_mpi_k2 ratio_k2 bits"
)
KERNEL_COLUMNS = (
    "L kernel_us=t_kernel npdot_us=t_npdot kernel_GB/s=gbs_kernel npdot_GB/s=gbs_npdot copy_GB/s=gbs_copy "
    "kernel/npdot=vs_npdot kernel/copy=vs_copy"
)


def _cell(header: str, value) -> str:
    width = max(len(header) + 1, 10)
    if isinstance(value, str):
        return f"{value:>{width}s}"
    if isinstance(value, (int, np.integer)):
        return f"{value:>{width}d}"
    return f"{value * (1e6 if header.endswith('_us') else 1):>{width}.2f}"


def _table(rows, columns: str) -> None:
    """'#'-headed columns (OSU style)."""
    spec = [(c.split("=")[0], c.split("=")[-1]) for c in columns.split()]
    head = " ".join(f"{h:>{max(len(h) + 1, 10)}}" for h, _ in spec)
    print("#" + head[1:])
    for row in rows:
        print(" ".join(_cell(h, row[key]) for h, key in spec))


def cmd(comm, argv=None) -> int:
    rank = comm.Get_rank()
    args = make_parser(rank).parse_args(argv)
    check_outputs(comm, [("--json", args.json, True)])
    info = machine_info(comm)
    # One BLAS thread per rank in both columns: p ranks each running np.dot with every core's
    # threads oversubscribe the machine and time scheduling, not the dot (issue 21).
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        info["blas"] = blas_info()
        calls, failed = ([], False) if args.kernel_only else per_call(comm, args)
        tile_rows, tiles_failed = (
            ([], False) if args.kernel_only or args.no_tiles else tile_calls(comm, args, _mpi_dots)
        )
        failed |= tiles_failed
        kern = [] if args.no_kernel else kernel(comm, args)
    if rank == 0:
        where = f"p = {info['p']} on {info['cores']} cores ({info['cpu']})"
        print(f"# alpha-mpi bench dot: {where}, {info['mpi']}, numpy {info['numpy']} ({info['blas']})")
        print(f"# stat = {args.stat} per rank, max over ranks; ratio = alpha / MPI (< 1 faster)")
        if info["oversubscribed"]:
            print("# oversubscribed: more ranks than cores, latencies are scheduling-bound")
        if calls:
            _table(calls, CALL_COLUMNS)
            if not all(c["tree_checked"] for c in calls):
                print(f"# bits: the same on every iteration; the whole tree checked up to L = {args.check}")
            # the project's development goal, not a verdict on a user's machine (as bench allreduce)
            for line in targets(calls, info["p"]) if args.targets else ():
                print(line)
        if tile_rows:
            print("# N-d tiles: arrays.dot of each rank's tile vs np.dot + Allreduce; records: the largest")
            print("# tile summary (3 words each), frame: the largest message of the exchange")
            _table(tile_rows, TILE_COLUMNS)
        if kern:
            print(
                "# local kernel on rank 0: pairwise tree vs np.dot vs copy bandwidth (GB/s of data touched)"
            )
            _table(kern, KERNEL_COLUMNS)
        if args.json:
            write_json(
                args.json,
                {"machine": info, "stat": args.stat, "calls": calls, "tiles": tile_rows, "kernel": kern},
            )
        sys.stdout.flush()
    status = np.array([1 if failed else 0], dtype=np.int32)
    comm.Bcast(status, root=0)  # harness bookkeeping: the same exit status on every rank
    return int(status[0])
