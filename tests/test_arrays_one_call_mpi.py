"""The arrays in the one interpreter (issue 42): a 1-D block dot and an N-d tile dot are ordinary
prepared runs, each call ONE C call (an_run) of a program whose first op is the arrays' summary
(A) and whose last is the root check (R), with new arrays every call and geometries that
alternate on one communicator; every value has the independent oracle's bits.

Run under `mpiexec -n 2` and `-n 5` with `python -m pytest --with-mpi` (the verdicts are
gathered over COMM_WORLD, so a failure on one rank fails every rank).
"""

import numpy as np
import pytest
from array_oracle import oracle_dot, oracle_norm2, oracle_sum, sequential_sum
from tile_cases import block, cartesian, even_cuts, global_data, with_halo

from alpha_mpi.arrays import api, fast
from alpha_mpi.execution.prepared import PreparedRun

from conftest import agree

SHAPE = (37, 53)


def u64(v):
    return int(np.float64(v).view(np.uint64))


class Counted:
    """Counts the C calls (an_run) of one prepared run, and the ordinary path's calls."""

    def __init__(self, monkeypatch):
        self.ordinary = []
        real = api._reduce

        def counted(*args, **kwargs):
            self.ordinary.append(args[1])
            return real(*args, **kwargs)

        monkeypatch.setattr(api, "_reduce", counted)
        self.c_calls = 0
        self._wrapped = set()

    def watch(self, prepared: PreparedRun) -> None:
        if id(prepared) in self._wrapped:
            return
        self._wrapped.add(id(prepared))
        real = prepared._an_run

        def an_run(*args):
            self.c_calls += 1
            return real(*args)

        prepared._an_run = an_run


def _boxes(p: int, r: int):
    rows = cartesian([even_cuts(SHAPE[0], p), [0, SHAPE[1]]])[r]  # whole rows: also a 1-D block
    cols = cartesian([[0, SHAPE[0]], even_cuts(SHAPE[1], p)])[r]  # columns: strided tiles
    return rows, cols


def _handle(comm, op, x, y, offset, shape):
    """The prepared run a remembered call of this geometry runs, and its program's op kinds."""
    if type(offset) is int:
        c = fast.lookup(comm, op, x, y, offset, shape)
    else:
        c = fast.lookup_tile(comm, op, x, y, offset, shape)
    if c is None:
        return None, ""
    return c.ex.prepared, "".join(o.kind for o in c.ex.engine.rp.ops)


@pytest.mark.mpi(min_size=1)
def test_tile_and_block_dots_are_one_c_call_each_with_the_oracle_bits(monkeypatch):
    from mpi4py import MPI

    from alpha_mpi import arrays

    comm = MPI.COMM_WORLD.Dup()
    p, r = comm.Get_size(), comm.Get_rank()
    g, h = global_data(SHAPE, seed=3)
    gf, hf = g.ravel().tolist(), h.ravel().tolist()
    want = {"dot": oracle_dot(gf, hf), "norm2": oracle_norm2(gf), "sum": oracle_sum(gf)}
    ok = u64(want["sum"]) != u64(sequential_sum(gf))  # the data makes the order observable
    rows, cols = _boxes(p, r)
    lo, length = rows[0][0] * SHAPE[1], rows[1][0] * SHAPE[1]
    seen = Counted(monkeypatch)
    calls = 0
    failures = []
    try:
        for it in range(6):
            # new arrays every call (copies, and new halo views), geometries in turn
            xt, yt = block(g, rows).copy(), block(h, rows).copy()
            got = [("tile rows dot", arrays.dot(comm, xt, yt, rows[0], SHAPE), want["dot"])]
            xb, yb = g.ravel()[lo : lo + length].copy(), h.ravel()[lo : lo + length].copy()
            got.append(("block dot", arrays.dot(comm, xb, yb, lo, g.size), want["dot"]))
            xc, yc = block(g, cols), block(h, cols)
            if xc.size:
                xc, yc = with_halo(xc), with_halo(yc)  # strided views, new every call
            got.append(("tile cols dot", arrays.dot(comm, xc, yc, cols[0], SHAPE), want["dot"]))
            got.append(("tile rows norm2", arrays.norm2(comm, xt, rows[0], SHAPE), want["norm2"]))
            got.append(("block sum", arrays.sum(comm, xb, lo, g.size), want["sum"]))
            calls += len(got)
            failures += [(it, what) for what, v, w in got if u64(v) != u64(w)]
            if it == 1:  # every geometry is remembered now (the first call of the column tiles
                # grew the tile frames: the row tiles' second call was an ordinary one again),
                # so watch the C calls of the next ones
                for args in (
                    ("dot", xt, yt, rows[0], SHAPE),
                    ("dot", xb, yb, lo, g.size),
                    ("dot", xc, yc, cols[0], SHAPE),
                    ("norm2", xt, xt, rows[0], SHAPE),
                    ("sum", xb, None, lo, g.size),
                ):
                    prepared, kinds = _handle(comm, *args)
                    ok &= isinstance(prepared, PreparedRun) and kinds[:1] == "A" and "R" in kinds
                    if prepared is not None:
                        seen.watch(prepared)
                first_calls, first_ordinary = calls, len(seen.ordinary)
        # after the first rounds: no ordinary path, and exactly one C call per arrays call
        ok &= seen.ordinary[:5] == ["dot", "dot", "dot", "norm2", "sum"]
        ok &= len(seen.ordinary) == first_ordinary and seen.c_calls == calls - first_calls
    finally:
        arrays.reset(comm)
        comm.Free()
    agree(MPI.COMM_WORLD, ok and not failures, f"{failures} ordinary {seen.ordinary} C calls {seen.c_calls}")


@pytest.mark.mpi(min_size=1)
def test_a_nan_in_a_remembered_tile_is_refused_by_name_on_every_rank_then_the_next_call_works():
    """The summary op meets the NaN before anything is sent (it stops the run); the ordinary
    path then names it on every rank, and the next call of the geometry is the one call again."""
    from mpi4py import MPI

    from alpha_mpi import arrays
    from alpha_mpi.refusals import Refusal

    comm = MPI.COMM_WORLD.Dup()
    p, r = comm.Get_size(), comm.Get_rank()
    g, h = global_data(SHAPE, seed=4)
    _, cols = _boxes(p, r)
    x, y = block(g, cols).copy(), block(h, cols).copy()
    want = oracle_dot(g.ravel().tolist(), h.ravel().tolist())
    codes, names = [], []
    try:
        ok = u64(arrays.dot(comm, x, y, cols[0], SHAPE)) == u64(want)
        ok &= fast.lookup_tile(comm, "dot", x, y, cols[0], SHAPE) is not None
        if r == p - 1 and x.size:
            x.flat[x.size // 2] = np.nan
        try:
            arrays.dot(comm, x, y, cols[0], SHAPE)
        except Refusal as e:
            codes.append(e.code)
            names.append(str(e))
        if r == p - 1 and x.size:
            x.flat[x.size // 2] = g[
                tuple(o + i for o, i in zip(cols[0], np.unravel_index(x.size // 2, x.shape)))
            ]
        ok &= u64(arrays.dot(comm, x, y, cols[0], SHAPE)) == u64(want)
        ok &= codes == ["non-finite-contribution"]  # on every rank, naming the rank
        ok &= len(names) == 1 and f"ranks [{p - 1}]" in names[0]
    finally:
        arrays.reset(comm)
        comm.Free()
    agree(MPI.COMM_WORLD, ok, f"codes {codes} {names}")
