"""alpha_mpi.arrays over MPI: random uneven decompositions on 1, 2, 3 and 5 ranks give the
independent oracle's bits on every rank; every refusal is raised by name on every rank and the
next call works; no collective and no pickle touches the data.

Run under `mpiexec -n 2` and `-n 5` with `python -m pytest --with-mpi`. Every test holds at any
size: COMM_WORLD is split into groups of 1, 2, 3 and 5 ranks (ranks beyond the group form a
second group that runs the same test on its own size), and every verdict is gathered over
COMM_WORLD (`agree`), so a failure on one rank fails on all.

Hypothesis runs on every rank with the same derandomized settings and draws that never depend on
the rank, so all ranks see the same examples; each example is also checked against rank 0's.
"""

import numpy as np
import pytest
from array_oracle import oracle_dot, oracle_norm2, oracle_sum, sequential_sum
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from alpha_mpi.execution import frames as fr
from alpha_mpi.refusals import Refusal

from conftest import agree, order_sensitive
from spycomm import SpyComm

_GROUPS: dict = {}
_DATA: dict = {}


def world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def group(q):
    """This rank's group when COMM_WORLD is cut into ranks [0, q) and [q, size): (comm, is_first)."""
    w = world()
    if q not in _GROUPS:
        first = w.Get_rank() < q
        _GROUPS[q] = (w.Split(0 if first else 1, w.Get_rank()), first)
    return _GROUPS[q]


def data(n):
    if n not in _DATA:
        rng = np.random.default_rng(n)
        x, y = order_sensitive(rng, n), order_sensitive(rng, n)
        want = (
            {
                "sum": oracle_sum(x.tolist()),
                "dot": oracle_dot(x.tolist(), y.tolist()),
                "norm2": oracle_norm2(x.tolist()),
                "dotyy": oracle_dot(y.tolist(), y.tolist()),
            }
            if n < 10**5
            else None
        )
        _DATA[n] = (x, y, want)
    return _DATA[n]


def u64(v):
    return int(np.float64(v).view(np.uint64))


def block_of(rank, size, n, cuts, perm):
    """Rank `rank`'s block [lo, hi) when [0, n) is cut at sorted(cuts[:size - 1]) and block
    perm_size[rank] goes to it (perm_size: the ranks 0..size-1 in the order perm lists them)."""
    bounds = [0] + sorted(cuts[: size - 1]) + [n]
    order = [v for v in perm if v < size]
    b = order[rank]
    return bounds[b], bounds[b + 1]


def all_four(comm, x, y, offset, shape):
    """sum, dot, norm2 and dots [(x, y), (y, y)] of this rank's block (1-D or a tile)."""
    from alpha_mpi import arrays

    return {
        "sum": arrays.sum(comm, x, offset, shape),
        "dot": arrays.dot(comm, x, y, offset, shape),
        "norm2": arrays.norm2(comm, x, offset, shape),
        "dots": arrays.dots(comm, [(x, y), (y, y)], offset, shape),
    }


def reduce_all(comm, n, lo, hi):
    x, y, _ = data(n)
    return all_four(comm, x[lo:hi], y[lo:hi], lo, n)


def matches_oracle(got, want):
    return all(u64(got[k]) == u64(want[k]) for k in ("sum", "dot", "norm2")) and [
        u64(v) for v in got["dots"]
    ] == [u64(want["dot"]), u64(want["dotyy"])]


@pytest.mark.mpi(min_size=1)
def test_the_data_makes_the_order_observable():
    for n in (1000,):
        x, _, want = data(n)
        agree(
            world(),
            u64(sequential_sum(x.tolist())) != u64(want["sum"]),
            "left to right differs from pairwise",
        )


@pytest.mark.mpi(min_size=1)
@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
@given(n=st.sampled_from([1, 2, 3, 1000]), draw=st.data())
def test_random_uneven_decompositions_give_the_oracle_bits(n, draw):
    cuts = draw.draw(st.lists(st.integers(0, n), min_size=4, max_size=4), label="cuts")
    perm = draw.draw(st.permutations(range(5)), label="perm")
    w = world()
    agree(w, w.bcast((n, cuts, perm), root=0) == (n, cuts, perm), "every rank draws the same example")
    _, _, want = data(n)
    for q in (1, 2, 3, 5):
        if q > w.Get_size():
            continue
        comm, _ = group(q)
        lo, hi = block_of(comm.Get_rank(), comm.Get_size(), n, cuts, perm)
        got = reduce_all(comm, n, lo, hi)
        agree(w, matches_oracle(got, want), f"q={q} size={comm.Get_size()} block [{lo}, {hi}) of {n}: {got}")


