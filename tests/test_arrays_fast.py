"""The arrays' one C call (alpha_mpi/arrays/fast.py: the exchange's prepared run, an_run) on one rank.

A call whose geometry (operation, offset, n, block length) is that of an earlier call that
passed every check runs as one C call, with the same arrays or new ones; these tests show, on
COMM_SELF duplicates, that it gives the oracle's bits while the arrays' values change in place
and when the arrays are new every call, that it is taken (the ordinary path is not entered
again), and that everything that can change under a remembered geometry is checked on every
call: dtype, shape and strides changed in place, data moved by resize, a NaN, a root that
overflows, reset, Free, the bound on what is remembered, no array kept after the call.
The MPI suite (test_arrays_fast_mpi.py) shows the refusals that involve other ranks.
"""

import gc
import warnings
import weakref

import numpy as np
import pytest
from array_oracle import oracle_dot, oracle_norm2, oracle_sum, sequential_sum

from alpha_mpi import arrays
from alpha_mpi.arrays import api, fast, tiles
from alpha_mpi.refusals import Refusal

from conftest import order_sensitive


def u64(v):
    return int(np.float64(v).view(np.uint64))


@pytest.fixture
def comm():
    from mpi4py import MPI

    c = MPI.COMM_SELF.Dup()
    yield c
    arrays.reset(c)
    c.Free()


@pytest.fixture
def ordinary(monkeypatch):
    """Counts the calls that take the ordinary path (api._reduce)."""
    seen = []
    real = api._reduce

    def counted(*args, **kwargs):
        seen.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "_reduce", counted)
    return seen


def warm(call):
    """The call twice: its geometry is remembered after the first, the second is the C call."""
    call()
    return call()


def refill(rng, *arrays_):
    for a in arrays_:
        a[:] = order_sensitive(rng, a.size)


def test_a_repeated_call_is_one_c_call_with_the_oracle_bits(comm, ordinary):
    rng = np.random.default_rng(5)
    n = 1000
    x, y = order_sensitive(rng, n), order_sensitive(rng, n)
    # the data makes the order observable: a left-to-right sum has other bits
    assert u64(oracle_sum(x.tolist())) != u64(sequential_sum(x.tolist()))
    for i in range(6):
        refill(rng, x, y)  # the same objects, new values: the record binds the arrays every call
        got = (
            arrays.dot(comm, x, y, 0, n),
            arrays.dot(comm, x, x, 0, n),
            arrays.norm2(comm, x, 0, n),
            arrays.sum(comm, x, 0, n),
        )
        want = (oracle_dot(x.tolist(), y.tolist()), oracle_dot(x.tolist(), x.tolist()))
        want += (oracle_norm2(x.tolist()), oracle_sum(x.tolist()))
        assert [u64(v) for v in got] == [u64(v) for v in want], i
    # the first round's dot, norm2 and sum took the ordinary path (dot(x, x) has the geometry
    # of dot(x, y)); the 16th call shrank the frames to what the rows ask for (tiles.Capacity),
    # so each took it once more, to the smaller exchange; every other call the C call
    assert 16 == tiles.Capacity.SHRINK_AFTER
    assert ordinary == ["dot", "norm2", "sum"] * 2
    assert fast.lookup(comm, "dot", x, y, 0, n) is not None


def test_a_call_with_other_arguments_is_not_taken_for_a_remembered_one(comm, ordinary):
    rng = np.random.default_rng(6)
    n = 64
    x, y = order_sensitive(rng, n), order_sensitive(rng, n)
    warm(lambda: arrays.dot(comm, x, y, 0, n))
    assert fast.lookup(comm, "dot", x, y, 0, n) is not None
    assert fast.lookup(comm, "dot", y, x, 0, n) is not None  # other arrays of the same geometry
    assert fast.lookup(comm, "dot", x[1:], x[1:], 0, n) is None  # another length
    assert fast.lookup(comm, "sum", x, None, 0, n) is None  # another operation
    assert fast.lookup(comm, "dot", x, y, 0, n + 1) is None  # another n
    with pytest.raises(Refusal) as e:
        arrays.dot(comm, x, y, 0, n + 1)  # the ordinary path names it
    assert e.value.code == "array-coverage-hole"
    assert u64(arrays.dot(comm, x, y, 0, n)) == u64(oracle_dot(x.tolist(), y.tolist()))
    # a timeout= argument takes the ordinary path and is never remembered
    assert u64(arrays.dot(comm, x, y, 0, n, timeout=30.0)) == u64(oracle_dot(x.tolist(), y.tolist()))
    assert ordinary == ["dot", "dot", "dot"]


