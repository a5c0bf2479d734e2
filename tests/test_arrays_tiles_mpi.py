"""N-d tiles of alpha_mpi.arrays over MPI: every Cartesian tiling of awkward 2-D, 3-D and 4-D
shapes (even and uneven cuts, empty tiles, halo views, tiles out of rank order) on 1, 2, 3, 4
and 5 ranks gives the independent oracle's bits over the flattened array, on every rank; the
frames grow when a tiling needs it and every rank agrees; every refusal is raised by name on
every rank and the next call works; nothing but point-to-point touches the data.

Run under `mpiexec -n 2` and `-n 5` with `python -m pytest --with-mpi`: COMM_WORLD is cut into
groups of 1..5 ranks (the ranks beyond a group form a second group that runs the same test on
its own size), and every verdict is gathered over COMM_WORLD (`agree`).
"""

import numpy as np
import pytest
from array_oracle import oracle_dot, oracle_norm2, oracle_sum
from test_arrays_mpi import all_four, group, matches_oracle, u64, world  # the 1-D suite's
from tile_cases import SHAPES, block, global_data, oracle_values, tilings, with_halo

from alpha_mpi.refusals import Refusal

from conftest import agree
from spycomm import SpyComm

_WANT: dict = {}


def want(shape):
    if shape not in _WANT:
        g, h = global_data(shape)
        _WANT[shape] = oracle_values(g, h, oracle_sum, oracle_dot, oracle_norm2)
    return _WANT[shape]


def reduce_all(comm, g, h, box, shape, halo):
    x, y = block(g, box), block(h, box)
    if halo and x.size:
        x = with_halo(x)
    return all_four(comm, x, y, box[0], shape)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("shape", SHAPES)
def test_every_tiling_on_every_group_gives_the_oracle_bits(shape):
    """Groups of 1..5 ranks (as many as the job has), every process grid with even and uneven
    cuts, odd ranks passing halo views, and every tiling again with the tiles handed to the
    ranks in reverse order."""
    w = world()
    g, h = global_data(shape)
    expect = want(shape)
    failures = []
    for q in range(1, 6):
        if q > w.Get_size():
            continue
        comm, _ = group(q)
        p, r = comm.Get_size(), comm.Get_rank()
        rng = np.random.default_rng(100 * q + len(shape))  # the same draws on every rank
        for t, boxes_ in enumerate(tilings(shape, p, rng)):
            for owners in (list(range(p)), list(range(p))[::-1]):
                box = boxes_[owners.index(r)]
                got = reduce_all(comm, g, h, box, shape, halo=r % 2 == 1)
                if not matches_oracle(got, expect):
                    failures.append((p, t, owners[0], box, got))
    agree(w, not failures, f"{shape}: {failures[:3]}")


