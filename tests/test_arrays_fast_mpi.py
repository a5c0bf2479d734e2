"""The arrays' one C call (alpha_mpi/arrays/fast.py) over MPI: refusals in the steady state.

Every case first makes the call three times with clean data on every rank (the third is the
one C call everywhere, checked), then one or more ranks diverge: values changed in place (a
NaN, a root that overflows), a dtype or shape changed in place, another block or length or
operation on one rank, a late peer, the send hook of tests. The ranks still on the C call must
refuse by name exactly as the ordinary path does (their table or flags differ from what passed,
so C hands the verdict to Python), every rank raises, and the next call with the clean data
is the one C call again with the oracle's bits.

Run under `mpiexec -n 2` and `-n 5` with `python -m pytest --with-mpi`.
"""

import time

import numpy as np
import pytest
from array_oracle import oracle_dot, oracle_sum

from alpha_mpi import arrays
from alpha_mpi.arrays import fast
from alpha_mpi.arrays.api import _channel
from alpha_mpi.execution import frames as fr
from alpha_mpi.refusals import Refusal

from conftest import agree, order_sensitive

N = 1000


def world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def u64(v):
    return int(np.float64(v).view(np.uint64))


def _even(r, p, n):
    return n * r // p, n * (r + 1) // p


class Case:
    """One rank's part of a steady-state case: its arrays (this rank's block of x and y), the
    clean call, the diverging call and the codes it may raise."""

    def __init__(self, comm, name):
        p, r = comm.Get_size(), comm.Get_rank()
        rng = np.random.default_rng(11)
        self.gx, self.gy = order_sensitive(rng, N), order_sensitive(rng, N)
        self.lo, self.hi = _even(r, p, N)
        self.x, self.y = self.gx[self.lo : self.hi].copy(), self.gy[self.lo : self.hi].copy()
        self.comm, self.name, self.p, self.r = comm, name, p, r
        self.op = "sum" if name in ("nan", "root-overflow", "length") else "dot"
        if name == "norm2-vs-dot":  # both remembered on every rank; rank 0 calls norm2, the others dot
            self.y, self.gy = self.x, self.gx
        self.pairs = [(self.x, self.y), (self.y, self.y)]  # dots-inf

    def warm(self):
        """The clean call three times on every rank (remembered the second time, the third is
        the C call)."""
        for _ in range(3):
            if self.name == "norm2-vs-dot":
                arrays.norm2(self.comm, self.x, self.lo, N)
            if self.name == "dots-inf":
                arrays.dots(self.comm, self.pairs, self.lo, N)
            self.clean()

    def clean(self):
        c, x, lo = self.comm, self.x, self.lo
        if self.op == "sum":
            return arrays.sum(c, x, lo, N)
        return arrays.dot(c, x, self.y, lo, N)

    def want(self):
        if self.op == "sum":
            return oracle_sum(self.gx.tolist())
        return oracle_dot(self.gx.tolist(), self.gy.tolist())

    def remembered(self) -> bool:
        y = None if self.op == "sum" else self.y
        ok = fast.lookup(self.comm, self.op, self.x, y, self.lo, N) is not None
        if self.name == "norm2-vs-dot":
            ok &= fast.lookup(self.comm, "norm2", self.x, self.x, self.lo, N) is not None
        if self.name == "dots-inf":
            ok &= fast.lookup_pairs(self.comm, self.pairs, self.lo, N) is not None
        return ok

    def diverge(self):
        """(the call, the codes this rank may raise; an empty set: it must return the oracle's
        bits), after changing what the case changes in place."""
        name, r, last, c, lo = self.name, self.r, self.p - 1, self.comm, self.lo
        if name == "nan":
            if r == last:
                self.x[len(self.x) // 2] = np.nan
            return self.clean, {"non-finite-contribution"}
        if name == "root-overflow":
            self.saved = self.x.copy()
            self.x[:] = 0.0
            self.x[0] = 1e308  # each rank's summary finite, the root not
            return self.clean, {"non-finite-combined"}
        if name == "dtype":
            if r == 1:
                self.x.dtype = np.int64
            return self.clean, {"dtype-invalid" if r == 1 else "peer-refused"}
        if name == "shape":
            if r == 1:
                self.x.shape = (1, -1)
            return self.clean, {"array-block-invalid" if r == 1 else "peer-refused"}
        if name == "overlap":
            if r == 1:  # another block on rank 1 (the ordinary path there), the C call elsewhere
                xb, yb = self.gx[lo - 1 : self.hi].copy(), self.gy[lo - 1 : self.hi].copy()
                return (lambda: arrays.dot(c, xb, yb, lo - 1, N)), {"array-coverage-overlap"}
            return self.clean, {"array-coverage-overlap"}
        if name == "length":
            if r == last:
                return (lambda: arrays.sum(c, self.x, lo, N + 1)), {"array-length-mismatch"}
            return self.clean, {"array-length-mismatch"}
        if name == "norm2-vs-dot":  # both remembered calls, of different exchanges
            call = (lambda: arrays.norm2(c, self.x, lo, N)) if r == 0 else self.clean
            return call, {"frame-identity-mismatch", "frame-order-mismatch", "peer-refused"}
        if name == "dots-inf":
            if r == last:
                self.y[0] = -np.inf
            return (lambda: arrays.dots(c, self.pairs, lo, N)), {"non-finite-contribution"}
        if name == "late-peer":
            if r == 0:
                time.sleep(0.05)  # the others' C call returns to Python every 5 ms meanwhile
            return self.clean, set()
        if name in ("hook", "bad-frame"):
            ex = _channel(c).exchange("dot", 1)

            def hook(index, mv):
                if name == "bad-frame":
                    mv[40] ^= 1  # a header field no longer the planned one, its checksum made good
                    fr.seal(mv)

            if r == 1:
                ex.engine.send_hook = hook
            self.ex = ex
            if name == "hook":
                return self.clean, set()
            # refused where the frame lands and flagged onwards; a rank whose last receive it
            # was not may return the oracle's bits (the engine's rule with the payload check
            # off: docs/allreduce.md); the test below wants a frame refusal on some rank
            return self.clean, {"frame-identity-mismatch", "frame-order-mismatch", "peer-refused", "oracle"}
        raise KeyError(name)

    def restore(self):
        if self.name == "dots-inf":
            self.y[:] = self.gy[self.lo : self.hi]
        if self.name == "nan":
            self.x[:] = self.gx[self.lo : self.hi]
        if self.name == "root-overflow":
            self.x[:] = self.saved
        if self.name == "dtype" and self.r == 1:
            self.x.dtype = np.float64
        if self.name == "shape" and self.r == 1:
            self.x.shape = (self.hi - self.lo,)
        if self.name in ("hook", "bad-frame"):
            self.ex.engine.send_hook = None


CASES = [
    "nan",
    "root-overflow",
    "dtype",
    "shape",
    "overlap",
    "length",
    "norm2-vs-dot",
    "dots-inf",
    "late-peer",
    "hook",
    "bad-frame",
]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", CASES)
def test_a_remembered_call_refuses_by_name_on_every_rank_then_the_next_call_works(name):
    w = world()
    comm = w.Dup()  # a channel of the case's own
    case = Case(comm, name)
    case.warm()
    agree(w, case.remembered(), f"{name}: rank {case.r} does not remember the clean call")
    call, codes = case.diverge()
    try:
        got = call()
        outcome = "oracle" if u64(got) == u64(case.want()) else f"bits {got!r}"
    except Refusal as e:
        outcome = e.code if e.code in codes else f"{e.code}: {e}"
    ok = outcome in codes if codes else outcome == "oracle"
    agree(
        w, ok, f"{name}: rank {case.r} got {outcome}, expected one of {sorted(codes) or ['the oracle bits']}"
    )
    if name == "bad-frame":
        named = w.allgather(outcome)  # test-side verdict
        agree(w, any(o.startswith("frame-") for o in named), f"bad-frame: nobody named the frame: {named}")
    case.restore()
    if name == "dots-inf":
        got2 = arrays.dots(comm, case.pairs, case.lo, N)
        want2 = [case.want(), oracle_dot(case.gy.tolist(), case.gy.tolist())]
        agree(w, [u64(v) for v in got2] == [u64(v) for v in want2], f"dots-inf: rank {case.r}: {got2}")
    got = case.clean()
    agree(w, u64(got) == u64(case.want()), f"{name}: rank {case.r}: the next call gave {got!r}")
    agree(w, case.remembered(), f"{name}: rank {case.r}: the next call is not the C call")
    arrays.reset(comm)
    comm.Free()
