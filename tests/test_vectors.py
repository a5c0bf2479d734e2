"""The one C call that checks and binds a float64 vector (alpha_mpi/kernel/vectors.py).

The prepared runs' steady state binds a call's new arrays through it: it must accept exactly
what the Python checks accept (an ndarray, not a subclass, of float64's dtype object, 1-D of n,
C-contiguous, aligned, writeable where asked) and nothing else, write the array's own data
pointer where it fits and nothing where it does not (for a dot: both blocks or neither). Then,
on one rank (COMM_SELF), the Allreducer and the arrays with new arrays every call, with layouts
C must not take, read-only and misaligned `out`: the oracle's bits or the refusal by name; the
Allreducer holds and pins every array its table points at, the arrays bind theirs for one run.
"""

import warnings

import numpy as np
import pytest
from array_oracle import oracle_dot

from alpha_mpi import arrays, oracle, pairwise
from alpha_mpi.arrays import fast
from alpha_mpi.execution import Allreducer
from alpha_mpi.kernel import ffi, vectors
from alpha_mpi.refusals import Refusal

from conftest import bits, order_sensitive

N = 9


def _table():
    t = ffi.new("double *[]", 2)
    return t, vectors.address(t, 0), vectors.address(t, 1)


def _ptr(t, i) -> int:
    return int(ffi.cast("uintptr_t", t[i]))


def _data(a) -> int:
    return a.__array_interface__["data"][0]


def _misaligned(n):
    raw = np.zeros(8 * n + 1, dtype=np.uint8)
    return np.frombuffer(raw.data, dtype=np.float64, count=n, offset=1)


class Sub(np.ndarray):
    pass


def _read_only(n):
    a = np.arange(float(n))
    a.flags.writeable = False
    return a


OTHERS = {
    "a list": lambda: [0.0] * N,
    "None": lambda: None,
    "a subclass": lambda: np.zeros(N).view(Sub),
    "int64": lambda: np.zeros(N, dtype=np.int64),
    "float32": lambda: np.zeros(N, dtype=np.float32),
    "big-endian float64": lambda: np.zeros(N, dtype=">f8"),
    "another length": lambda: np.zeros(N + 1),
    "2-D": lambda: np.zeros((1, N)),
    "strided": lambda: np.zeros(2 * N)[::2],
    "reversed": lambda: np.zeros(N)[::-1],
    "misaligned": lambda: _misaligned(N),
}


def test_the_layout_is_read_as_numpy_reads_it():
    assert vectors.READY  # CPython with NumPy's array layout: the import check passed


@pytest.mark.parametrize("kind", sorted(OTHERS))
def test_what_the_python_checks_refuse_is_not_bound(kind):
    t, a0, a1 = _table()
    a, good = OTHERS[kind](), np.zeros(N)
    assert vectors.bind(id(a), N, 0, a0) == vectors.OTHER
    assert vectors.bind2(id(good), id(a), N, a0, a1) == vectors.OTHER
    assert vectors.bind2(id(a), id(good), N, a0, a1) == vectors.OTHER
    assert t[0] == ffi.NULL and t[1] == ffi.NULL  # nothing written: both or neither


def test_a_fitting_vector_is_bound_where_its_data_is_now():
    t, a0, a1 = _table()
    x, y = np.arange(float(N)), np.ones(N)
    assert vectors.bind(id(x), N, 0, a0) == 0 and _ptr(t, 0) == _data(x)
    x.resize(4 * N, refcheck=False)  # unpinned here: the data moves under the same object
    x.resize(N, refcheck=False)
    assert vectors.bind(id(x), N, 0, a0) == 0 and _ptr(t, 0) == _data(x)  # read again, every call
    assert vectors.bind2(id(x), id(y), N, a0, a1) == 0
    assert (_ptr(t, 0), _ptr(t, 1)) == (_data(x), _data(y))
    assert vectors.bind2(id(y), id(y), N, a0, a1) == 0 and _ptr(t, 0) == _ptr(t, 1) == _data(y)
    z = np.zeros(0)
    assert vectors.bind(id(z), 0, 0, a0) == 0  # an empty block is a block