@pytest.mark.mpi(min_size=2)
def test_frames_grow_for_a_tiling_that_needs_them_and_every_rank_agrees():
    """Column strips of a 512-wide array: each rank's summary is 512 records (one per half row
    or narrower), more than the first frames hold. The rows say so on every rank alike, the
    exchange runs again in frames that fit, the channel keeps them, and the bits are the
    oracle's; row strips of another shape then still work (and shrink the frames after a run)."""
    from alpha_mpi import arrays
    from alpha_mpi.arrays import pairwise, tiles
    from alpha_mpi.arrays.api import _channel

    w = world()
    comm = w.Dup()
    p, r = comm.Get_size(), comm.Get_rank()
    shape = (512, 512)
    g, h = global_data(shape)
    cols = [512 * i // p for i in range(p + 1)]
    box = ((0, cols[r]), (512, cols[r + 1] - cols[r]))
    expect = u64(oracle_dot(g.ravel().tolist(), h.ravel().tolist())) if r == 0 else None
    expect = comm.bcast(expect, root=0)  # test-side
    ch = _channel(comm)
    before = ch.capacity.current
    got = [u64(arrays.dot(comm, block(g, box), block(h, box), box[0], shape)) for _ in range(3)]
    caps = w.allgather(ch.capacity.current)
    sizes = sorted(k[3] for k in ch.exchanges if k[2] == "tiles")
    agree(w, got == [expect] * 3, f"rank {r}: {got} vs {expect}")
    agree(w, before == pairwise.CAPACITY < caps[0] and len(set(caps)) == 1, f"capacities {before} -> {caps}")
    agree(w, sizes == [before, caps[0]], f"exchanges by capacity {sizes}: one growth, then reused")
    rows = [37 * i // p for i in range(p + 1)]
    small = (37, 53)
    gs, hs = global_data(small)
    sbox = ((rows[r], 0), (rows[r + 1] - rows[r], 53))
    for _ in range(tiles.Capacity.SHRINK_AFTER):
        ok = u64(arrays.dot(comm, block(gs, sbox), block(hs, sbox), sbox[0], small)) == u64(
            want(small)["dot"]
        )
        agree(w, ok, "row strips after column strips")
    shrunk = w.allgather(ch.capacity.current)
    agree(w, shrunk[0] < pairwise.CAPACITY and len(set(shrunk)) == 1, f"shrunk below the start: {shrunk}")
    arrays.reset(comm)
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_point_to_point_only():
    from alpha_mpi import arrays

    w = world()
    spy = SpyComm(w.Dup())
    p, r = w.Get_size(), w.Get_rank()
    shape = (37, 53)
    g, h = global_data(shape)
    cols = [53 * i // p for i in range(p + 1)]
    box = ((0, cols[r]), (37, cols[r + 1] - cols[r]))
    try:
        got = arrays.dot(spy, block(g, box), block(h, box), box[0], shape)
        ok = u64(got) == u64(want(shape)["dot"])
    except AssertionError as e:  # CollectiveUsed
        ok = str(e)
    agree(w, ok is True, f"spy: {ok}")


# ----------------------------------------------------------------------------- refusals


def _rows(r, p, shape):
    """This rank's box of even row strips."""
    cuts = [shape[0] * i // p for i in range(p + 1)]
    return (cuts[r], *([0] * (len(shape) - 1))), (cuts[r + 1] - cuts[r], *shape[1:])


def _case(name, r, p):
    """(call, codes this rank may raise, text every rank's message must hold or None)."""
    from alpha_mpi import arrays

    shape = (37, 53)
    g, h = global_data(shape)
    (o0, o1), (e0, e1) = _rows(r, p, shape)
    x, y = block(g, ((o0, o1), (e0, e1))).copy(), block(h, ((o0, o1), (e0, e1))).copy()
    last = p - 1
    if name == "hole":  # the last rank's tile is one column short: global index of (o0, 52)
        if r == last:
            x, y = x[:, :-1], y[:, :-1]
        o = _rows(last, p, shape)[0][0]
        return (lambda c: arrays.dot(c, x, y, (o0, o1), shape)), {"array-coverage-hole"}, f"= ({o}, 52)"
    if name == "overlap":  # rank 1 starts one row early
        if r == 1:
            o0 -= 1
            x, y = block(g, ((o0, 0), (e0 + 1, 53))), block(h, ((o0, 0), (e0 + 1, 53)))
        o = _rows(1, p, shape)[0][0] - 1
        return (lambda c: arrays.dot(c, x, y, (o0, o1), shape)), {"array-coverage-overlap"}, f"= ({o}, 0)"
    if name == "shape":
        s = (37, 54) if r == last else shape
        if r == last:
            x = np.ones((e0, 54))
        return (lambda c: arrays.sum(c, x, (o0, o1), s)), {"array-length-mismatch"}, "(37, 54) on ranks"
    if name == "outside":  # a local refusal: the others name it
        off = (o0, 1) if r == 1 else (o0, o1)
        return (
            (lambda c: arrays.sum(c, x, off, shape)),
            {"array-block-invalid" if r == 1 else "peer-refused"},
            None,
        )
    if name == "ndim":
        xx = x.ravel() if r == 0 else x
        return (
            (lambda c: arrays.sum(c, xx, (o0, o1), shape)),
            {"array-block-invalid" if r == 0 else "peer-refused"},
            None,
        )
    if name == "nan":
        if r == last:
            x[0, 3] = np.nan
        return (lambda c: arrays.sum(c, x, (o0, o1), shape)), {"non-finite-contribution"}, f"ranks [{last}]"
    if name == "one-d-beside-tiles":  # rank 0 calls the 1-D form, the others tiles
        if r == 0:
            return (
                (lambda c: arrays.sum(c, x.ravel(), o0 * 53, 37 * 53)),
                {"frame-identity-mismatch", "frame-size-mismatch", "peer-refused"},
                None,
            )
        return (
            (lambda c: arrays.sum(c, x, (o0, o1), shape)),
            {"frame-identity-mismatch", "frame-size-mismatch", "peer-refused"},
            None,
        )
    raise KeyError(name)


CASES = ["hole", "overlap", "shape", "outside", "ndim", "nan", "one-d-beside-tiles"]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", CASES)
def test_refused_by_name_on_every_rank_then_the_next_call_works(name):
    from alpha_mpi import arrays

    w = world()
    p, r = w.Get_size(), w.Get_rank()
    call, codes, text = _case(name, r, p)
    try:
        call(w)
        outcome, message = "no refusal", ""
    except Refusal as e:
        outcome, message = (e.code if e.code in codes else f"{e.code}: {e}"), str(e)
    agree(w, outcome in codes, f"{name}: rank {r} got {outcome}, expected one of {sorted(codes)}")
    agree(w, text is None or text in message, f"{name}: rank {r}'s message {message!r} lacks {text!r}")
    shape = (37, 53)
    g, h = global_data(shape)
    box = _rows(r, p, shape)
    got = arrays.dot(w, block(g, box), block(h, box), box[0], shape)
    agree(w, u64(got) == u64(want(shape)["dot"]), f"{name}: the next call")
