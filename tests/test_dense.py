"""The fixed-order dense kernels (csrc/kernel/dense.h) against the independent oracle, bit for bit, on
every ISA path this CPU runs; exp and log against exact values; the refusals; alpha_mpi.ops; and
the embedded MLP computed by them (single process, fast).

Bits are compared as uint64 views. The data mix magnitudes over many decades, so that another
summation order (descending, pairwise, numpy's BLAS) gives other bits in many outputs: asserted
on the same data, not assumed.
"""

from __future__ import annotations

import math
import subprocess
import sys
from decimal import Decimal, localcontext

import dense_oracle as O
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from alpha_mpi import kernel as K
from alpha_mpi import ops
from alpha_mpi.learning import MLP
from alpha_mpi.learning.mlp import BlasMLP
from alpha_mpi.refusals import KernelRefusal

PATHS = ("generic", "sse2", "avx2", "avx512", "neon")


def u64(a):
    return np.ascontiguousarray(a, dtype=np.float64).view(np.uint64)


def same_bits(got, want) -> bool:
    return np.array_equal(u64(got).ravel(), u64(np.array(want, dtype=np.float64)).ravel())


def spread(rng, *shape, decades=6):
    """Values over 2*decades decades, both signs: sums of their products depend on the order."""
    return rng.standard_normal(shape) * 10.0 ** rng.uniform(-decades, decades, shape)


@pytest.fixture
def path(request):
    """Run the test with the products forced onto one ISA path (skipped, by name, where absent)."""
    name = request.param
    if name not in K.isa_paths():
        pytest.skip(f"ISA path {name} is not available on this CPU/build ({K.isa_paths()})")
    before = K.isa_path()
    K.select_isa_path(name)
    yield name
    K.select_isa_path(before)


# (m, k, n): edges of every tile and panel: one element, fewer rows or columns than a tile, more
# than one packed panel of k (128), few columns and more rows (the transposed route), k = 0.
SHAPES = [(1, 1, 1), (5, 3, 7), (4, 129, 24), (9, 200, 10), (33, 17, 37), (70, 5, 3), (3, 0, 5), (1, 300, 2)]


def operands(kind, m, k, n, rng):
    """(a, b) stored as the product kind reads them, for C (m x n)."""
    a = spread(rng, *((k, m) if kind == "tn" else (m, k)))
    b = spread(rng, *((n, k) if kind == "nt" else (k, n)))
    return np.ascontiguousarray(a), np.ascontiguousarray(b)


PRODUCTS = {
    "nn": (K.matmul, O.matmul, lambda a, b: a @ b),
    "tn": (K.matmul_tn, O.matmul_tn, lambda a, b: a.T @ b),
    "nt": (K.matmul_nt, O.matmul_nt, lambda a, b: a @ b.T),
}


@pytest.mark.parametrize("path", PATHS, indirect=True)
@pytest.mark.parametrize("kind", sorted(PRODUCTS))
def test_products_match_the_oracle_on_every_path(path, kind):
    rng = np.random.default_rng(hash(kind) % 2**32)
    fn, oracle, _ = PRODUCTS[kind]
    for m, k, n in SHAPES:
        a, b = operands(kind, m, k, n, rng)
        bias = spread(rng, n)
        for with_bias in (None, bias):
            out = np.full((m, n), np.nan)
            fn(out, a, b, with_bias)
            assert same_bits(out, oracle(a, b, with_bias)), (path, kind, (m, k, n), with_bias is not None)


def test_the_declared_order_is_observable():
    """On this data the ascending order, the descending one, numpy's BLAS and a bias added first
    give other bits: matching the oracle says which order ran."""
    rng = np.random.default_rng(7)
    m, k, n = 8, 64, 30
    a, b = spread(rng, m, k), spread(rng, k, n)
    bias = spread(rng, n)
    out = K.matmul(np.empty((m, n)), a, b, bias)
    assert same_bits(out, O.matmul(a, b, bias))
    descending = O.matmul(a[:, ::-1], b[::-1], bias)
    bias_first = [[O.product_sum([bias[j], *a[i]], [1.0, *b[:, j]]) for j in range(n)] for i in range(m)]
    with threadpool_limits(1):
        blas = a @ b + bias
    for other in (descending, bias_first, blas):
        differ = int(np.sum(u64(out) != u64(np.array(other))))
        assert differ > m * n // 4, differ