def test_dtype_shape_and_strides_changed_in_place_are_checked_again(comm):
    rng = np.random.default_rng(7)
    n = 100
    base = order_sensitive(rng, 2 * n)
    x, y = base[:n], order_sensitive(rng, n)
    warm(lambda: arrays.dot(comm, x, y, 0, n))
    assert fast.lookup(comm, "dot", x, y, 0, n) is not None
    assert u64(arrays.dot(comm, x, y, 0, n)) == u64(oracle_dot(x.tolist(), y.tolist()))
    x.dtype = np.int64  # the same memory read as integers: refused as the ordinary path refuses it
    with pytest.raises(Refusal) as e:
        arrays.dot(comm, x, y, 0, n)
    assert e.value.code == "dtype-invalid"
    x.dtype = np.float64
    x.shape = (1, n)  # a 2-D block where 1-D offset and n are given
    with pytest.raises(Refusal) as e:
        arrays.dot(comm, x, y, 0, n)
    assert e.value.code == "array-block-invalid"
    x.shape = (n,)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # NumPy 2.4 deprecates it; it still works
        x.strides = (16,)  # every other element of base: not the memory the record read
    want = oracle_dot(base[::2].tolist(), y.tolist())
    assert u64(arrays.dot(comm, x, y, 0, n)) == u64(want)
    y.dtype = np.int64  # y is checked as x is
    with pytest.raises(Refusal) as e:
        arrays.dot(comm, x, y, 0, n)
    assert e.value.code == "dtype-invalid"
    y.dtype = np.float64
    assert u64(arrays.dot(comm, x, y, 0, n)) == u64(want)


def test_an_array_is_bound_for_its_call_only_and_read_where_its_data_is_after_a_resize(comm):
    """The one call binds the arrays for that run only (their pointers read by C every call):
    between calls nothing holds or pins them, so an array may be resized (its data moves under
    the same object) and the next call reads it where its data is then."""
    x = np.arange(1.0, 11.0)
    arrays.sum(comm, x, 0, 10)
    arrays.sum(comm, x, 0, 10)  # the one call (its geometry remembered by the first)
    assert fast.lookup(comm, "sum", x, None, 0, 10) is not None
    x.resize(20, refcheck=False)  # allowed: no weak reference pins it, nothing points at it
    with pytest.raises(Refusal) as e:
        arrays.sum(comm, x, 0, 10)  # another length: the ordinary path refuses it
    assert e.value.code == "array-block-invalid"
    x.resize(10, refcheck=False)  # the remembered geometry again; its data may have moved again
    x[:] = np.arange(2.0, 12.0)
    assert arrays.sum(comm, x, 0, 10) == 65.0  # the ordinary path (the refusal above)
    assert arrays.sum(comm, x, 0, 10) == 65.0  # the one call, read where the data is now
    gone = weakref.ref(x)
    del x, e  # (the refusal's traceback holds the frames that held x)
    gc.collect()
    assert gone() is None  # not held after its call


def test_a_nan_in_place_is_refused_by_name_and_the_next_call_works(comm, ordinary):
    rng = np.random.default_rng(8)
    n = 300
    x = order_sensitive(rng, n)
    warm(lambda: arrays.sum(comm, x, 0, n))
    assert fast.lookup(comm, "sum", x, None, 0, n) is not None
    x[17] = np.nan
    with pytest.raises(Refusal) as e:
        arrays.sum(comm, x, 0, n)
    assert e.value.code == "non-finite-contribution" and "x[17] = nan" in str(e.value)
    x[17] = 1.0
    assert u64(arrays.sum(comm, x, 0, n)) == u64(oracle_sum(x.tolist()))
    assert ordinary == ["sum"] * 2  # the first call; the NaN (nothing sent, the ordinary way)


def test_a_root_that_overflows_is_refused_and_the_next_call_works(comm):
    x = np.zeros(8)
    warm(lambda: arrays.sum(comm, x, 0, 8))
    assert fast.lookup(comm, "sum", x, None, 0, 8) is not None
    x[0] = x[7] = 1e308  # each finite, their sum not
    with pytest.raises(Refusal) as e:
        arrays.sum(comm, x, 0, 8)
    assert e.value.code == "non-finite-combined"
    x[7] = -1.0
    assert arrays.sum(comm, x, 0, 8) == 1e308 - 1.0