def test_writeable_is_asked_for_where_the_result_lands():
    t, a0, _ = _table()
    ro = _read_only(N)
    assert vectors.bind(id(ro), N, 1, a0) == vectors.OTHER and t[0] == ffi.NULL
    assert vectors.bind(id(ro), N, 0, a0) == 0 and _ptr(t, 0) == _data(ro)  # a contribution is read only


def test_a_layout_set_in_place_is_checked_again():
    t, a0, _ = _table()
    x = np.arange(2.0 * N)
    v = x[:N]
    assert vectors.bind(id(v), N, 0, a0) == 0
    with warnings.catch_warnings():  # NumPy 2.4 deprecates it; users still do it
        warnings.simplefilter("ignore", DeprecationWarning)
        v.strides = (16,)  # the same object, another layout
        assert vectors.bind(id(v), N, 0, a0) == vectors.OTHER
        v.strides = (8,)
    v.dtype = np.int64
    assert vectors.bind(id(v), N, 0, a0) == vectors.OTHER
    v.dtype = np.float64
    v.shape = (3, 3)
    assert vectors.bind(id(v), N, 0, a0) == vectors.OTHER


@pytest.fixture
def comm():
    from mpi4py import MPI

    c = MPI.COMM_SELF.Dup()
    yield c
    arrays.reset(c)
    c.Free()


def _want(tree, x):
    return np.array(oracle.evaluate(tree, {0: x.tolist()}))


def test_an_allreducer_binds_new_arrays_and_anything_else_takes_the_full_path(comm):
    tree = pairwise(range(1), 1)
    a = Allreducer(comm, tree, N)
    rng = np.random.default_rng(42)
    for _ in range(3):  # new contributions and a new `out` every call, each held and pinned
        x, out = rng.standard_normal(N), np.empty(N)
        assert np.array_equal(bits(a.run({0: x}, out)), bits(_want(tree, x)))
        with pytest.raises(ValueError):
            out.resize(2 * N, refcheck=False)  # the delivery target is pinned
        with pytest.raises(ValueError):
            x.resize(2 * N, refcheck=False)
    base = rng.standard_normal(2 * N)
    strided = base[::2]  # C must not take it: the full path copies it
    assert np.array_equal(bits(a.run({0: strided})), bits(_want(tree, strided.copy())))
    x = rng.standard_normal(N)
    with pytest.raises(Refusal) as e:
        a.run({0: x}, _read_only(N))
    assert e.value.code == "out-invalid"
    with pytest.raises(Refusal) as e:
        a.run({0: x}, _misaligned(N))
    assert e.value.code == "out-invalid"
    with pytest.raises(Refusal) as e:
        a.run({0: np.zeros(N, dtype=np.float32)})
    assert e.value.code == "dtype-invalid"
    out = np.empty(N)
    assert np.array_equal(bits(a.run({0: x}, out)), bits(_want(tree, x)))  # and the next call works
    a.free()


def test_a_dot_of_new_blocks_every_call_is_the_one_call_with_the_oracle_bits(comm):
    rng = np.random.default_rng(7)
    n = 300
    x, y = order_sensitive(rng, n), order_sensitive(rng, n)
    arrays.dot(comm, x, y, 0, n)
    arrays.dot(comm, x, y, 0, n)
    for _ in range(3):
        u, w = order_sensitive(rng, n), order_sensitive(rng, n)
        c = fast.lookup(comm, "dot", u, w, 0, n)
        assert c is not None
        held = [e[0] for e in c.ex.prepared._binding.held if e is not None]
        assert not any(a is u or a is w for a in held)  # bound for its run only, never held
        got = arrays.dot(comm, u, w, 0, n)
        assert np.float64(got).view(np.uint64) == np.float64(oracle_dot(u, w)).view(np.uint64)
    v = order_sensitive(rng, 2 * n)[::2]  # strided: not bound by C, the ordinary path reads it
    assert fast.lookup(comm, "dot", u, v, 0, n) is None
    got = arrays.dot(comm, u, v, 0, n)
    assert np.float64(got).view(np.uint64) == np.float64(oracle_dot(u, v.copy())).view(np.uint64)