@pytest.mark.parametrize("path", [p for p in PATHS if p != "generic"], indirect=True)
def test_every_path_gives_the_generic_bits_at_the_model_shapes(path):
    """The embedded model's products (32 samples, 128 -> 700 -> 10) on this path and on the
    generic C loops: the same bits (uint64)."""
    rng = np.random.default_rng(3)
    X, W1, W2 = spread(rng, 32, 128), spread(rng, 128, 700), spread(rng, 700, 10)
    G, D = spread(rng, 32, 700), spread(rng, 32, 10)
    cases = [
        (K.matmul, np.empty((32, 700)), X, W1),
        (K.matmul, np.empty((32, 10)), G, W2),
        (K.matmul_tn, np.empty((700, 10)), G, D),
        (K.matmul_nt, np.empty((32, 700)), D, W2),
        (K.matmul_tn, np.empty((128, 700)), X, G),
    ]
    got = [fn(out, a, b).copy() for fn, out, a, b in cases]
    K.select_isa_path("generic")
    for (fn, out, a, b), mine in zip(cases, got):
        assert same_bits(mine, fn(out, a, b))


def test_isa_path_names_a_path_this_cpu_runs():
    assert K.isa_path() in K.isa_paths() and set(K.isa_paths()) <= set(PATHS)
    assert "generic" in K.isa_paths() and ops.isa_path() == K.isa_path()


# ----------------------------------------------------------------------------- element-wise


def test_col_sum_relu_and_its_mask_match_the_oracle():
    rng = np.random.default_rng(11)
    a = spread(rng, 37, 23)
    assert same_bits(K.col_sum(np.empty(23), a), O.col_sum(a))
    assert not same_bits(K.col_sum(np.empty(23), a), O.col_sum(a[::-1]))  # the row order shows
    z = np.array([1.5, -2.0, 0.0, -0.0, np.nan, -np.inf, np.inf, 5e-324, -5e-324])
    g = np.arange(1.0, 10.0)
    r = K.relu(np.empty_like(z), z)
    assert same_bits(r, O.relu(z)) and u64(r)[3] == 0  # -0.0 becomes +0.0; NaN stays NaN
    assert np.isnan(r[4])
    assert same_bits(K.relu_backward(np.empty_like(g), g, z), O.relu_backward(g, z))
    again = z.copy()
    K.relu(again, again)  # out may be the input itself
    assert same_bits(again, r)
    # the backward mask with out as g, as z, as both (each aliasing case has its own loop)
    g = np.where(np.isnan(z), 1.0, -z) + 0.25
    gg, zz = g.copy(), z.copy()
    assert same_bits(K.relu_backward(gg, gg, z), O.relu_backward(g, z))
    assert same_bits(K.relu_backward(zz, g, zz), O.relu_backward(g, z))
    zz = z.copy()  # g and z the same array, NaN included (not > 0: +0.0)
    assert same_bits(K.relu_backward(zz, zz, zz), O.relu_backward(z, z))


def test_softmax_cross_entropy_matches_the_oracle():
    rng = np.random.default_rng(5)
    logits = spread(rng, 40, 10, decades=1)
    logits[3, 4] = logits[3, 7] = 50.0  # two equal maxima: the first counts
    labels = rng.integers(0, 10, 40)
    grad = np.full_like(logits, np.nan)
    loss = K.softmax_xent(grad, logits, labels)
    want_loss, want_grad = O.softmax_xent(logits, labels)
    assert same_bits([loss], [want_loss]) and same_bits(grad, want_grad)
    # in place (grad == logits): the same bits
    z = logits.copy()
    assert same_bits([K.softmax_xent(z, z, labels)], [want_loss]) and same_bits(z, want_grad)
    # the loss sums rows in ascending order: the descending sum differs on this data
    rows = [O.softmax_xent(logits[i : i + 1], labels[i : i + 1])[0] for i in range(40)]
    assert same_bits([O.product_sum(rows, [1.0] * 40)], [loss])
    assert not same_bits([O.product_sum(rows[::-1], [1.0] * 40)], [loss])