@pytest.mark.mpi(min_size=1)
def test_large_vector_two_decompositions_same_bits():
    """n = 2^20 + 7 on groups of 1, 2, 3 and 5 ranks: near-even blocks, then uneven blocks out
    of rank order with empty ones; every result equals the oracle (evaluated once, on rank 0)
    bit for bit, on every rank."""
    from alpha_mpi import arrays

    w = world()
    n = 2**20 + 7
    x, y, _ = data(n)
    want = (oracle_sum(x.tolist()), oracle_dot(x.tolist(), y.tolist())) if w.Get_rank() == 0 else None
    want = tuple(map(u64, w.bcast(want, root=0)))
    for q in (1, 2, 3, 5):
        if q > w.Get_size():
            continue
        comm, _ = group(q)
        p, r = comm.Get_size(), comm.Get_rank()
        even = [n * i // p for i in range(p + 1)]
        cuts = sorted({(n * (i * i + 1)) // (p * p + 3) for i in range(1, p)} | {0, n})
        while len(cuts) < p + 1:
            cuts.insert(1, 0)  # empty blocks
        got = []
        for bounds, owner in ((even, list(range(p))), (cuts, list(range(p))[::-1])):
            b = owner.index(r)
            lo, hi = bounds[b], bounds[b + 1]
            got.append(
                (u64(arrays.sum(comm, x[lo:hi], lo, n)), u64(arrays.dot(comm, x[lo:hi], y[lo:hi], lo, n)))
            )
        agree(w, got == [want, want], f"q={q} size={p}: {got} vs {want}")


@pytest.mark.mpi(min_size=2)
def test_changing_decompositions_on_one_communicator():
    from alpha_mpi import arrays

    w = world()
    p, r, n = w.Get_size(), w.Get_rank(), 1000
    x, y, want = data(n)
    ok = True
    for t in range(12):
        rng = np.random.default_rng(t)
        bounds = [0] + sorted(rng.integers(0, n + 1, p - 1).tolist()) + [n]
        owner = rng.permutation(p).tolist() if t % 2 else list(range(p))
        b = owner.index(r)
        lo, hi = bounds[b], bounds[b + 1]
        ok &= u64(arrays.dot(w, x[lo:hi], y[lo:hi], lo, n)) == u64(want["dot"])
    agree(w, ok, "every call with another decomposition gives the same bits")


@pytest.mark.mpi(min_size=2)
def test_point_to_point_only():
    """On a spy communicator that refuses every data collective and every pickling method."""
    from alpha_mpi import arrays

    w = world()
    spy = SpyComm(w.Dup())
    p, r, n = w.Get_size(), w.Get_rank(), 1000
    x, y, want = data(n)
    lo, hi = n * r // p, n * (r + 1) // p
    try:
        got = [arrays.sum(spy, x[lo:hi], lo, n), arrays.dot(spy, x[lo:hi], y[lo:hi], lo, n)]
        ok = [u64(v) for v in got] == [u64(want["sum"]), u64(want["dot"])]
    except AssertionError as e:  # CollectiveUsed
        ok = str(e)
    agree(w, ok is True, f"spy: {ok}")


# ----------------------------------------------------------------------------- refusals


def _even(r, p, n):
    return n * r // p, n * (r + 1) // p


def _case(name, r, p, n, x, y):
    """(callable, expected code on this rank) for one refusal case; the call is collective."""
    from alpha_mpi import arrays

    lo, hi = _even(r, p, n)
    last, xb, yb = p - 1, x[lo:hi].copy(), y[lo:hi].copy()
    if name == "hole":
        if r == last:
            xb, yb = xb[:-1], yb[:-1]
        return (lambda c: arrays.dot(c, xb, yb, lo, n)), {"array-coverage-hole"}
    if name == "overlap":
        if r == 1:
            lo, xb, yb = lo - 1, x[lo - 1 : hi], y[lo - 1 : hi]
        return (lambda c: arrays.dot(c, xb, yb, lo, n)), {"array-coverage-overlap"}
    if name == "length":
        nn = n + 1 if r == last else n
        return (lambda c: arrays.sum(c, xb, lo, nn)), {"array-length-mismatch"}
    if name == "nan":
        if r == last:
            xb[len(xb) // 2] = np.nan
        return (lambda c: arrays.sum(c, xb, lo, n)), {"non-finite-contribution"}
    if name == "inf-in-y":
        if r == 0:
            yb[0] = -np.inf
        return (lambda c: arrays.dot(c, xb, yb, lo, n)), {"non-finite-contribution"}
    if name == "overflow":
        if r == 1:
            xb[:] = 1e200
            yb[:] = 1e200
        return (lambda c: arrays.dot(c, xb, yb, lo, n)), {"non-finite-combined"}
    if name == "float32":
        xs = xb.astype(np.float32) if r == 1 else xb
        return (lambda c: arrays.sum(c, xs, lo, n)), {"dtype-invalid" if r == 1 else "peer-refused"}
    if name == "wrong-length-y":
        ys = yb[:-1] if r == 0 else yb
        return (lambda c: arrays.dot(c, xb, ys, lo, n)), {"array-block-invalid" if r == 0 else "peer-refused"}
    if name == "offset-out-of-range":
        off = n if r == 1 else lo
        return (lambda c: arrays.sum(c, xb, off, n)), {"array-block-invalid" if r == 1 else "peer-refused"}
    if name == "bad-timeout":
        t = "soon" if r == 0 else None
        return (lambda c: arrays.sum(c, xb, lo, n, timeout=t)), {"usage" if r == 0 else "peer-refused"}
    if name == "sum-vs-dot":
        fn = (lambda c: arrays.sum(c, xb, lo, n)) if r == 0 else (lambda c: arrays.dot(c, xb, yb, lo, n))
        return fn, {"frame-order-mismatch", "frame-identity-mismatch", "peer-refused"}
    if name == "batch-size":
        pairs = [(xb, yb), (xb, xb)] if r == 0 else [(xb, yb)]
        return (lambda c: arrays.dots(c, pairs, lo, n)), {
            "frame-size-mismatch",
            "frame-order-mismatch",
            "peer-refused",
        }
    raise KeyError(name)


CASES = [
    "hole",
    "overlap",
    "length",
    "nan",
    "inf-in-y",
    "overflow",
    "float32",
    "wrong-length-y",
    "offset-out-of-range",
    "bad-timeout",
    "sum-vs-dot",
    "batch-size",
]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", CASES)
def test_refused_by_name_on_every_rank_then_the_next_call_works(name):
    from alpha_mpi import arrays

    w = world()
    p, r, n = w.Get_size(), w.Get_rank(), 1000
    # (No Open MPI exception any more: a batch-size mismatch sends a longer frame, which Open
    # MPI 5's single-copy path used to write past the posted receive; receives are size-safe.)
    x, y, want = data(n)
    call, codes = _case(name, r, p, n, x, y)
    try:
        call(w)
        outcome = "no refusal"
    except Refusal as e:
        outcome = e.code if e.code in codes else f"{e.code}: {e}"
    agree(w, outcome in codes, f"{name}: rank {r} got {outcome}, expected one of {sorted(codes)}")
    lo, hi = _even(r, p, n)
    agree(w, u64(arrays.dot(w, x[lo:hi], y[lo:hi], lo, n)) == u64(want["dot"]), f"{name}: the next call")


@pytest.mark.mpi(min_size=2)
def test_nonfinite_names_the_rank_and_index():
    from alpha_mpi import arrays

    w = world()
    p, r, n = w.Get_size(), w.Get_rank(), 1000
    x, _, _ = data(n)
    lo, hi = _even(r, p, n)
    xb = x[lo:hi].copy()
    if r == p - 1:
        xb[3] = np.nan
    try:
        arrays.sum(w, xb, lo, n)
        text = ""
    except Refusal as e:
        text = str(e)
    ok = f"ranks [{p - 1}]" in text and (r != p - 1 or f"global index {lo + 3}" in text)
    agree(w, ok, f"rank {r}: {text}")


@pytest.mark.mpi(min_size=2)
def test_freed_communicator_leaves_no_stale_channel():
    """The channel is an attribute of the user's communicator: freeing it and making another
    one (which may reuse the handle) starts afresh, with the new group."""
    from alpha_mpi import arrays

    w = world()
    n = 1000
    x, y, want = data(n)
    ok = True
    for members in (w.Get_size(), 1, w.Get_size() - 1 or 1):
        c = w.Split(0 if w.Get_rank() < members else 1, w.Get_rank())
        p, r = c.Get_size(), c.Get_rank()
        lo, hi = n * r // p, n * (r + 1) // p
        ok &= u64(arrays.dot(c, x[lo:hi], y[lo:hi], lo, n)) == u64(want["dot"])
        arrays.reset(c)
        c.Free()
    agree(w, ok, "fresh communicators give the oracle's bits")


@pytest.mark.mpi(min_size=2)
def test_a_flipped_payload_bit_is_refused_when_the_check_is_on(monkeypatch):
    """The arrays' frames carry the engine's payload crc32 (ALPHA_MPI_PAYLOAD_CHECK=1): a frame of
    rank 1 whose payload fails its crc is refused where it lands and flagged onwards, no rank
    returns other bits than the oracle's, and the next call works."""
    from alpha_mpi import arrays
    from alpha_mpi.arrays.api import _channel

    monkeypatch.setenv("ALPHA_MPI_PAYLOAD_CHECK", "1")
    w = world()
    c = w.Dup()  # a fresh channel, so its exchanges are built with the check on
    p, r, n = c.Get_size(), c.Get_rank(), 1000
    x, y, want = data(n)
    lo, hi = _even(r, p, n)
    ex = _channel(c).exchange("dot", 1)
    assert ex.engine.payload_check

    def flip(index, mv):
        # The payload's crc field, header crc made valid: the receiver sees a payload that is
        # not the one sent (flipping the payload itself would also corrupt rank 1's own state,
        # which the same buffer holds).
        import struct

        struct.pack_into("<I", mv, 108, struct.unpack_from("<I", mv, 108)[0] ^ 1)
        fr.seal(mv)

    if r == 1:
        ex.engine.send_hook = flip
    try:
        got, code = arrays.dot(c, x[lo:hi], y[lo:hi], lo, n), None
    except Refusal as e:
        got, code = None, e.code
    codes = w.allgather(code)  # test-side verdict
    ok = code in ("frame-payload-corrupt", "peer-refused") or u64(got) == u64(want["dot"])
    agree(w, ok and "frame-payload-corrupt" in codes, f"rank {r}: {codes}")
    ex.engine.send_hook = None
    agree(w, u64(arrays.dot(c, x[lo:hi], y[lo:hi], lo, n)) == u64(want["dot"]), "the next call")
    arrays.reset(c)
    c.Free()


@pytest.mark.mpi(min_size=2)
def test_the_channel_is_agreed_when_created_a_differing_payload_check_is_refused_on_every_rank(monkeypatch):
    """The arrays agree once, when their channel is created (exchange.py says why not per lazy
    build): the last rank has ALPHA_MPI_PAYLOAD_CHECK=1, the others not; the first array call on
    a fresh communicator is refused `executor-identity-mismatch` on every rank, and once every
    rank has the same setting the next call gives the oracle's bits."""
    from alpha_mpi import arrays

    w = world()
    p, r, n = w.Get_size(), w.Get_rank(), 1000
    comm = w.Dup()
    x, y, want = data(n)
    lo, hi = _even(r, p, n)
    monkeypatch.setenv("ALPHA_MPI_PAYLOAD_CHECK", "1" if r == p - 1 else "0")
    try:
        arrays.dot(comm, x[lo:hi], y[lo:hi], lo, n)
        code = None
    except Refusal as e:
        code = e.code
    agree(w, code == "executor-identity-mismatch", f"rank {r}: {code}")
    monkeypatch.setenv("ALPHA_MPI_PAYLOAD_CHECK", "0")
    got = arrays.dot(comm, x[lo:hi], y[lo:hi], lo, n)
    agree(w, u64(got) == u64(want["dot"]), f"rank {r}: the next call's bits")
    arrays.reset(comm)
