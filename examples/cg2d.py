"""Conjugate gradients on the 2-D Poisson problem, cut into tiles by a Cartesian communicator.

    mpiexec -n P python examples/cg2d.py [--grid 37x53] [--dims 2x2] [--tol 1e-10]
                                         [--max-iters 2000] [--reduce both|alpha|mpi]

The NY x NX grid (5-point Laplacian, zero Dirichlet boundary, n = NY * NX unknowns) is cut by
`Create_cart` into a process grid (--dims, default MPI.Compute_dims): rank (cy, cx) owns the tile
of rows [y0, y1) and columns [x0, x1), stored with one ghost cell on every side, and exchanges
its edges with its four neighbours (point-to-point: cart.Shift and Sendrecv) before each
matrix-vector product. Everything a rank computes is element by element, so it does not depend
on the tiling -- except the inner products. The solver runs twice:

    alpha  arrays.dot(cart, p_tile, q_tile, (y0, x0), (NY, NX)): the pairwise tree over the
           flattened global grid; p_tile is the interior view of the ghosted array (no copy)
    mpi    cart.Allreduce(np.dot(p_tile, q_tile)): the usual way

and prints the sha256 digest of the residual history of each. The alpha digest is the same for
every tiling on any number of ranks (1x1, 2x1, 1x2, 2x2, 3x1, 1x3, ...); the mpi digest changes
with the tiling, because the partial sums are cut where the tiles are.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys

import numpy as np
from mpi4py import MPI

from alpha_mpi import arrays


def pair(text: str) -> tuple:
    """'37x53' -> (37, 53)."""
    try:
        a, b = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected AxB (like 37x53), got {text!r}") from None
    if a < 1 or b < 1:
        raise argparse.ArgumentTypeError(f"{text}: both must be at least 1")
    return a, b


class Poisson2D:
    """This rank's tile of the NY x NX grid on a Cartesian communicator; y = A x with A the
    5-point Laplacian, ghost cells filled from the four neighbours."""

    def __init__(self, comm, shape: tuple, dims: tuple):
        self.shape = shape
        self.cart = comm.Create_cart(list(dims), periods=[False, False], reorder=False)
        cy, cx = self.cart.Get_coords(self.cart.Get_rank())
        # the tile's bounds in each dimension; its global start is the `offset` of arrays.dot
        self.y0, self.y1 = shape[0] * cy // dims[0], shape[0] * (cy + 1) // dims[0]
        self.x0, self.x1 = shape[1] * cx // dims[1], shape[1] * (cx + 1) // dims[1]
        self.offset = (self.y0, self.x0)
        self.tile = (self.y1 - self.y0, self.x1 - self.x0)
        self.up, self.down = self.cart.Shift(0, 1)
        self.left, self.right = self.cart.Shift(1, 1)
        ny, nx = self.tile
        self.send, self.recv = np.empty(max(ny, 1)), np.empty(max(ny, 1))

    def ghosted(self) -> tuple:
        """A zeroed array with one ghost cell on every side and its interior (the tile) view."""
        a = np.zeros((self.tile[0] + 2, self.tile[1] + 2))
        return a, a[1:-1, 1:-1]

    def exchange(self, P: np.ndarray) -> None:
        """Fill P's ghost cells from the neighbours (zero where there is none: the boundary)."""
        c, ny = self.cart, self.tile[0]
        c.Sendrecv(P[1, 1:-1], dest=self.up, recvbuf=P[-1, 1:-1], source=self.down)
        c.Sendrecv(P[-2, 1:-1], dest=self.down, recvbuf=P[0, 1:-1], source=self.up)
        s, r = self.send[:ny], self.recv[:ny]  # columns are strided: one copy each way
        s[:] = P[1:-1, 1]
        r[:] = 0.0
        c.Sendrecv(s, dest=self.left, recvbuf=r, source=self.right)
        P[1:-1, -1] = r
        s[:] = P[1:-1, -2]
        r[:] = 0.0
        c.Sendrecv(s, dest=self.right, recvbuf=r, source=self.left)
        P[1:-1, 0] = r

    def apply(self, P: np.ndarray, out: np.ndarray) -> None:
        """out = A p, p the interior of P (its ghost cells are filled here)."""
        self.exchange(P)
        np.multiply(P[1:-1, 1:-1], 4.0, out=out)  # one fixed order per element: 4x - N - S - W - E
        out -= P[:-2, 1:-1]
        out -= P[2:, 1:-1]
        out -= P[1:-1, :-2]
        out -= P[1:-1, 2:]

    def rhs(self) -> np.ndarray:
        y, x = np.meshgrid(np.arange(self.y0, self.y1), np.arange(self.x0, self.x1), indexing="ij")
        i = (y * self.shape[1] + x).astype(np.int64)  # the global (C-order) index
        return ((i * 7919) % 1009).astype(np.float64) / 1009.0 - 0.5


