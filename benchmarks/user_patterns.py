"""Programs written the way users write them, against the same program on MPI_Allreduce (issue 42).

    mpiexec -n 2 python benchmarks/user_patterns.py [--quick] [--reps 5] [--calls 2000] [--only NAME]
                                                    [--json PATH]

Each program runs twice per repetition, in turn (the order alternates), after a Barrier: with
alpha_mpi's reductions, and with the baseline `comm.Allreduce` of `np.dot` into a preallocated
1-element buffer. New arrays every iteration, as numpy code makes them (`q = A(p)`,
`p = r + beta * p`); nothing bent to a fast path. Prints on rank 0 one table: the median time of
each (the slower rank's), the median ratio with its spread (min-max over repetitions) and the
target; `--json` writes the same rows.

    cg1d    1-D CG on the 3-point Laplacian, a block of 4,096 / 65,536 unknowns per rank,
            neighbours' values by Sendrecv; arrays.dot(comm, x, y, offset, n)   <= 1.15x / 1.05x
    cg3d    3-D CG on the 7-point Laplacian, Create_cart tiles of 16^3 / 40^3 per rank with
            ghost cells; arrays.dot(cart, p, q, offset, shape)                  <= 1.15x / 1.05x
    tile    one dot of a 128 x 128 2-D tile (its (offset, shape) as tuples) against the same
            data as a 1-D block (the baseline here)                              <= 1.10x
    mixed   one loop calling in turn MPI_Allreduce, two Allreducers of the same tree and
            allreduce() in each documented form, 8 B, new arrays: each Allreducer against its
            twin (one third Allreducer in both their places, the loop otherwise the same:
            what alternating two executors costs) (<= 1.10x), each allreduce() form against
            the Allreducer (<= 1.15x); the twin in a loop of its own, for reference
    newton  a Newton-Krylov mini-app on 2-D Create_cart tiles (-lap u + u^3 = f; CG on each
            Newton step's Jacobian, thousands of dots), end to end             <= 1.05x

Checks, every run (exit 1 when one fails): each program's alpha digest (sha256 of its residual
history) is the same in every repetition; the tile dot has the bits of the 1-D block; every
allreduce() form has the Allreducer's bits. `--quick` runs small fixed GLOBAL problems (the
same for every rank count, so the alpha digests must not depend on it: tests/test_user_patterns.py
compares 1 and 2 ranks) and 3 repetitions; its times mean nothing.

One BLAS thread per rank unless the environment says otherwise (OMP_NUM_THREADS,
OPENBLAS_NUM_THREADS, MKL_NUM_THREADS; printed in the header): with two ranks on two cores, a
BLAS that starts a second thread for np.dot of 65,536 elements makes the baseline 10-50x slower
in some runs and not in others, which measures the oversubscription, not the reductions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import sys
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before numpy loads its BLAS (see the docstring)

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import alpha_mpi  # noqa: E402
from alpha_mpi import arrays, pairwise  # noqa: E402
from alpha_mpi.execution import Allreducer  # noqa: E402

WORLD = MPI.COMM_WORLD


class Dots:
    """dot(x, y) of this rank's blocks: alpha_mpi's, or np.dot + comm.Allreduce (the baseline)."""

    def __init__(self, comm, alpha: bool, offset, shape):
        self.comm, self.alpha, self.offset, self.shape = comm, alpha, offset, shape
        self.send, self.recv = np.zeros(1), np.zeros(1)

    def __call__(self, x, y) -> float:
        if self.alpha:
            return arrays.dot(self.comm, x, y, self.offset, self.shape)
        self.send[0] = np.dot(x.ravel(), y.ravel())  # (tiles: np.dot of the flattened arrays)
        self.comm.Allreduce(self.send, self.recv)
        return float(self.recv[0])


def _digest(history) -> str:
    return hashlib.sha256(np.asarray(history, dtype=np.float64).tobytes()).hexdigest()


def cg1d(alpha: bool, size: int, iters: int, quick: bool) -> str:
    """1-D Poisson, numpy style: new arrays every iteration."""
    p, r = WORLD.Get_size(), WORLD.Get_rank()
    n = size if quick else size * p  # quick: a fixed global problem
    lo, hi = n * r // p, n * (r + 1) // p
    left = r - 1 if r > 0 else MPI.PROC_NULL
    right = r + 1 if r < p - 1 else MPI.PROC_NULL
    gl, gr = np.zeros(1), np.zeros(1)
    dot = Dots(WORLD, alpha, lo, n)

    def A(v):
        """2 v_i - v_(i-1) - v_(i+1), the same operations at every index (block edges too)."""
        gl[0] = gr[0] = 0.0
        WORLD.Sendrecv(v[-1:], dest=right, recvbuf=gl, source=left)
        WORLD.Sendrecv(v[:1], dest=left, recvbuf=gr, source=right)
        w = np.concatenate((gl, v, gr))
        return 2.0 * w[1:-1] - w[:-2] - w[2:]

    i = np.arange(lo, hi, dtype=np.float64)
    b = np.sin(0.37 * i) + 0.01 * np.cos(3.1 * i)
    x = np.zeros(hi - lo)
    r_ = b.copy()
    p_ = r_.copy()
    rr = dot(r_, r_)
    history = [rr]
    for _ in range(iters):
        q = A(p_)
        a = rr / dot(p_, q)
        x = x + a * p_
        r_ = r_ - a * q
        rr_new = dot(r_, r_)
        p_ = r_ + (rr_new / rr) * p_
        rr = rr_new
        history.append(rr)
    return _digest(history)


_CARTS: dict = {}


def _cart(ndim: int):
    """The Cartesian communicator of `ndim` dimensions, made once (as a program makes it once)."""
    if ndim not in _CARTS:
        dims = MPI.Compute_dims(WORLD.Get_size(), ndim)
        _CARTS[ndim] = WORLD.Create_cart(dims, periods=[False] * ndim, reorder=False), dims
    return _CARTS[ndim]


def _bounds(cart, dims, shape):
    coords = cart.Get_coords(cart.Get_rank())
    lo = tuple(shape[d] * coords[d] // dims[d] for d in range(len(dims)))
    hi = tuple(shape[d] * (coords[d] + 1) // dims[d] for d in range(len(dims)))
    return lo, hi


class Halo:
    """Ghost cells of a tile on a Cartesian communicator, filled from the neighbours by
    Sendrecv of each face (copied to a contiguous buffer, as users do)."""

    def __init__(self, cart, tile):
        self.cart, self.tile, self.nd = cart, tile, len(tile)
        self.work = np.zeros(tuple(t + 2 for t in tile))
        self.inner = self.work[(slice(1, -1),) * self.nd]

    def fill(self, v):
        """The ghosted array holding v (its ghost cells from the neighbours, 0 at the boundary)."""
        w, nd = self.work, self.nd
        self.inner[...] = v
        for d in range(nd):
            lower, upper = self.cart.Shift(d, 1)
            for src_i, dst_i, dest, source in ((-2, 0, upper, lower), (1, -1, lower, upper)):
                face = [slice(1, -1)] * nd
                face[d] = src_i
                ghost = list(face)
                ghost[d] = dst_i
                send = np.ascontiguousarray(w[tuple(face)])
                recv = np.zeros_like(send)
                self.cart.Sendrecv(send, dest=dest, recvbuf=recv, source=source)
                w[tuple(ghost)] = recv
        return w


def _laplacian(w, nd: int):
    """(2 nd) u - the sum of the 2 nd neighbours, over the interior of ghosted w: a new array."""
    inner = (slice(1, -1),) * nd
    q = (2.0 * nd) * w[inner]
    for d in range(nd):
        for s in (slice(None, -2), slice(2, None)):
            idx = list(inner)
            idx[d] = s
            q -= w[tuple(idx)]
    return q


def _field(lo, hi, salt: float):
    """A smooth right-hand side over the tile [lo, hi), from global coordinates only."""
    grids = np.meshgrid(*[np.arange(a, b, dtype=np.float64) for a, b in zip(lo, hi)], indexing="ij")
    f = np.ones(tuple(b - a for a, b in zip(lo, hi)))
    for k, g in enumerate(grids):
        f = f + np.sin((0.21 + 0.07 * k + salt) * g)
    return f


def cg3d(alpha: bool, size: int, iters: int, quick: bool) -> str:
    """3-D Poisson on Create_cart tiles; the dots over the tiles with (offset, shape) tuples."""
    cart, dims = _cart(3)
    shape = (size, size, size + 3) if quick else tuple(size * d for d in dims)
    lo, hi = _bounds(cart, dims, shape)
    halo = Halo(cart, tuple(b - a for a, b in zip(lo, hi)))
    dot = Dots(cart, alpha, lo, shape)
    b = _field(lo, hi, 0.0)
    x = np.zeros_like(b)
    r_ = b.copy()
    p_ = r_.copy()
    rr = dot(r_, r_)
    history = [rr]
    for _ in range(iters):
        q = _laplacian(halo.fill(p_), 3)
        a = rr / dot(p_, q)
        x = x + a * p_
        r_ = r_ - a * q
        rr_new = dot(r_, r_)
        p_ = r_ + (rr_new / rr) * p_
        rr = rr_new
        history.append(rr)
    return _digest(history)


def newton(alpha: bool, size: int, iters: int, quick: bool) -> str:
    """-lap u + u^3 = f on 2-D Create_cart tiles: Newton steps, each solving J du = -F by CG
    (J = -lap + 3 diag(u^2), symmetric positive definite) to a fixed count. End to end: the
    right-hand side, every residual and Jacobian, every solve (the communicator is made once
    per process, as an application makes it)."""
    cart, dims = _cart(2)
    shape = (size, size + 5) if quick else tuple(size * d for d in dims)
    lo, hi = _bounds(cart, dims, shape)
    halo = Halo(cart, tuple(b - a for a, b in zip(lo, hi)))
    dot = Dots(cart, alpha, lo, shape)
    f = 0.1 * _field(lo, hi, 0.05)
    u = np.zeros_like(f)
    history = []
    for _ in range(NEWTON_STEPS):
        F = _laplacian(halo.fill(u), 2) + u**3 - f
        history.append(dot(F, F))
        d = 3.0 * u * u
        du = np.zeros_like(u)
        r_ = -F
        p_ = r_.copy()
        rr = dot(r_, r_)
        for _ in range(iters):
            q = _laplacian(halo.fill(p_), 2) + d * p_
            a = rr / dot(p_, q)
            du = du + a * p_
            r_ = r_ - a * q
            rr_new = dot(r_, r_)
            p_ = r_ + (rr_new / rr) * p_
            rr = rr_new
        history.append(rr)
        u = u + du
    return _digest(history)


def tile(alpha: bool, size: int, iters: int, quick: bool) -> str:
    """One 2-D tile dot (alpha: the tile's (offset, shape) tuples) or the same data as a 1-D
    block (the baseline), `iters` calls with the same field."""
    p, r = WORLD.Get_size(), WORLD.Get_rank()
    rng = np.random.default_rng(100 + r)
    x, y = rng.standard_normal((size, size)), rng.standard_normal((size, size))
    got = []
    for _ in range(iters):
        if alpha:
            got.append(arrays.dot(WORLD, x, y, (r * size, 0), (p * size, size)))
        else:
            got.append(arrays.dot(WORLD, x.reshape(-1), y.reshape(-1), r * size * size, p * size * size))
    return _digest(got[-1:])


NEWTON_STEPS = 5
PROGRAMS = {"cg1d": cg1d, "cg3d": cg3d, "tile": tile, "newton": newton}
# (program, size, iterations, target ratio), full and --quick
CASES = [
    ("cg1d", 4096, 200, 1.15),
    ("cg1d", 65536, 100, 1.05),
    ("cg3d", 16, 100, 1.15),
    ("cg3d", 40, 30, 1.05),
    ("tile", 128, 500, 1.10),
    ("newton", 96, 200, 1.05),
]
QUICK = [
    ("cg1d", 1000, 10, 1.15),
    ("cg3d", 6, 8, 1.15),
    ("tile", 16, 5, 1.10),
    ("newton", 12, 6, 1.05),
]


def _slowest(seconds: float) -> float:
    buf = np.array([seconds])
    WORLD.Allreduce(MPI.IN_PLACE, buf, op=MPI.MAX)  # the harness's bookkeeping, after the timing
    return float(buf[0])


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _timed(fn, *args):
    """(the slower rank's seconds, the program's digest, the most page faults a rank took)."""
    WORLD.Barrier()
    f0 = _faults()
    t0 = time.perf_counter()
    out = fn(*args)
    seconds = _slowest(time.perf_counter() - t0)
    return seconds, out, int(_slowest(float(_faults() - f0)))


def run_case(name, size, iters, target, reps, quick) -> dict:
    fn = PROGRAMS[name]
    fn(True, size, max(1, iters // 10), quick)  # warm: the first calls build what they need
    fn(False, size, max(1, iters // 10), quick)
    ta, tb, ratios, digests, base_digests = [], [], [], set(), set()
    faults: dict = {True: [], False: []}
    for rep in range(reps):
        order = (True, False) if rep % 2 == 0 else (False, True)
        got = {}
        for alpha in order:
            got[alpha] = _timed(fn, alpha, size, iters, quick)
            faults[alpha].append(got[alpha][2])
        ta.append(got[True][0])
        tb.append(got[False][0])
        ratios.append(got[True][0] / got[False][0])
        digests.add(got[True][1])
        base_digests.add(got[False][1])
    ok = len(digests) == 1
    if name == "tile":  # the tile's bits are the 1-D block's
        ok = ok and digests == base_digests
    row = _row(
        f"{name} {size}",
        ta,
        tb,
        ratios,
        target,
        ok,
        digests,
        "MPI_Allreduce" if name != "tile" else "1-D block",
    )
    # Page faults per repetition (the rank with most): numpy-style programs allocate blocks above
    # glibc's mmap threshold every iteration, and whether the allocator then reuses its heap or
    # maps fresh pages (a fault per 4 KiB) depends on its history, not on the reductions; where
    # the two variants' counts differ, their times differ by that too (main() says so).
    row["faults"], row["baseline_faults"] = statistics.median(faults[True]), statistics.median(faults[False])
    return row


def _row(what, ta, tb, ratios, target, ok, digests, baseline) -> dict:
    med = statistics.median(ratios)
    return {
        "program": what,
        "alpha_s": statistics.median(ta),
        "baseline_s": statistics.median(tb),
        "baseline": baseline,
        "ratio": med,
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "target": target,
        "met": None if target is None else med <= target,
        "digest": sorted(digests)[0] if len(digests) == 1 else "DIFFERS: " + " ".join(sorted(digests)),
        "checks": "ok" if ok else "FAILED",
    }


def mixed(reps: int, calls: int) -> list:
    """One loop calling in turn MPI_Allreduce, Allreducers a and b of the same tree, and
    allreduce() in its documented forms, 8 B, new arrays every call (the turn starts one step
    later each iteration). Each step is timed by itself, so a step's figure includes its wait
    for the slower rank, which depends on the step before it.

    "Its twin" is the same loop with one third Allreducer of that tree taking both a's and b's
    places: the same steps in the same order, so the only difference is that the loop alternates
    two executors; a's and b's times against the twin's in their places are what alternating
    costs. The two loops run interleaved, iteration by iteration. For reference, the twin in a
    loop of its own (no other step: no lag from one)."""
    p, r = WORLD.Get_size(), WORLD.Get_rank()
    tree = pairwise(range(p), p)
    a, b, twin = (Allreducer(WORLD, tree, 1) for _ in range(3))
    recv, out = np.zeros(1), np.zeros(1)
    forms = {
        "allreduce(comm, x)": lambda x: alpha_mpi.allreduce(WORLD, x),
        "allreduce(comm, x, out=)": lambda x: alpha_mpi.allreduce(WORLD, x, out=out),
        "allreduce(comm, tree, {r: x}, layout=1)": lambda x: alpha_mpi.allreduce(
            WORLD, tree, {r: x}, layout=1
        ),
        "allreduce(comm, tree, {r: x}, layout=1, out=)": lambda x: alpha_mpi.allreduce(
            WORLD, tree, {r: x}, layout=1, out=out
        ),
    }
    steps = {
        "MPI_Allreduce": lambda x: WORLD.Allreduce(x, recv) or recv,
        "Allreducer a": lambda x: a.run({r: x}),
        "Allreducer b": lambda x: b.run({r: x}),
        **forms,
    }
    variants = {
        "mixed": steps,
        "twin": {
            **steps,
            "Allreducer a": lambda x: twin.run({r: x}),
            "Allreducer b": lambda x: twin.run({r: x}),
        },
        "alone": {"Allreducer a": lambda x: twin.run({r: x})},
    }
    pc = time.perf_counter
    ok = True

    def loop(n, names):
        """n iterations of each variant in `names`, interleaved iteration by iteration (so the
        variants meet the same machine); each variant's time per step, the slower rank's."""
        spent = {v: dict.fromkeys(variants[v], 0.0) for v in names}
        for i in range(n * len(names)):
            variant = names[i % len(names)]
            run, t = variants[variant], spent[variant]
            order = list(run)
            x = np.array([1.0 + r + i * 2.0**-40])  # new every call; the sum's order matters little at 8 B
            want = None
            k = (i // len(names)) % len(order)  # each step first as often
            for name in order[k:] + order[:k]:
                t0 = pc()
                got = run[name](x)
                t[name] += pc() - t0
                if name != "MPI_Allreduce":
                    bits = np.asarray(got).view(np.uint64)[0]
                    want = bits if want is None else want
                    if bits != want:
                        nonlocal ok
                        ok = False
        return {v: {k: _slowest(s / n) for k, s in t.items()} for v, t in spent.items()}

    groups = (("mixed", "twin"), ("alone",))
    for g in groups:
        loop(50, g)
    per: dict = {variant: {} for variant in variants}
    for rep in range(reps):
        for g in groups if rep % 2 == 0 else groups[::-1]:
            for variant, times in loop(calls, g).items():
                for k, v in times.items():
                    per[variant].setdefault(k, []).append(v)
    mix, tw = per["mixed"], per["twin"]
    rows = []
    for name in ("Allreducer a", "Allreducer b"):
        ratios = [m / s for m, s in zip(mix[name], tw[name])]
        rows.append(
            _row(f"mixed: {name}", mix[name], tw[name], ratios, 1.10, ok, {"-"}, "its twin in its place")
        )
    for name in forms:
        ratios = [m / s for m, s in zip(mix[name], mix["Allreducer a"])]
        rows.append(
            _row(f"mixed: {name}", mix[name], mix["Allreducer a"], ratios, 1.15, ok, {"-"}, "Allreducer a")
        )
    alone = per["alone"]["Allreducer a"]
    for name, base, what in (
        ("Allreducer a", alone, "its twin alone"),
        ("Allreducer a", mix["MPI_Allreduce"], "MPI_Allreduce"),
    ):
        ratios = [m / s for m, s in zip(mix[name], base)]
        rows.append(_row(f"mixed: {name}", mix[name], base, ratios, None, ok, {"-"}, what))
    for x in (a, b, twin):
        x.free()
    return rows


def _fmt(s: float) -> str:
    return f"{s * 1e6:9.2f} us" if s < 1e-3 else f"{s * 1e3:9.2f} ms"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small fixed global problems, 3 repetitions")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 5; --quick 3)")
    ap.add_argument("--json", default=None, help="also write the rows to this file (rank 0)")
    ap.add_argument(
        "--calls", type=int, default=None, help="calls per repetition of the mixed loop (2000; --quick 50)"
    )
    ap.add_argument("--only", default=None, help="run only the programs whose name starts with this")
    args = ap.parse_args(argv)
    reps = args.reps or (3 if args.quick else 5)
    rows = []
    for case in QUICK if args.quick else CASES:
        if args.only is None or case[0].startswith(args.only):
            rows.append(run_case(*case, reps, args.quick))
    if args.only is None or "mixed".startswith(args.only):
        rows.extend(mixed(reps, args.calls or (50 if args.quick else 2000)))
    if WORLD.Get_rank() == 0:
        print(
            f"# p={WORLD.Get_size()}, {MPI.Get_library_version().splitlines()[0].strip()}, "
            f"median of {reps} interleaved repetitions, the slower rank's time, "
            f"BLAS threads {os.environ['OPENBLAS_NUM_THREADS']}{', QUICK' if args.quick else ''}"
        )
        print(
            f"# {'program':47s} {'alpha_mpi':>12s} {'baseline':>12s}  ratio (min-max)        target  checks  baseline"
        )
        for w in rows:
            target = "" if w["target"] is None else f"<={w['target']:.2f} {'met' if w['met'] else 'MISSED'}"
            print(
                f"{w['program']:49s} {_fmt(w['alpha_s'])} {_fmt(w['baseline_s'])}  {w['ratio']:.3f} "
                f"({w['ratio_min']:.3f}-{w['ratio_max']:.3f})  {target:12s} {w['checks']:6s}  {w['baseline']}"
            )
        for w in rows:
            fa, fb = w.get("faults"), w.get("baseline_faults")
            if fa is not None and max(fa, fb) > 1000 and max(fa, fb) > 1.2 * min(fa, fb):
                print(
                    f"# {w['program']}: page faults per repetition {fa:.0f} (alpha_mpi) against {fb:.0f} "
                    "(baseline): the allocator mapped fresh pages for one and reused its heap for the "
                    "other (glibc's mmap threshold), which the times include"
                )
        for w in rows:
            if w["digest"] != "-":
                print(f"digest {w['program']}: {w['digest']}")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(
                    {"p": WORLD.Get_size(), "quick": args.quick, "reps": reps, "rows": rows}, fh, indent=1
                )
    return 0 if all(w["checks"] == "ok" for w in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