# ----------------------------------------------------------------------------- exp and log


def _exp_inputs(rng):
    edges = [0.0, -0.0, 1.0, -1.0, 709.782712893384, 709.7827128933839, 709.78, -708.3964185322641]
    edges += [-708.4, -720.0, -740.0, -745.1332191019411, -745.1332191019412, -745.2, 1e-300, -1e-300]
    edges += [5e-324, 2.0**-28, -(2.0**-28), 0.5 * math.log(2), 1.5 * math.log(2), 1e-10]
    return np.concatenate(
        [
            rng.uniform(-746, 710, 40000),
            rng.uniform(-1.1, 1.1, 20000),
            rng.standard_normal(10000) * 10.0 ** rng.uniform(-20, 0, 10000),
            rng.uniform(-745.2, -708, 10000),  # subnormal results
            np.array(edges),
        ]
    )


def _log_inputs(rng):
    pos = np.abs(rng.standard_normal(40000)) * np.exp2(rng.integers(-1074, 1023, 40000).astype(float))
    pos = pos[np.isfinite(pos) & (pos > 0)]
    near1 = 1.0 + rng.standard_normal(10000) * 10.0 ** rng.uniform(-16, -1, 10000)
    sub = (rng.integers(1, 2**52, 10000, dtype=np.uint64)).view(np.float64)  # subnormal inputs
    edges = [1.0, 2.0, 0.5, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, math.e, 10.0]
    return np.concatenate([pos, near1, sub, rng.uniform(0.5, 2.0, 20000), np.array(edges)])


@pytest.mark.parametrize(
    "name, inputs, libm",
    [("exp", _exp_inputs, math.exp), ("log", _log_inputs, math.log)],
)
def test_exp_and_log_match_their_oracle_and_libm_within_one_ulp(name, inputs, libm):
    x = inputs(np.random.default_rng(21))
    got = getattr(K, name)(np.empty_like(x), x)
    want = np.array([getattr(O, name)(v) for v in x.tolist()])
    assert np.array_equal(u64(got), u64(want)), f"{name}: the kernel is not the declared algorithm"

    def ref(v):
        try:
            return libm(v)
        except OverflowError:
            return math.inf

    libm_bits = u64(np.array([ref(v) for v in x.tolist()])).astype(np.int64)
    ulps = np.abs(u64(got).astype(np.int64) - libm_bits)
    assert ulps.max() <= 1, (name, x[np.argmax(ulps)])
    if name == "exp":
        assert (got[(x < -708.4) & (x > -745.1)] < 2.2250738585072014e-308).all()  # subnormal results


@pytest.mark.parametrize("name", ["exp", "log"])
def test_exp_and_log_are_within_one_ulp_of_the_exact_value(name):
    """Against the exact value (decimal, 60 digits): every result is one of the two binary64
    neighbours of the true value (error below 1 ulp), subnormal results included."""
    rng = np.random.default_rng(22)
    x = (_exp_inputs if name == "exp" else _log_inputs)(rng)
    x = x[rng.permutation(x.size)[:6000]]
    got = getattr(K, name)(np.empty_like(x), x)
    with localcontext() as ctx:
        ctx.prec = 60
        for v, r in zip(x.tolist(), got.tolist()):
            exact = Decimal(v).exp() if name == "exp" else Decimal(v).ln()
            if math.isinf(r):
                assert exact > Decimal(1.7976931348623157e308), (name, v)
                continue
            err = abs(Decimal(r) - exact)
            unit = Decimal(math.ulp(r)) if r != 0.0 else Decimal(5e-324)
            assert err < unit, (name, v, r, float(err / unit))