def test_reset_and_free_forget_the_records(ordinary):
    from mpi4py import MPI

    c = MPI.COMM_SELF.Dup()
    x = np.arange(5.0)
    warm(lambda: arrays.sum(c, x, 0, 5))
    assert fast.lookup(c, "sum", x, None, 0, 5) is not None
    arrays.reset(c)
    assert fast.lookup(c, "sum", x, None, 0, 5) is None
    warm(lambda: arrays.sum(c, x, 0, 5))  # a new channel, remembered again
    assert fast.lookup(c, "sum", x, None, 0, 5) is not None
    c.Free()
    assert not [r for r in fast._CALLS if r.comm is c]
    assert ordinary == ["sum"] * 2


def test_what_is_remembered_is_bounded(comm):
    xs = [np.full(10 + i, float(i)) for i in range(fast.RECORDS + 3)]  # a geometry each
    for i, x in enumerate(xs):
        assert arrays.sum(comm, x, 0, x.size) == x.size * float(i)
        assert arrays.sum(comm, x, 0, x.size) == x.size * float(i)
    assert len(fast._CALLS) <= fast.RECORDS
    assert fast.lookup(comm, "sum", xs[0], None, 0, xs[0].size) is None  # the oldest went first
    assert fast.lookup(comm, "sum", xs[-1], None, 0, xs[-1].size) is not None
    big = np.ones(fast.MAX_ELEMENTS + 1)
    warm(lambda: arrays.sum(comm, big, 0, big.size))
    assert fast.lookup(comm, "sum", big, None, 0, big.size) is None  # its summary costs more than Python


def test_arrays_made_anew_for_every_call_take_the_one_call_and_none_is_held(comm, ordinary):

    rng = np.random.default_rng(10)
    y = order_sensitive(rng, 50)
    kept = []
    for i in range(5):
        x = order_sensitive(rng, 50) * 1.0  # a new x each call (often at the same address)
        got = arrays.dot(comm, x, y, 0, 50)
        assert u64(got) == u64(oracle_dot(x.tolist(), y.tolist())), i
        kept.append(weakref.ref(x))
    del x
    gc.collect()
    # bound for its call only: a solver's old arrays are freed when it drops them (held one
    # iteration longer, 512 KB blocks cost a numpy-style CG its allocator's reuse: engine_bind)
    assert [r() is None for r in kept] == [True] * 5
    assert ordinary == ["dot"]  # the first call; the others found its geometry


def test_dots_of_the_same_pairs_is_one_c_call(comm, ordinary):
    rng = np.random.default_rng(9)
    n = 500
    x, y = order_sensitive(rng, n), order_sensitive(rng, n)
    for i in range(5):
        refill(rng, x, y)
        got = arrays.dots(comm, [(x, y), (y, y), [x, x]], 0, n)  # tuples or lists, new each call
        want = [oracle_dot(a.tolist(), b.tolist()) for a, b in ((x, y), (y, y), (x, x))]
        assert [u64(v) for v in got] == [u64(v) for v in want], i
        assert type(got) is list
    assert ordinary == ["dot"]
    assert fast.lookup_pairs(comm, [(x, y), (y, y), (x, x)], 0, n) is not None
    assert fast.lookup_pairs(comm, [(x, y), (y, y)], 0, n) is None  # another batch
    assert fast.lookup_pairs(comm, [(x, y), (y, x), (x, x)], 0, n) is not None  # other arrays, same geometry
    assert fast.lookup_pairs(comm, [(x, y), (y, x[1:]), (x, x)], 0, n) is None  # another length
    y.dtype = np.int64  # one array of the batch changed in place: checked again
    with pytest.raises(Refusal) as e:
        arrays.dots(comm, [(x, y), (y, y), (x, x)], 0, n)
    assert e.value.code == "dtype-invalid"
    y.dtype = np.float64
    y[3] = np.inf
    with pytest.raises(Refusal) as e:
        arrays.dots(comm, [(x, y), (y, y), (x, x)], 0, n)
    assert e.value.code == "non-finite-contribution"
    y[3] = 0.5
    want = [oracle_dot(a.tolist(), b.tolist()) for a, b in ((x, y), (y, y), (x, x))]
    assert [u64(v) for v in arrays.dots(comm, [(x, y), (y, y), (x, x)], 0, n)] == [u64(v) for v in want]
    # a dots() of one pair and dot() share the exchange: either may take the other's record
    assert u64(arrays.dot(comm, x, y, 0, n)) == u64(want[0])


