"""Conjugate gradients on the 2-D Poisson problem with an uneven row decomposition.

    mpiexec -n P python examples/cg.py [--grid 64] [--tol 1e-10] [--max-iters 2000]
                                       [--reduce both|alpha|mpi] [--time]

The N x N grid (5-point Laplacian, zero Dirichlet boundary, n = N^2 unknowns) is cut into
contiguous blocks of grid rows of uneven sizes (as a partitioner would hand them out); each rank
exchanges one halo row with each neighbour for the matrix-vector product. Everything a rank
computes is element by element, so it does not depend on where the cuts are -- except the
inner products. The solver runs twice:

    alpha  inner products by alpha_mpi.arrays.dot: the pairwise tree over global indices
    mpi    comm.Allreduce(np.dot(x_local, y_local)): the usual way

and prints the sha256 digest of the residual history of each. The alpha digest is the same on
1, 2, 3, 4, 5 ... ranks; the mpi digest changes with the rank count, because the partial sums
are cut where the blocks are. --time times both solves (fixed iteration count, same work) and
prints the ratio alpha / mpi (the two take turns, best of --repeat each).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
import time

import numpy as np
from mpi4py import MPI

from alpha_mpi import arrays


def uneven_rows(N: int, p: int) -> list:
    """Cut points 0 = c0 < c1 < ... < cp = N: rank q gets a share proportional to (q % 3) + 1,
    at least one row each."""
    w = [(q % 3) + 1 for q in range(p)]
    cuts = [0]
    for q in range(p):
        cuts.append(cuts[-1] + max(1, round(N * w[q] / sum(w))))
    cuts[-1] = N
    for q in range(p - 1, 0, -1):  # keep every block non-empty after the last adjustment
        cuts[q] = min(cuts[q], cuts[q + 1] - 1)
    return cuts


class Poisson:
    """This rank's rows [r0, r1) of the N x N grid; y = A x with A the 5-point Laplacian."""

    def __init__(self, comm, N: int):
        self.comm, self.N = comm, N
        p, r = comm.Get_size(), comm.Get_rank()
        if N < p:
            raise SystemExit(f"--grid {N} is smaller than the rank count {p}")
        cuts = uneven_rows(N, p)
        self.r0, self.r1 = cuts[r], cuts[r + 1]
        self.rows = self.r1 - self.r0
        self.offset, self.length, self.n = self.r0 * N, self.rows * N, N * N
        self.up = r - 1 if r > 0 else MPI.PROC_NULL
        self.down = r + 1 if r < p - 1 else MPI.PROC_NULL
        self.pad = np.zeros((self.rows + 2, N + 2))

    def apply(self, x: np.ndarray, out: np.ndarray) -> np.ndarray:
        N, P = self.N, self.pad
        P[1:-1, 1:-1] = x.reshape(self.rows, N)
        # halo rows from the neighbours (the user's own point-to-point exchange)
        self.comm.Sendrecv(P[1, 1:-1], dest=self.up, recvbuf=P[-1, 1:-1], source=self.down)
        self.comm.Sendrecv(P[-2, 1:-1], dest=self.down, recvbuf=P[0, 1:-1], source=self.up)
        if self.up == MPI.PROC_NULL:
            P[0, 1:-1] = 0.0
        if self.down == MPI.PROC_NULL:
            P[-1, 1:-1] = 0.0
        o = out.reshape(self.rows, N)
        np.multiply(P[1:-1, 1:-1], 4.0, out=o)  # one fixed order per element: 4x - N - S - W - E
        o -= P[:-2, 1:-1]
        o -= P[2:, 1:-1]
        o -= P[1:-1, :-2]
        o -= P[1:-1, 2:]
        return out

    def rhs(self) -> np.ndarray:
        i = np.arange(self.offset, self.offset + self.length, dtype=np.int64)
        return ((i * 7919) % 1009).astype(np.float64) / 1009.0 - 0.5


def alpha_dot(op: Poisson):
    comm, off, n = op.comm, op.offset, op.n
    return lambda a, b: arrays.dot(comm, a, b, off, n)


def mpi_dot(op: Poisson):
    comm, send, recv = op.comm, np.zeros(1), np.zeros(1)

    def dot(a, b):
        send[0] = np.dot(a, b)
        comm.Allreduce(send, recv, op=MPI.SUM)
        return float(recv[0])

    return dot


def cg(op: Poisson, dot, tol: float, max_iters: int, fixed: bool = False):
    """Plain CG from x = 0; returns (x, residual norms). `fixed`: run max_iters, no stopping."""
    b = op.rhs()
    x = np.zeros_like(b)
    r = b.copy()
    p = r.copy()
    Ap = np.empty_like(b)
    rr = dot(r, r)
    history = [math.sqrt(rr)]
    stop = tol * history[0]
    for _ in range(max_iters):
        op.apply(p, Ap)
        alpha = rr / dot(p, Ap)
        x += alpha * p
        r -= alpha * Ap
        rr_new = dot(r, r)
        history.append(math.sqrt(rr_new))
        if not fixed and history[-1] <= stop:
            break
        p *= rr_new / rr
        p += r
        rr = rr_new
    return x, history


def digest(history) -> str:
    return hashlib.sha256(np.asarray(history, dtype=np.float64).tobytes()).hexdigest()[:16]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", type=int, default=64, help="N: the grid is N x N (default 64)")
    ap.add_argument("--tol", type=float, default=1e-10, help="relative residual to stop at (default 1e-10)")
    ap.add_argument("--max-iters", type=int, default=2000)
    ap.add_argument("--reduce", choices=("both", "alpha", "mpi"), default="both")
    ap.add_argument(
        "--time", action="store_true", help="time both solves over --max-iters iterations (no stopping)"
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="timed solves per variant with --time, the variants taking turns (default 3, best kept)",
    )
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    op = Poisson(comm, args.grid)
    rows = np.zeros(comm.size, dtype=np.int64)
    comm.Gather(np.array([op.rows], dtype=np.int64), rows, root=0)  # for the header line
    variants = {"alpha": alpha_dot(op), "mpi": mpi_dot(op)}
    chosen = ["alpha", "mpi"] if args.reduce == "both" else [args.reduce]
    if comm.rank == 0:
        print(f"# CG, 2-D Poisson {args.grid} x {args.grid} (n = {op.n}), p = {comm.size}, ", end="")
        print(f"grid rows per rank {rows.tolist()}")
    best, hists = {}, {}
    # --time: the variants take turns, repeat by repeat (load that comes and goes on a shared
    # machine hits both alike), best of --repeat each
    for _ in range(args.repeat if args.time else 1):
        for name in chosen:
            if args.time:
                comm.Barrier()
                t0 = time.perf_counter()
                _, hists[name] = cg(op, variants[name], args.tol, args.max_iters, fixed=True)
                comm.Barrier()
                best[name] = min(best.get(name, math.inf), time.perf_counter() - t0)
            else:
                _, hists[name] = cg(op, variants[name], args.tol, args.max_iters)
    for name in chosen:
        hist = hists[name]
        if comm.rank == 0:
            extra = f" time={best[name]:.4f}s" if args.time else ""
            line = f"reduce={name} iterations={len(hist) - 1} residual={hist[-1]:.6e} digest={digest(hist)}"
            print(line + extra)
    if args.time and len(best) == 2 and comm.rank == 0:
        print(
            f"# time alpha / mpi = {best['alpha'] / best['mpi']:.3f} over {args.max_iters} iterations "
            f"(best of {args.repeat})"
        )
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