def test_exp_and_log_special_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 710.0, -746.0, 1.0])
    e = K.exp(np.empty_like(x), x)
    assert e[:4].tolist() == [1.0, 1.0, np.inf, 0.0] and np.isnan(e[4]) and e[5] == np.inf
    assert u64(e)[6] == 0 and e[7] == O.exp(1.0)
    y = np.array([0.0, -0.0, 1.0, np.inf, -np.inf, np.nan, -1.0, 5e-324])
    lg = K.log(np.empty_like(y), y)
    assert lg[:4].tolist() == [-np.inf, -np.inf, 0.0, np.inf] and u64(lg)[2] == 0
    assert np.isnan(lg[4:7]).all() and lg[7] == O.log(5e-324)


# ----------------------------------------------------------------------------- refusals


def _refused(code, fn, *args, **kwargs):
    with pytest.raises(KernelRefusal) as e:
        fn(*args, **kwargs)
    assert e.value.code == code, e.value
    return e.value


def test_products_refuse_bad_arguments_by_name_and_the_next_call_works():
    a, b = np.ones((3, 4)), np.ones((4, 5))
    out = np.empty((3, 5))
    _refused("dtype-invalid", K.matmul, out, a.astype(np.float32), b)
    _refused("dtype-invalid", K.matmul, out, a.tolist(), b)
    _refused("kernel-bad-argument", K.matmul, out, np.ones((3, 5)), b)  # k does not fit
    _refused("kernel-bad-argument", K.matmul, np.empty((3, 4)), a, b)  # out's shape
    _refused("kernel-bad-argument", K.matmul, out, np.ones(12), b)  # not 2-D
    _refused("kernel-bad-argument", K.matmul, out, np.ones((4, 3)).T, b)  # not C-contiguous
    _refused("kernel-bad-argument", K.matmul, out, a, b, np.ones(4))  # bias shape
    ro = np.empty((3, 5))
    ro.flags.writeable = False
    _refused("kernel-bad-argument", K.matmul, ro, a, b)
    big = np.ones((4, 4))
    e = _refused("kernel-bad-argument", K.matmul, big, big, np.ones((4, 4)))  # out is an input
    assert "overlaps" in e.message
    _refused("kernel-bad-argument", K.matmul_tn, out, a, b)  # tn wants a (k, m)
    _refused("kernel-bad-argument", K.matmul_nt, out, a, b)  # nt wants b (n, k)
    _refused("kernel-bad-argument", K.col_sum, np.empty(3), a)  # one sum per column: 4
    _refused("kernel-bad-argument", K.relu, np.empty(3), a)
    x = np.arange(6.0)
    _refused("kernel-bad-argument", K.exp, x[1:], x[:-1])  # partial overlap
    assert same_bits(K.matmul(out, a, b), np.full((3, 5), 4.0))


def test_softmax_refuses_a_label_outside_the_classes_and_writes_nothing():
    logits = np.zeros((3, 4))
    grad = np.full((3, 4), 7.0)
    e = _refused("kernel-bad-argument", K.softmax_xent, grad, logits, np.array([0, 4, 1]))
    assert e.context["index"] == 1 and "labels[1] = 4" in e.message
    _refused("kernel-bad-argument", K.softmax_xent, grad, logits, np.array([0, -1, 1]))
    assert (grad == 7.0).all()
    _refused("dtype-invalid", K.softmax_xent, grad, logits, np.array([0.0, 1.0, 2.0]))
    _refused("kernel-bad-argument", K.softmax_xent, grad, logits, np.array([0, 1]))
    assert K.softmax_xent(grad, logits, np.array([0, 3, 1], dtype=np.int32)) == 3 * O.log(4.0)


def test_an_unavailable_isa_path_is_refused_by_name():
    missing = [p for p in PATHS if p not in K.isa_paths()]
    before = K.isa_path()
    for name in [*missing, "avx1024"]:
        e = _refused("kernel-isa-unavailable", K.select_isa_path, name)
        assert repr(name) in e.message and e.context["available"] == K.isa_paths()
    assert K.isa_path() == before


def test_alpha_mpi_isa_chooses_the_path_and_a_bad_one_is_refused():
    code = "from alpha_mpi import kernel; print(kernel.isa_path())"
    env = {"PATH": "/usr/bin:/bin"}
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**env, "ALPHA_MPI_ISA": "generic"}
    )
    assert r.stdout.strip() == "generic", r.stderr
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**env, "ALPHA_MPI_ISA": "avx1024"}
    )
    assert r.returncode != 0 and "kernel-isa-unavailable" in r.stderr and "ALPHA_MPI_ISA=avx1024" in r.stderr


