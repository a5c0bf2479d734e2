"""What `alpha-mpi bench allreduce` times: the contributions, each variant's call, and the
memory-bandwidth model.

A variant has `name`, `run()` (the timed call), `refill()` (restores its input, untimed),
`check()` (compares its bits with the reference, untimed), `close()` and the list `times`.
"""

from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI

from ... import kernel
from ...execution import Allreducer, allreduce
from ...execution.convenience import cached_executors
from ...model.tree import leaf_sequence
from .harness import statistic

SEED = 20240613
CHECK_ENV = "ALPHA_MPI_PAYLOAD_CHECK"


def order_sensitive(rng, n):
    """Values over ~120 binades with mixed signs: another summation order changes the bits."""
    mant = 1.0 + rng.random(n)
    exps = rng.integers(-60, 61, n).astype(np.float64)
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return sign * mant * np.exp2(exps)


def slot_values(slot: int, n: int, head: int) -> np.ndarray:
    """Deterministic order-sensitive values: the first `head` coordinates from their own stream,
    so that the oracle needs only those of every slot."""
    h = min(n, head)
    out = np.empty(n)
    out[:h] = order_sensitive(np.random.default_rng([SEED, slot, 0]), h)
    if n > h:
        out[h:] = order_sensitive(np.random.default_rng([SEED, slot, 1]), n - h)
    return out


def owned_slots(tree, rank: int) -> list:
    """The slots whose leaf this rank owns, in slot order."""
    return sorted(leaf.slot for leaf in leaf_sequence(tree) if leaf.owner == rank)


class AlphaVariant:
    """One alpha_mpi realization (or `auto`) as a persistent Allreducer; in reduce-scatter mode
    its result is this rank's chunk, coordinates [lo, hi) of the whole vector."""

    def __init__(self, comm, tree, n, realization, args, mine, mode="allreduce"):
        self.a = Allreducer(
            comm, tree, n, realization=realization, segment=args.segment, calibration=args.cal, mode=mode
        )
        self.requested = realization
        self.name = f"auto({self.a.realization})" if realization == "auto" else realization
        self.lo, self.hi = self.a.plan.chunks[comm.Get_rank()] if mode == "reduce-scatter" else (0, n)
        self.out = np.empty(self.hi - self.lo)
        self.mine = mine
        self.times = []
        self.ok = True
        self.ref = None

    @property
    def chosen(self):
        return self.a.realization

    def run(self):
        return self.a.run(self.mine, out=self.out)

    def refill(self):
        pass

    def check(self):
        if self.ref is not None and not np.array_equal(self.out.view(np.uint64), self.ref):
            self.ok = False

    def close(self):
        self.a.free()


class CheckedVariant(AlphaVariant):
    """`auto` built with the payload check on (ALPHA_MPI_PAYLOAD_CHECK=1 while it is built, on
    every rank): the CRC32C of every payload and the flag round after each run."""

    def __init__(self, comm, tree, n, args, mine):
        old = os.environ.get(CHECK_ENV)
        os.environ[CHECK_ENV] = "1"
        try:
            super().__init__(comm, tree, n, "auto", args, mine)
        finally:
            if old is None:
                del os.environ[CHECK_ENV]
            else:
                os.environ[CHECK_ENV] = old
        self.name = self.requested = "auto+crc"


class FunctionalVariant(AlphaVariant):
    """The convenience call `allreduce(comm, tree, contributions, out=)`: cached executor, no
    re-planning; its per-call cost against the persistent Allreducer is what this row shows."""

    def __init__(self, comm, tree, n, args, mine):
        super().__init__(comm, tree, n, "auto", args, mine)
        self.a.free()
        self.name = self.requested = "allreduce()"
        # The call as users write it (the size is each call's): the first call of a size builds
        # (or takes back) that size's executor outside the timed region
        self._call = lambda: allreduce(comm, tree, self.mine, out=self.out)
        self._call()
        self.a = _cache_entry(comm, tree)

    def run(self):
        return self._call()

    def close(self):
        pass  # the cached executor stays for the next size of the same tree


def _cache_entry(comm, tree):
    """The executor the plain call of `tree` runs now (its key's layout is None: each call's)."""
    return next(
        a
        for k, a in cached_executors(comm).items()
        if k.tree == ("tree", tree._placed) and k.layout is None and k.mode == "allreduce"
    )


class BaselineVariant:
    """A library collective of baseline.py (MPI_Allreduce, gloo): timed, its bits not checked."""

    chosen = None

    def __init__(self, impl):
        self.impl = impl
        self.name = self.requested = impl.name
        self.times = []
        self.ok = True
        self.run, self.refill = impl.run, impl.refill

    def check(self):
        pass

    def close(self):
        self.impl.close()


def bandwidth_model(comm, n: int, reps: int, how: str) -> dict:
    """copy + add + copy for this rank's share, timed on all ranks at once (max over ranks)."""
    p = comm.Get_size()
    share = -(-n // p)
    inc = n - n // p if p > 1 else 0
    src, dst = np.random.rand(max(inc, 1)), np.random.rand(max(inc, 1))
    pieces = [np.random.rand(share) for _ in range(max(p, 2))]
    acc = np.random.rand(share)
    src2, dst2 = np.random.rand(max(inc, 1)), np.random.rand(max(inc, 1))
    rows = {"copy_in": [], "add": [], "copy_out": []}
    for rep in range(reps + 1):
        comm.Barrier()
        t0 = time.perf_counter()
        np.copyto(dst, src)
        t1 = time.perf_counter()
        kernel.fold(acc, pieces)
        t2 = time.perf_counter()
        np.copyto(dst2, src2)
        t3 = time.perf_counter()
        if rep:
            rows["copy_in"].append(t1 - t0)
            rows["add"].append(t2 - t1)
            rows["copy_out"].append(t3 - t2)
    keys = sorted(rows)
    mine = np.array([statistic(rows[k], how) for k in keys])
    worst = np.empty_like(mine)
    comm.Allreduce(mine, worst, op=MPI.MAX)  # harness timing: buffers, never pickles
    out = dict(zip(keys, worst.tolist()))
    out["total"] = out["copy_in"] + out["add"] + out["copy_out"]
    out.update({"bytes": 8 * n, "p": p, "share_elements": share, "moved_elements": inc})
    return out
