"""`alpha-mpi bench dot`: alpha_mpi.arrays.dot against comm.Allreduce(np.dot(x_local, y_local)).

    mpiexec -n 2 python -m alpha_mpi.tools.bench dot [--lengths 1e2,1e3,...,1e7] [--iters 300]
        [--warmup 20] [--stat min|median] [--kernel-only | --no-kernel] [--json out.json]

Part 1, per call (every rank): for each local length L (global n = p * L, even blocks), in one
run and interleaved iteration by iteration (drift and other load hit both alike), each preceded
by a Barrier:
    alpha      arrays.dot(comm, x, y, offset, n): the pairwise tree over global indices
    alpha k=2  arrays.dots(comm, [(x, y), (y, y)], ...): two inner products in one exchange
    MPI        send[0] = np.dot(x, y); comm.Allreduce (alpha_mpi.tools.bench.baseline), the reference
Per rank the statistic (--stat, min by default: robust on a shared machine) over iterations;
the table shows the maximum over ranks and ratio = alpha / MPI (< 1: faster). Bits: every result
must equal the first one, and up to --check elements the first equals the whole tree evaluated
on rank 0 over the gathered vector (a mismatch marks the row and the command exits 1).

Part 2, the local kernel (rank 0 alone, the others wait in a Barrier): alpha_mpi's pairwise
tree over L elements (the C call alone: summary of one block = the whole tree) against np.dot
(which runs the BLAS ddot named in the header), as throughput in GB/s of input read (16 B per
element), and against the memory bandwidth of a copy (np.copyto of 2 x L doubles: 32 B moved
per element) at the same length; interleaved call by call, taking turns, best of many.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

DEFAULT_LENGTHS = [10**e for e in range(2, 8)]


class _Parser(argparse.ArgumentParser):
    """argparse that prints on rank 0 only; every rank exits with the same status."""

    def __init__(self, rank, **kw):
        self._rank = rank
        super().__init__(**kw)

    def _print_message(self, message, file=None):
        if self._rank == 0:
            super()._print_message(message, file)


def _lengths(text: str) -> list:
    try:
        out = [int(float(v)) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"cannot read lengths {text!r} (example: 1e2,1e4,1e6)") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("lengths are element counts >= 1")
    return out


def make_parser(rank: int) -> argparse.ArgumentParser:
    p = _Parser(
        rank,
        prog="alpha-mpi bench dot",
        description="Decomposition-independent dot products (alpha_mpi.arrays) vs MPI_Allreduce(np.dot).",
    )
    p.add_argument(
        "--lengths", type=_lengths, default=DEFAULT_LENGTHS, help="local lengths (default 1e2,...,1e7)"
    )
    p.add_argument("--iters", type=int, default=300, help="timed iterations up to 1e4 elements (default 300)")
    p.add_argument("--min-iters", type=int, default=10, help="timed iterations at least (default 10)")
    p.add_argument("--warmup", type=int, default=20, help="untimed iterations per length (default 20)")
    p.add_argument(
        "--stat", choices=("min", "median", "mean"), default="min", help="per-rank statistic (default min)"
    )
    p.add_argument(
        "--check",
        type=int,
        default=10**6,
        help="check bits against the whole tree up to this L (default 1e6)",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("--kernel-only", action="store_true", help="only part 2 (the local kernel)")
    g.add_argument("--no-kernel", action="store_true", help="only part 1 (per call)")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON (rank 0)")
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


def _stat(ts, how: str) -> float:
    return float({"min": np.min, "median": np.median, "mean": np.mean}[how](ts))


def _data(rank: int, length: int):
    rng = np.random.default_rng(1_000_003 * (rank + 1) + length)
    return rng.standard_normal(length), rng.standard_normal(length)


def per_call(comm, args) -> tuple:
    from ... import arrays
    from ...arrays import local
    from .baseline import MpiAllreduce

    p, r = comm.Get_size(), comm.Get_rank()
    rows, failed = [], False
    for L in args.lengths:
        n, lo = p * L, r * L
        x, y = _data(r, L)
        send, recv = np.zeros(1), np.zeros(1)
        send2, recv2 = np.zeros(2), np.zeros(2)
        ref, ref2 = MpiAllreduce(comm, send, recv), MpiAllreduce(comm, send2, recv2)
        iters = max(args.min_iters, args.iters if L <= 10**4 else int(args.iters * 10**4 / L))
        ta, tk, tm, tm2 = [], [], [], []
        first = arrays.dot(comm, x, y, lo, n)
        first2 = arrays.dots(comm, [(x, y), (y, y)], lo, n)
        same = np.float64(first2[0]).view(np.uint64) == np.float64(first).view(np.uint64)
        for it in range(args.warmup + iters):
            comm.Barrier()
            t0 = time.perf_counter()
            v = arrays.dot(comm, x, y, lo, n)
            t1 = time.perf_counter()
            comm.Barrier()
            t2 = time.perf_counter()
            send[0] = np.dot(x, y)
            ref.run()
            t3 = time.perf_counter()
            comm.Barrier()
            t4 = time.perf_counter()
            v2 = arrays.dots(comm, [(x, y), (y, y)], lo, n)
            t5 = time.perf_counter()
            comm.Barrier()
            t6 = time.perf_counter()
            send2[0] = np.dot(x, y)
            send2[1] = np.dot(y, y)
            ref2.run()
            t7 = time.perf_counter()
            same &= np.float64(v).view(np.uint64) == np.float64(first).view(np.uint64) and v2 == first2
            if it >= args.warmup:
                ta.append(t1 - t0), tm.append(t3 - t2), tk.append(t5 - t4), tm2.append(t7 - t6)
        mine = np.array(
            [
                _stat(ta, args.stat),
                _stat(tm, args.stat),
                _stat(tk, args.stat),
                _stat(tm2, args.stat),
                float(same),
            ]
        )
        everyone = np.zeros((p, mine.size)) if r == 0 else None
        comm.Gather(mine, everyone, root=0)  # harness bookkeeping (timings), not reduced data
        oracle_ok = None
        if L <= args.check:  # rank 0 rebuilds the global vectors and evaluates the whole tree
            if r == 0:
                parts = [_data(q, L) for q in range(p)]
                gx, gy = np.concatenate([a for a, _ in parts]), np.concatenate([b for _, b in parts])
                oracle_ok = np.float64(local.tree_value(gx, gy)).view(np.uint64) == np.float64(first).view(
                    np.uint64
                )
        if r == 0:
            worst = everyone.max(axis=0)
            ok = bool(everyone[:, 4].all()) and oracle_ok is not False
            failed |= not ok
            rows.append(
                dict(
                    L=L,
                    n=n,
                    iters=iters,
                    t_alpha=worst[0],
                    t_mpi=worst[1],
                    t_alpha_k2=worst[2],
                    t_mpi_k2=worst[3],
                    ratio=worst[0] / worst[1],
                    ratio_k2=worst[2] / worst[3],
                    bits="ok" if ok else "WRONG",
                    tree_checked=oracle_ok is not None,
                )
            )
    return rows, failed


def kernel(comm, args) -> list:
    from ...arrays import local
    from ...kernel import ffi, lib

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


CALL_COLUMNS = [  # (header, key, width, format, scale)
    ("L", "L", 10, "d", 1),
    ("n", "n", 10, "d", 1),
    ("iters", "iters", 6, "d", 1),
    ("alpha_us", "t_alpha", 10, ".2f", 1e6),
    ("MPI_us", "t_mpi", 10, ".2f", 1e6),
    ("ratio", "ratio", 6, ".2f", 1),
    ("alpha_k2_us", "t_alpha_k2", 12, ".2f", 1e6),
    ("MPI_k2_us", "t_mpi_k2", 10, ".2f", 1e6),
    ("ratio_k2", "ratio_k2", 9, ".2f", 1),
    ("bits", "bits", 6, "s", None),
]
KERNEL_COLUMNS = [
    ("L", "L", 10, "d", 1),
    ("kernel_us", "t_kernel", 10, ".2f", 1e6),
    ("npdot_us", "t_npdot", 10, ".2f", 1e6),
    ("kernel_GB/s", "gbs_kernel", 12, ".2f", 1),
    ("npdot_GB/s", "gbs_npdot", 11, ".2f", 1),
    ("copy_GB/s", "gbs_copy", 10, ".2f", 1),
    ("kernel/npdot", "vs_npdot", 13, ".2f", 1),
    ("kernel/copy", "vs_copy", 12, ".2f", 1),
]


def _table(rows, columns) -> None:
    """'#'-headed columns (OSU style)."""
    head = " ".join(f"{h:>{w}}" for h, _, w, _, _ in columns)
    print("#" + head[1:])
    for row in rows:
        cells = []
        for _, key, w, fmt, scale in columns:
            v = row[key] if scale is None else (row[key] * scale if scale != 1 else row[key])
            cells.append(f"{v:>{w}{fmt}}")
        print(" ".join(cells))


def cmd(comm, argv=None) -> int:
    rank = comm.Get_rank()
    args = make_parser(rank).parse_args(argv)
    from .allreduce_bench import machine_info

    info = machine_info(comm)
    info["blas"] = blas_info()
    calls, failed = ([], False) if args.kernel_only else per_call(comm, args)
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
        if kern:
            print(
                "# local kernel on rank 0: pairwise tree vs np.dot vs copy bandwidth (GB/s of data touched)"
            )
            _table(kern, KERNEL_COLUMNS)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"machine": info, "stat": args.stat, "calls": calls, "kernel": kern}, f, indent=1)
        sys.stdout.flush()
    status = np.array([1 if failed else 0], dtype=np.int32)
    comm.Bcast(status, root=0)  # harness bookkeeping: the same exit status on every rank
    return int(status[0])