def alpha_dot(op: Poisson2D):
    cart, offset, shape = op.cart, op.offset, op.shape
    return lambda a, b: arrays.dot(cart, a, b, offset, shape)


def mpi_dot(op: Poisson2D):
    cart, send, recv = op.cart, np.zeros(1), np.zeros(1)

    def dot(a, b):
        send[0] = np.dot(a.ravel(), b.ravel())
        cart.Allreduce(send, recv, op=MPI.SUM)
        return float(recv[0])

    return dot


def cg(op: Poisson2D, dot, tol: float, max_iters: int):
    """Plain CG from x = 0; returns the residual norms. p lives in a ghosted array."""
    b = op.rhs()
    x = np.zeros_like(b)
    r = b.copy()
    P, p = op.ghosted()
    p[...] = r
    Ap = np.empty_like(b)
    rr = dot(r, r)
    history = [math.sqrt(rr)]
    stop = tol * history[0]
    for _ in range(max_iters):
        op.apply(P, Ap)
        alpha = rr / dot(p, Ap)  # p: the interior view of P, read in place
        x += alpha * p
        r -= alpha * Ap
        rr_new = dot(r, r)
        history.append(math.sqrt(rr_new))
        if history[-1] <= stop:
            break
        p *= rr_new / rr
        p += r
        rr = rr_new
    return history


def digest(history) -> str:
    return hashlib.sha256(np.asarray(history, dtype=np.float64).tobytes()).hexdigest()[:16]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", type=pair, default=(37, 53), help="NYxNX (default 37x53)")
    ap.add_argument("--dims", type=pair, help="process grid PYxPX (default: MPI.Compute_dims)")
    ap.add_argument("--tol", type=float, default=1e-10, help="relative residual to stop at (default 1e-10)")
    ap.add_argument("--max-iters", type=int, default=2000)
    ap.add_argument("--reduce", choices=("both", "alpha", "mpi"), default="both")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    dims = args.dims or tuple(MPI.Compute_dims(comm.size, 2))
    if dims[0] * dims[1] != comm.size:
        if comm.rank == 0:
            print(
                f"--dims {dims[0]}x{dims[1]} needs {dims[0] * dims[1]} ranks, not {comm.size}",
                file=sys.stderr,
            )
        return 2
    op = Poisson2D(comm, args.grid, dims)
    tiles = comm.gather((op.offset, op.tile), root=0)  # for the header line
    if comm.rank == 0:
        print(f"# CG, 2-D Poisson {args.grid[0]} x {args.grid[1]}, p = {comm.size}, dims {dims[0]}x{dims[1]}")
        print("# tiles (offset, shape): " + " ".join(f"{o}{s}" for o, s in tiles))
    variants = {"alpha": alpha_dot(op), "mpi": mpi_dot(op)}
    for name in ["alpha", "mpi"] if args.reduce == "both" else [args.reduce]:
        hist = cg(op, variants[name], args.tol, args.max_iters)
        if comm.rank == 0:
            print(f"reduce={name} iterations={len(hist) - 1} residual={hist[-1]:.6e} digest={digest(hist)}")
    sys.stdout.flush()
    arrays.reset(op.cart)  # alpha_mpi.arrays' channel on the communicator, then the communicator
    op.cart.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