# ----------------------------------------------------------------------------- ops


def test_ops_allocate_copy_layouts_and_refuse_other_dtypes():
    rng = np.random.default_rng(2)
    a, b = spread(rng, 6, 5), spread(rng, 5, 4)
    got = ops.matmul(np.asfortranarray(a), b, bias=np.ones(4))
    assert same_bits(got, O.matmul(a, b, [1.0] * 4))
    assert same_bits(ops.matmul_tn(a.T.copy(), b), O.matmul(a, b))
    assert same_bits(ops.matmul_nt(a, b.T.copy()), O.matmul(a, b))
    assert same_bits(ops.col_sum(b), O.col_sum(b))
    loss, grad = ops.softmax_cross_entropy(b, [0, 1, 2, 3, 0])
    assert same_bits([loss], [O.softmax_xent(b, [0, 1, 2, 3, 0])[0]])
    assert same_bits(ops.exp(a), [O.exp(v) for v in a.ravel()])
    assert same_bits(ops.log(np.abs(a)), [O.log(v) for v in np.abs(a).ravel()])
    assert same_bits(ops.relu_backward(a, a), O.relu_backward(a, a))
    out = np.empty((6, 4))
    assert ops.matmul(a, b, out=out) is out
    _refused("dtype-invalid", ops.matmul, a.astype(np.float32), b)
    _refused("dtype-invalid", ops.exp, [1, 2, 3])
    _refused("kernel-bad-argument", ops.matmul, a, b, out=np.empty((4, 6)))
    _refused("kernel-bad-argument", ops.col_sum, np.ones(3))


# ----------------------------------------------------------------------------- the embedded MLP


def oracle_mlp(model, params, X, y):
    """The MLP's loss and gradient composed from the oracle's operations (the model's maths)."""
    v = model.views(params)
    z1 = O.matmul(X, v["W1"], v["b1"])
    a1 = [O.relu(row) for row in z1]
    loss, d = O.softmax_xent(np.array(O.matmul(a1, v["W2"], v["b2"])), y)
    gW2 = O.matmul_tn(a1, d)
    gb2 = O.col_sum(d)
    da1 = O.matmul_nt(d, v["W2"])
    da1 = [O.relu_backward(g, z) for g, z in zip(da1, z1)]
    gW1 = O.matmul_tn(X, da1)
    gb1 = O.col_sum(da1)
    flat = [v for row in gW1 for v in row] + gb1 + [v for row in gW2 for v in row] + gb2
    return loss, flat


def test_the_mlp_is_computed_by_the_fixed_order_kernels_only():
    model = MLP(9, 13, 5)
    assert MLP.machine_independent is True and BlasMLP.machine_independent is False
    rng = np.random.default_rng(4)
    params = model.init(1)
    params += spread(rng, model.n_params, decades=1) * 1e-2  # biases not zero either
    X, y = spread(rng, 7, 9, decades=2), rng.integers(0, 5, 7)
    grad = np.full(model.n_params, np.nan)
    loss = model.loss_and_grad_sum(params, X, y, grad)
    want_loss, want_grad = oracle_mlp(model, params, X, y)
    assert same_bits([loss], [want_loss]) and same_bits(grad, want_grad)
    # numpy/BLAS computes the same maths with other bits (the difference this model removes)
    blas = np.full(model.n_params, np.nan)
    blas_loss = BlasMLP(9, 13, 5).loss_and_grad_sum(params, X, y, blas)
    assert np.allclose(blas, grad, rtol=1e-9, atol=1e-12) and math.isclose(blas_loss, loss, rel_tol=1e-12)
    assert not same_bits(blas, grad)
    labels = model.predict(params, X)
    logits = O.matmul(
        [O.relu(r) for r in O.matmul(X, model.views(params)["W1"], model.views(params)["b1"])],
        model.views(params)["W2"],
        model.views(params)["b2"],
    )
    assert labels.tolist() == [int(np.argmax(r)) for r in logits]
