"""The 1-D blocks' frames follow what the rows ask for (alpha_mpi/arrays/tiles.py Capacity): they
start at the bound of any 1-D table, shrink after a run of calls that need less, grow at once
for a call that needs more (every rank runs the exchange again in frames that fit), and every
call keeps the oracle's bits, remembered calls included.

Run under `mpiexec -n 2` and `-n 5` with `python -m pytest --with-mpi`.
"""

import numpy as np
import pytest
from array_oracle import oracle_dot
from test_arrays_mpi import data, u64, world

from conftest import agree, order_sensitive


def _odd_cuts(p, n):
    """Block bounds of [0, n) at odd places: each block has about 2 log2 of its length records."""
    return [0, *[(n * j // p) | 1 for j in range(1, p)], n]


@pytest.mark.mpi(min_size=2)
def test_block_frames_shrink_after_a_run_grow_at_once_and_keep_the_oracle_bits():
    from alpha_mpi import arrays
    from alpha_mpi.arrays import fast, pairwise
    from alpha_mpi.arrays.api import _channel
    from alpha_mpi.arrays.tiles import Capacity

    w = world()
    comm = w.Dup()
    p, r = comm.Get_size(), comm.Get_rank()
    n = 1000
    x, y, want = data(n)
    lo, hi = n * r // p, n * (r + 1) // p
    for i in range(Capacity.SHRINK_AFTER + 4):  # new arrays every call, as a solver makes them
        got = arrays.dot(comm, x[lo:hi].copy(), y[lo:hi].copy(), lo, n)
        agree(w, u64(got) == u64(want["dot"]), f"call {i}, rank {r}: {got!r}")
    ch = _channel(comm)
    caps = w.allgather(ch.block_capacity.current)
    agree(w, caps[0] < pairwise.CAPACITY and len(set(caps)) == 1, f"shrunk on every rank alike: {caps}")
    used = sorted(k[3] for k in ch.exchanges if k[:3] == ("dot", 1, None))
    agree(w, used == [caps[0], pairwise.CAPACITY], f"the exchanges by capacity: {used}")
    agree(w, fast.lookup(comm, "dot", x[lo:hi].copy(), y[lo:hi], lo, n) is not None, "remembered again")

    # A table that needs more than the shrunk frames: long blocks cut at odd places.
    big = (1 << 17) + 12345
    rng = np.random.default_rng(42)
    gx, gy = order_sensitive(rng, big), order_sensitive(rng, big)
    expect = u64(oracle_dot(gx.tolist(), gy.tolist())) if r == 0 else None
    expect = w.bcast(expect, root=0)  # test-side
    b = _odd_cuts(p, big)
    for i in range(3):  # grows at once (the first call exchanges twice), then the C call
        got = arrays.dot(comm, gx[b[r] : b[r + 1]].copy(), gy[b[r] : b[r + 1]].copy(), b[r], big)
        agree(w, u64(got) == expect, f"odd cuts, call {i}, rank {r}: {got!r}")
    grown = w.allgather(ch.block_capacity.current)
    agree(w, grown[0] > caps[0] and len(set(grown)) == 1, f"grown on every rank alike: {caps[0]} -> {grown}")
    agree(
        w, fast.lookup(comm, "dot", gx[b[r] : b[r + 1]], gy[b[r] : b[r + 1]], b[r], big) is not None, "fast"
    )

    # Out of rank order in the frames that grew: the sorted exchange, the same bits; a batch too.
    q = p - 1 - r
    got = arrays.dot(comm, gx[b[q] : b[q + 1]].copy(), gy[b[q] : b[q + 1]].copy(), b[q], big)
    agree(w, u64(got) == expect, f"reversed, rank {r}: {got!r}")
    pairs = [(x[lo:hi], y[lo:hi]), (y[lo:hi], x[lo:hi]), (x[lo:hi], x[lo:hi])]
    got = arrays.dots(comm, pairs, lo, n)
    ok = [u64(v) for v in got] == [
        u64(want["dot"]),
        u64(want["dot"]),
        u64(oracle_dot(x.tolist(), x.tolist())),
    ]
    agree(w, ok, f"dots, rank {r}: {got!r}")
    arrays.reset(comm)
    comm.Free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind", ["blocks", "tiles"])
def test_frames_that_came_apart_meet_again_without_a_reset(kind):
    """What a call completed on some ranks only can leave (a header spoiled in a last receive,
    payload check off: docs/allreduce.md): rank 0's frames shrunk, the others' not. The next
    call is refused by name on every rank (the frames differ), the ones after have the
    oracle's bits again, with no reset (tiles.Capacity.refused)."""
    from alpha_mpi import arrays
    from alpha_mpi.arrays import tiles
    from alpha_mpi.arrays.api import _channel
    from alpha_mpi.refusals import Refusal

    w = world()
    comm = w.Dup()
    p, r = comm.Get_size(), comm.Get_rank()
    n = 200 * p
    x, y, want = data(n)
    if kind == "blocks":
        lo, hi = n * r // p, n * (r + 1) // p
        xb, yb, offset, shape = x[lo:hi], y[lo:hi], lo, n
    else:  # rank r's 4 rows of the same data as a (4p, 50) array: a 2-D tile
        xb, yb = x.reshape(4 * p, 50)[4 * r : 4 * r + 4], y.reshape(4 * p, 50)[4 * r : 4 * r + 4]
        offset, shape = (4 * r, 0), (4 * p, 50)

    def call():
        return arrays.dot(comm, xb.copy(), yb.copy(), offset, shape)

    agree(w, u64(call()) == u64(want["dot"]), "the first call")  # counts towards a shrink
    ch = _channel(comm)
    capacity = ch.block_capacity if kind == "blocks" else ch.capacity
    if r == 0:
        capacity.current = tiles.FLOOR  # as if rank 0 alone had completed the shrinking call
    try:
        code = None
        call()
    except Refusal as e:
        code = e.code
    codes = w.allgather(code)
    agree(
        w, all(c is not None and (c.startswith("frame-") or c == "peer-refused") for c in codes), f"{codes}"
    )
    again = [u64(call()) for _ in range(3)]
    agree(w, again == [u64(want["dot"])] * 3, f"rank {r}: {again} after {codes}")
    arrays.reset(comm)
    comm.Free()