def test_a_tile_call_is_remembered_by_geometry_and_checked_again_on_every_call(comm, ordinary):
    """An N-d tile takes the one call too (its geometry: shape, offset, extent, strides): new
    arrays every call give the oracle's bits without the ordinary path; strides or dtype
    changed in place, and a float among the offsets, are seen on the next call; nothing is
    held after a call."""
    rng = np.random.default_rng(11)
    shape = (9, 14)
    g = order_sensitive(rng, 9 * 14).reshape(shape)
    want = oracle_dot(g.ravel().tolist(), g.ravel().tolist())
    for i in range(4):
        x = g.copy()  # new every call
        assert u64(arrays.dot(comm, x, x, (0, 0), shape)) == u64(want), i
        halo = np.zeros((11, 16))
        halo[1:-1, 1:-1] = g
        v = halo[1:-1, 1:-1]  # a strided view, new every call: another geometry (its strides)
        assert u64(arrays.norm2(comm, v, (0, 0), shape)) == u64(np.sqrt(want)), i
    assert ordinary == ["dot", "norm2"]
    assert fast.lookup_tile(comm, "dot", x, x, (0, 0), shape) is not None
    assert (
        fast.lookup_tile(comm, "dot", x, x, (0, 0.0), shape) is None
    )  # a float: the ordinary path refuses it
    held = weakref.ref(x)
    del x
    assert held() is None  # bound for its call only, never held after it
    x = g.copy()
    base = np.concatenate([g, g * 3.0], axis=1)  # (9, 28): every other column pair is g's
    y = base[:, :14]
    assert u64(arrays.dot(comm, y, y, (0, 0), shape)) == u64(want)  # other strides: checked, ordinary
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        y.strides = (8 * 28, 16)  # now every other element of a row: another layout in place
    got = arrays.dot(comm, np.ascontiguousarray(y), np.ascontiguousarray(y), (0, 0), shape)
    assert u64(arrays.dot(comm, y, y, (0, 0), shape)) == u64(got)  # read as it is now, never the old layout
    x.dtype = np.int64
    with pytest.raises(Refusal) as e:
        arrays.dot(comm, x, x, (0, 0), shape)
    assert e.value.code == "dtype-invalid"


def test_a_tile_pair_is_checked_array_by_array_against_its_own_strides(comm, ordinary):
    """A tile dot remembered with x and y of different strides: a later dot(x, x), x with x's
    strides, is not read through y's (each array is checked against its own, by the one C
    call); a misaligned y of the remembered strides takes the ordinary path. The oracle's bits
    every time."""
    rng = np.random.default_rng(12)
    shape = (6, 10)
    g = order_sensitive(rng, 60).reshape(shape)
    h = order_sensitive(rng, 60).reshape(shape)
    halo = np.zeros((8, 12))
    halo[1:-1, 1:-1] = h
    y = halo[1:-1, 1:-1]  # strides (96, 8)
    gh = oracle_dot(g.ravel().tolist(), h.ravel().tolist())
    for _ in range(3):
        assert u64(arrays.dot(comm, g.copy(), y, (0, 0), shape)) == u64(gh)
    assert ordinary == ["dot"]
    x = g.copy()
    assert u64(arrays.dot(comm, x, x, (0, 0), shape)) == u64(
        oracle_dot(g.ravel().tolist(), g.ravel().tolist())
    )
    assert ordinary == ["dot", "dot"]  # y's record does not fit x as y
    hh = h.copy()
    assert u64(arrays.dot(comm, g.copy(), hh, (0, 0), shape)) == u64(gh)
    assert u64(arrays.dot(comm, g.copy(), hh, (0, 0), shape)) == u64(gh)
    assert ordinary == ["dot", "dot"]  # contiguous pairs: the record dot(x, x) made
    raw = np.zeros(60 * 8 + 1, dtype=np.uint8)
    mis = np.frombuffer(raw.data, dtype=np.float64, count=60, offset=1).reshape(shape)
    mis[:] = h
    assert not mis.flags.aligned and mis.strides == hh.strides
    assert u64(arrays.dot(comm, g.copy(), mis, (0, 0), shape)) == u64(gh)
    assert ordinary == ["dot", "dot", "dot"]  # misaligned: not bound, copied by the ordinary path
