"""The C kernel against the independent oracle, bit for bit (single process, fast).

Bits are compared as uint64 (NaNs by class: both NaN counts as equal). Data mix
subnormals, huge and tiny magnitudes, signed zeros and mixed signs, chosen so that a
different order of additions changes the bits (asserted, not assumed).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alpha_mpi import kernel as K
from alpha_mpi import oracle as O
from alpha_mpi.refusals import KernelRefusal
from alpha_mpi_verify import fpenv

ROOT = Path(__file__).resolve().parents[1]
N = 100_000


# ----------------------------------------------------------------------------- helpers


def mixed(rng, n, *, finite_sum_safe=False):
    """float64 data mixing normal values of many scales, subnormals, +-0, huge and tiny
    magnitudes and near-cancelling values."""
    kind = rng.integers(0, 8, n)
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    x = rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3, n)
    sub = (rng.integers(1, 2**52, n, dtype=np.uint64)).view(np.float64) * sign  # subnormals
    big = sign * 10.0 ** rng.uniform(
        250 if not finite_sum_safe else 200, 300 if not finite_sum_safe else 280, n
    )
    tiny = sign * 10.0 ** rng.uniform(-307, -290, n)
    one = sign * (1.0 + rng.integers(0, 2**20, n) * 2.0**-52)  # ulp-level differences near 1
    eps = sign * 2.0 ** rng.integers(-60, -40, n).astype(np.float64)
    zero = np.where(rng.random(n) < 0.5, -0.0, 0.0)
    out = np.select(
        [kind == 0, kind == 1, kind == 2, kind == 3, kind == 4, kind == 5, kind == 6],
        [x, sub, big, tiny, one, eps, zero],
        default=x,
    )
    return np.ascontiguousarray(out, dtype=np.float64)


def u64(a):
    return np.asarray(a, dtype=np.float64).view(np.uint64)


def assert_bits(kernel_out, oracle_list):
    got = np.asarray(kernel_out, dtype=np.float64)
    want = np.array(oracle_list, dtype=np.float64)
    assert got.shape == want.shape
    nan_g, nan_w = np.isnan(got), np.isnan(want)
    assert np.array_equal(nan_g, nan_w), f"NaN class differs at {np.flatnonzero(nan_g != nan_w)[:5]}"
    diff = np.flatnonzero((got.view(np.uint64) != want.view(np.uint64)) & ~nan_g)
    assert diff.size == 0, (
        f"{diff.size} elements differ, first {diff[:5]}: {got[diff[:3]]} vs {want[diff[:3]]}"
    )


class Leaf:
    def __init__(self, slot):
        self.slot = slot


class Branch:
    def __init__(self, left, right):
        self.left, self.right = left, right


def postfix(tree):
    """tree -> kernel program (slot = input index); iterative."""
    prog, stack = [], [(tree, False)]
    while stack:
        node, done = stack.pop()
        if isinstance(node, Leaf):
            prog.append(node.slot)
        elif done:
            prog.append(K.OP_ADD)
        else:
            stack += [(node, True), (node.right, False), (node.left, False)]
    return prog


def left_chain(slots):
    t = Leaf(slots[0])
    for s in slots[1:]:
        t = Branch(t, Leaf(s))
    return t


def balanced(slots):
    if len(slots) == 1:
        return Leaf(slots[0])
    h = len(slots) // 2
    return Branch(balanced(slots[:h]), balanced(slots[h:]))


# ----------------------------------------------------------------------------- combines


def test_add_matches_oracle_and_alias():
    rng = np.random.default_rng(1)
    a, b = mixed(rng, N), mixed(rng, N)
    out = np.empty(N)
    K.add(out, a, b)
    want = O.add(a, b)
    assert_bits(out, want)
    # out is left / out is right
    a2 = a.copy()
    K.add(a2, a2, b)
    assert_bits(a2, want)
    b2 = b.copy()
    K.add(b2, a, b2)
    assert_bits(b2, want)


def test_add_preserves_subnormals():
    tiny = np.array([5e-324, 2.2250738585072009e-308, -1e-310, 1e-320], dtype=np.float64)
    out = np.empty(4)
    K.add(out, tiny, tiny)
    assert_bits(out, O.add(tiny, tiny))
    assert np.all(out != 0.0)
    assert u64(out)[0] == 2  # 2 * smallest subnormal, exactly


def test_tree_eval_matches_oracle_and_order_is_observable():
    rng = np.random.default_rng(2)
    k = 8
    xs = [mixed(rng, N) for _ in range(k)]
    values = dict(enumerate(xs))
    out = np.empty(N)
    shapes = {
        "chain": left_chain(list(range(k))),
        "balanced": balanced(list(range(k))),
        "right": Branch(Leaf(0), Branch(Leaf(1), Branch(Leaf(2), balanced(list(range(3, k)))))),
        "permuted": balanced([3, 1, 7, 0, 5, 2, 6, 4]),
    }
    results = {}
    for name, tree in shapes.items():
        K.tree_eval(out, xs, postfix(tree))
        assert_bits(out, O.evaluate(tree, values))
        results[name] = out.copy()
    # the order matters on this data: every pair of shapes differs somewhere
    names = list(results)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert np.count_nonzero(u64(results[a]) != u64(results[b])) > 100, (a, b)


@pytest.mark.parametrize("k", [1, 2, 3, 8, 9, 15, 16, 17, 40])
def test_fold_and_chain_program(k):
    rng = np.random.default_rng(k)
    n = 5_000  # several 1024-element blocks plus a tail
    xs = [mixed(rng, n) for _ in range(k)]
    want = O.chain(xs)
    out = np.empty(n)
    K.fold(out, xs)
    assert_bits(out, want)
    out2 = np.empty(n)
    prog = [0] + [x for j in range(1, k) for x in (j, -1)]
    K.tree_eval(out2, xs, prog)
    assert_bits(out2, want)
    # out is an input (first, middle, last)
    for j in {0, k // 2, k - 1}:
        ys = [x.copy() for x in xs]
        K.fold(ys[j], ys)
        assert_bits(ys[j], want)
        ys = [x.copy() for x in xs]
        K.tree_eval(ys[j], ys, prog)
        assert_bits(ys[j], want)


def test_fold_large_matches_oracle():
    rng = np.random.default_rng(7)
    xs = [mixed(rng, N) for _ in range(4)]
    out = np.empty(N)
    K.fold(out, xs)
    want = O.chain(xs)
    assert_bits(out, want)
    K.fold(out, xs[::-1])
    assert np.count_nonzero(u64(out) != u64(np.array(want))) > 100  # order observable


def test_tree_eval_general_alias_every_input():
    rng = np.random.default_rng(3)
    n = 3_000
    k = 6
    xs = [mixed(rng, n) for _ in range(k)]
    tree = Branch(balanced([0, 1, 2]), Branch(Leaf(3), Branch(Leaf(4), Leaf(5))))
    want = O.evaluate(tree, dict(enumerate(xs)))
    for j in range(k):
        ys = [x.copy() for x in xs]
        K.tree_eval(ys[j], ys, postfix(tree))
        assert_bits(ys[j], want)


def test_tree_eval_input_used_twice_and_single_leaf():
    rng = np.random.default_rng(4)
    xs = [mixed(rng, 2_000) for _ in range(2)]
    out = np.empty(2_000)
    K.tree_eval(out, xs, [0, 1, -1, 0, -1])
    assert_bits(out, O.add(O.add(xs[0], xs[1]), xs[0]))
    K.tree_eval(out, xs, [1])
    assert_bits(out, xs[1].tolist())
    K.tree_eval(xs[1], xs, np.array([1], dtype=np.int32))
    assert_bits(xs[1], out.tolist())


def test_deep_chain_1000_leaves():
    rng = np.random.default_rng(5)
    k, n = 1000, 64
    xs = [mixed(rng, n) for _ in range(k)]
    tree = left_chain(list(range(k)))  # the oracle walks it iteratively
    out = np.empty(n)
    K.tree_eval(out, xs, postfix(tree))
    assert_bits(out, O.evaluate(tree, dict(enumerate(xs))))


def test_oracle_accepts_model_trees():
    tree_mod = pytest.importorskip("alpha_mpi.model.tree")
    try:
        t = tree_mod.Branch(tree_mod.Branch(tree_mod.Leaf(0), tree_mod.Leaf(1)), tree_mod.Leaf(2))
    except Exception as exc:  # the model's constructor may want more
        pytest.skip(f"model tree constructor differs: {exc}")
    vals = {0: [1.0, 2.0], 1: [1e-16, -0.0], 2: [-1.0, 3.0]}
    assert O.evaluate(t, vals) == [(1.0 + 1e-16) + -1.0, (2.0 + -0.0) + 3.0]


@st.composite
def trees(draw):
    k = draw(st.integers(1, 12))
    slots = draw(st.permutations(range(k)))
    # random shape: repeatedly join two adjacent subtrees
    nodes = [Leaf(s) for s in slots]
    while len(nodes) > 1:
        i = draw(st.integers(0, len(nodes) - 2))
        nodes[i : i + 2] = [Branch(nodes[i], nodes[i + 1])]
    return k, nodes[0]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees(), st.integers(1, 2_600), st.integers(0, 2**32 - 1), st.booleans())
def test_random_tree_programs(kt, n, seed, alias):
    k, tree = kt
    rng = np.random.default_rng(seed)
    xs = [mixed(rng, n) for _ in range(k)]
    want = O.evaluate(tree, dict(enumerate(xs)))
    if alias:
        j = seed % k
        K.tree_eval(xs[j], xs, postfix(tree))
        assert_bits(xs[j], want)
    else:
        out = np.empty(n)
        K.tree_eval(out, xs, postfix(tree))
        assert_bits(out, want)


@pytest.mark.parametrize(
    "prog,k",
    [
        ([], 2),
        ([0, -1], 2),
        ([0, 1], 2),
        ([5], 2),
        ([0, -2], 2),
        ([0, 1, -1, -1], 2),
        ([0, 1, 2**40, -1], 3),
        ([0.0, 1.0, -1.0], 2),
        ([[0, 1, -1]], 2),
        ([0] * 65 + [-1] * 64, 1),  # depth 65
    ],
)
def test_bad_programs_refused(prog, k):
    xs = [np.zeros(4) for _ in range(k)]
    with pytest.raises(KernelRefusal) as e:
        K.tree_eval(np.empty(4), xs, prog)
    assert e.value.code == "kernel-bad-program"


def test_program_depth():
    assert K.check_program([0] + [1, -1] * 100, 2) == 2
    assert K.check_program([0] * 64 + [-1] * 63, 1) == 64


def test_bad_arguments_refused():
    a = np.zeros(8)
    with pytest.raises(KernelRefusal) as e:
        K.add(np.empty(7), a, a)
    assert e.value.code == "kernel-bad-argument"
    with pytest.raises(KernelRefusal) as e:
        K.add(np.empty(8, dtype=np.float32), a, a)
    assert e.value.code == "dtype-invalid"
    with pytest.raises(KernelRefusal) as e:
        K.add(np.empty(8), a.astype(">f8"), a)
    assert e.value.code == "dtype-invalid"
    with pytest.raises(KernelRefusal) as e:
        K.add(np.empty(16)[::2], a, a)
    assert e.value.code == "kernel-bad-argument"
    ro = np.zeros(8)
    ro.flags.writeable = False
    with pytest.raises(KernelRefusal) as e:
        K.add(ro, a, a)
    assert e.value.code == "kernel-bad-argument"
    buf = np.zeros(9)
    with pytest.raises(KernelRefusal) as e:  # partial overlap
        K.add(buf[1:], buf[:8], a)
    assert e.value.code == "kernel-bad-argument"
    with pytest.raises(KernelRefusal) as e:
        K.tree_eval(buf[1:], [buf[:8], a], [0, 1, -1])
    assert e.value.code == "kernel-bad-argument"
    with pytest.raises(KernelRefusal) as e:
        K.fold(np.empty(8), [])
    assert e.value.code == "kernel-bad-argument"


def test_first_nonfinite():
    x = np.linspace(-1, 1, 5000)
    assert K.first_nonfinite(x) == -1
    assert K.first_nonfinite(np.empty(0)) == -1
    for bad in (np.nan, np.inf, -np.inf):
        for i in (0, 1023, 1024, 2500, 4999):
            y = x.copy()
            y[i] = bad
            y[-1] = bad
            assert K.first_nonfinite(y) == i
    sub = np.array([5e-324, -0.0, 1.7976931348623157e308])
    assert K.first_nonfinite(sub) == -1


# ----------------------------------------------------------------------------- Adam

HP = dict(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8)


def adam_data(rng, n):
    p = rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 2, n)
    m = rng.standard_normal(n) * 10.0 ** rng.uniform(-8, 0, n)
    v = np.abs(rng.standard_normal(n)) * 10.0 ** rng.uniform(-12, 0, n)
    g = rng.standard_normal(n) * 10.0 ** rng.uniform(-10, 3, n)
    k = rng.integers(0, 10, n)
    sub = rng.integers(1, 2**52, n, dtype=np.uint64).view(np.float64)
    g = np.where(k == 0, sub * np.sign(g), g)  # subnormal gradients
    g = np.where(k == 1, np.where(rng.random(n) < 0.5, -0.0, 0.0), g)
    m = np.where(k == 2, sub, m)
    v = np.where(k == 3, 0.0, v)
    p = np.where(k == 4, -0.0, p)
    g = np.where(k == 5, g * 1e100, g)  # large but g*g finite
    v = np.where(k == 6, sub, v)
    return [np.ascontiguousarray(a) for a in (p, m, v, g)]


def bias(t, b1=0.9, b2=0.999):
    b1t = b2t = 1.0
    for _ in range(t):
        b1t *= b1
        b2t *= b2
    return b1t, b2t


def test_adam_matches_oracle():
    rng = np.random.default_rng(10)
    p, m, v, g = adam_data(rng, N)
    outs = [np.empty(N) for _ in range(3)]
    for t in (1, 7):
        b1t, b2t = bias(t)
        K.adam_step(p, m, v, g, *outs, b1t=b1t, b2t=b2t, **HP)
        wp, wm, wv = O.adam(p, m, v, g, b1t=b1t, b2t=b2t, **HP)
        assert_bits(outs[0], wp)
        assert_bits(outs[1], wm)
        assert_bits(outs[2], wv)
    # the reciprocal-square-root route (1/sqrt then multiply) gives other bits here
    c1, c2, bc1, bc2 = 1 - 0.9, 1 - 0.999, 1 - b1t, 1 - b2t
    m1 = 0.9 * m + c1 * g
    v1 = 0.999 * v + c2 * (g * g)
    rs = p - (1e-3 * (m1 / bc1)) * (1.0 / (np.sqrt(v1 / bc2) + 1e-8))
    assert np.count_nonzero(u64(rs) != u64(outs[0])) > 100
    # a fused multiply-add for m' would too: emulate with exact rationals on a sample
    from fractions import Fraction

    diff = 0
    for i in range(2_000):
        exact = Fraction(0.9) * Fraction(m[i]) + Fraction(c1) * Fraction(g[i])
        diff += float(exact) != outs[1][i]
    assert diff > 0


def test_adam_inplace_variants_match():
    rng = np.random.default_rng(11)
    p, m, v, g = adam_data(rng, 20_000)
    b1t, b2t = bias(3)
    outs = [np.empty_like(p) for _ in range(3)]
    K.adam_step(p, m, v, g, *outs, b1t=b1t, b2t=b2t, **HP)
    s = [a.copy() for a in (p, m, v)]
    K.adam_step_inplace_checked(*s, g, b1t=b1t, b2t=b2t, **HP)
    for a, b in zip(s, outs):
        assert np.array_equal(u64(a), u64(b))
    s = [a.copy() for a in (p, m, v)]
    K.adam_step(s[0], s[1], s[2], g, s[0], s[1], s[2], b1t=b1t, b2t=b2t, allow_inplace=True, **HP)
    for a, b in zip(s, outs):
        assert np.array_equal(u64(a), u64(b))
    with pytest.raises(KernelRefusal) as e:  # in place without saying so
        K.adam_step(p, m, v, g, p, m, v, b1t=b1t, b2t=b2t, **HP)
    assert e.value.code == "kernel-bad-argument"
    with pytest.raises(KernelRefusal) as e:  # output on top of g
        K.adam_step(p, m, v, g, g, outs[1], outs[2], b1t=b1t, b2t=b2t, allow_inplace=True, **HP)
    assert e.value.code == "kernel-bad-argument"


def _oracle_verdict(fn):
    try:
        fn()
    except O.OracleRefusal as r:
        return r
    return None


NADAM = 3_000  # first / middle / last fall in different 1024-element blocks


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("arr", ["p", "m", "v", "g"])
def test_adam_refuses_nonfinite_input_state_untouched(arr, bad):
    rng = np.random.default_rng(12)
    b1t, b2t = bias(2)
    for pos in (0, NADAM // 2, NADAM - 1):
        p, m, v, g = adam_data(rng, NADAM)
        d = dict(p=p, m=m, v=v, g=g)
        d[arr][pos] = bad
        before = {k: u64(a).copy() for k, a in d.items()}
        outs = [np.empty(NADAM) for _ in range(3)]
        with pytest.raises(KernelRefusal) as e:
            K.adam_step(p, m, v, g, *outs, b1t=b1t, b2t=b2t, **HP)
        assert e.value.code == "non-finite-input"
        assert e.value.context["index"] == pos and e.value.context["array"] == arr
        for k, a in d.items():
            assert np.array_equal(u64(a), before[k])
        r = _oracle_verdict(lambda p=p, m=m, v=v, g=g: O.adam(p, m, v, g, b1t=b1t, b2t=b2t, **HP))
        assert (r.code, r.array, r.index) == ("non-finite-input", arr, pos)
        # the in-place checked variant leaves the state alone as well
        with pytest.raises(KernelRefusal) as e:
            K.adam_step_inplace_checked(p, m, v, g, b1t=b1t, b2t=b2t, **HP)
        assert e.value.code == "non-finite-input" and e.value.context["index"] == pos
        for k, a in d.items():
            assert np.array_equal(u64(a), before[k])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("name", ["lr", "b1", "b2", "eps", "b1t", "b2t"])
def test_adam_refuses_nonfinite_scalar(name, bad):
    rng = np.random.default_rng(13)
    p, m, v, g = adam_data(rng, 100)
    before = [u64(a).copy() for a in (p, m, v)]
    b1t, b2t = bias(1)
    kw = dict(HP, b1t=b1t, b2t=b2t)
    kw[name] = bad
    with pytest.raises(KernelRefusal) as e:
        K.adam_step(p, m, v, g, *[np.empty(100) for _ in range(3)], **kw)
    assert e.value.code == "non-finite-input" and e.value.context["array"] == name
    assert all(np.array_equal(u64(a), b) for a, b in zip((p, m, v), before))
    assert _oracle_verdict(lambda: O.adam(p, m, v, g, **kw)).array == name


@pytest.mark.parametrize(
    "case,expect_array",
    [
        ("lr_overflow", "p_out"),  # lr*mhat/den overflows p'
        ("g_squared", "intermediate"),  # g*g = inf
        ("b1t_one", "intermediate"),  # 1 - b1t = 0 -> mhat inf
        ("eps_zero", "p_out"),  # v = g = m = 0, eps = 0 -> den = 0 -> p - 0/0
        ("vhat_only", "intermediate"),  # vhat = inf, p' would silently equal p
        ("m_overflow", "m_out"),
    ],
)
def test_adam_refuses_nonfinite_output_state_untouched(case, expect_array):
    rng = np.random.default_rng(14)
    n = NADAM
    p, m, v, g = adam_data(rng, n)
    b1t, b2t = bias(5)
    kw = dict(HP, b1t=b1t, b2t=b2t)
    pos = 1500
    if case == "lr_overflow":
        m[pos], g[pos], v[pos] = 1e306, 0.0, 0.0  # mhat finite, mhat*lr/eps = 2e311
    elif case == "g_squared":
        g[pos] = 1e200
    elif case == "b1t_one":
        kw["b1t"] = 1.0
        pos = 0
    elif case == "eps_zero":
        kw["eps"] = 0.0
        m[pos] = g[pos] = v[pos] = 0.0
        # other elements must not trip first: give them a non-zero v
        v[:pos] = np.maximum(v[:pos], 1e-30)
        g[:pos] = np.where(g[:pos] == 0, 1e-3, g[:pos])
    elif case == "vhat_only":
        kw["b2t"] = 0.9999999999999999  # 1 - b2t = 1.1e-16
        v = np.zeros(n)
        v[pos] = 1e300
        g = np.zeros(n)
        m = np.zeros(n)
    elif case == "m_overflow":
        kw["b1"] = 1e10
        m, g = np.zeros(n), np.zeros(n)
        m[pos] = 1e300
    d = dict(p=p, m=m, v=v, g=g)
    before = {k: u64(a).copy() for k, a in d.items()}
    r = _oracle_verdict(lambda: O.adam(p, m, v, g, **kw))
    assert r is not None and r.code == "non-finite-output"
    with pytest.raises(KernelRefusal) as e:
        K.adam_step(p, m, v, g, *[np.empty(n) for _ in range(3)], **kw)
    assert e.value.code == "non-finite-output"
    assert (e.value.context["array"], e.value.context["index"]) == (r.array, r.index)
    assert r.array == expect_array and r.index == pos
    for k, a in d.items():
        assert np.array_equal(u64(a), before[k])


# ----------------------------------------------------------------------------- SGD


@pytest.mark.parametrize("mu", [0.0, 0.9])
def test_sgd_matches_oracle(mu):
    rng = np.random.default_rng(20)
    p, buf, _, g = adam_data(rng, N)
    po, bo = np.empty(N), np.full(N, 7.0)
    K.sgd_step(p, buf, g, po, bo, lr=0.01, momentum=mu)
    wp, wb = O.sgd(p, buf, g, 0.01, mu)
    assert_bits(po, wp)
    if mu:
        assert_bits(bo, wb)
    else:
        assert np.all(bo == 7.0)  # buf_out untouched when momentum == 0
        K.sgd_step(p, None, g, po, None, lr=0.01, momentum=0.0)
        assert_bits(po, wp)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("arr", ["p", "buf", "g"])
def test_sgd_refuses_nonfinite_state_untouched(arr, bad):
    rng = np.random.default_rng(21)
    n = 3_000
    for pos in (0, n // 2, n - 1):
        p, buf, _, g = adam_data(rng, n)
        d = dict(p=p, buf=buf, g=g)
        d[arr][pos] = bad
        before = {k: u64(a).copy() for k, a in d.items()}
        with pytest.raises(KernelRefusal) as e:
            K.sgd_step(p, buf, g, np.empty(n), np.empty(n), lr=0.01, momentum=0.9)
        assert e.value.code == "non-finite-input"
        assert (e.value.context["array"], e.value.context["index"]) == (arr, pos)
        r = _oracle_verdict(lambda p=p, buf=buf, g=g: O.sgd(p, buf, g, 0.01, 0.9))
        assert (r.code, r.array, r.index) == ("non-finite-input", arr, pos)
        for k, a in d.items():
            assert np.array_equal(u64(a), before[k])
    with pytest.raises(KernelRefusal) as e:
        K.sgd_step(p, buf, g, np.empty(n), np.empty(n), lr=bad, momentum=0.9)
    assert e.value.context["array"] == "lr"


def test_sgd_output_overflow_refused():
    p = np.ones(10)
    g = np.ones(10)
    g[4] = 1e300
    with pytest.raises(KernelRefusal) as e:
        K.sgd_step(p, None, g, np.empty(10), None, lr=1e10, momentum=0.0)
    r = _oracle_verdict(lambda: O.sgd(p, None, g, 1e10, 0.0))
    assert e.value.code == r.code == "non-finite-output"
    assert e.value.context["index"] == r.index == 4
    with pytest.raises(KernelRefusal) as e:
        K.sgd_step(p, None, g, np.empty(10), None, lr=0.1, momentum=0.9)
    assert e.value.code == "kernel-bad-argument"


# ----------------------------------------------------------------------------- conversions


def test_widen_binary32_exact():
    rng = np.random.default_rng(30)
    b = rng.integers(0, 2**32, N, dtype=np.uint64).astype(np.uint32)
    b[:6] = [0, 0x80000000, 1, 0x7F800000, 0xFF800000, 0x7FC00001]
    x32 = b.view(np.float32)
    out = np.empty(N)
    K.widen_binary32(out, x32)
    assert_bits(out, O.widen(b))


def test_round_binary64_nearest_even():
    rng = np.random.default_rng(31)
    f = rng.integers(0, 0x7F800000, N, dtype=np.int64).astype(np.uint32).view(np.float32)
    lo = f.astype(np.float64)
    hi = np.nextafter(f, np.float32(np.inf)).astype(np.float64)
    kind = rng.integers(0, 3, N)
    frac = rng.random(N)
    x = np.where(kind == 0, lo + (hi - lo) * 0.5, lo + (hi - lo) * frac)  # exact ties, random
    x = np.where(kind == 2, lo, x)
    x = np.where(rng.random(N) < 0.5, -x, x)
    x = np.where(np.isfinite(x), x, 0.0)
    x[:4] = [2.0**-150, 3 * 2.0**-150, 3.4028235677973362e38, -1e-320]
    out = np.empty(N, dtype=np.float32)
    K.round_binary64(out, x)
    assert np.array_equal(out.view(np.uint32), np.array(O.narrow(x), dtype=np.uint32))
    assert np.count_nonzero(kind == 0) > 1000


@pytest.mark.parametrize("pos", [0, 1500, 2999])
def test_round_binary64_refusals(pos):
    x = np.linspace(-1e30, 1e30, 3000)
    y = x.copy()
    y[pos] = 3.4028235677973366e38  # rounds to Inf
    with pytest.raises(KernelRefusal) as e:
        K.round_binary64(np.empty(3000, dtype=np.float32), y)
    r = _oracle_verdict(lambda: O.narrow(y))
    assert e.value.code == r.code == "non-finite-output" and e.value.context["index"] == r.index == pos
    y = x.copy()
    y[pos] = np.nan
    with pytest.raises(KernelRefusal) as e:
        K.round_binary64(np.empty(3000, dtype=np.float32), y)
    r = _oracle_verdict(lambda: O.narrow(y))
    assert e.value.code == r.code == "non-finite-input" and e.value.context["index"] == r.index == pos


# ----------------------------------------------------------------------------- FP environment


def test_fpenv_on_profile():
    s = K.fpenv_check()
    assert s["on_profile"] and s["rounding_nearest"] and not s["ftz"] and not s["daz"]


@pytest.mark.skipif(K.fpenv_state()["arch"] not in ("x86_64", "aarch64"), reason="no FTZ/DAZ control here")
@pytest.mark.parametrize(
    "ftz,daz,word", [(1, 0, "flush-to-zero"), (0, 1, "denormals-are-zero"), (1, 1, "flush-to-zero")]
)
def test_fpenv_refuses_ftz_daz(ftz, daz, word):
    before = K.fpenv_state()
    try:
        fpenv.set_ftz_daz(ftz, daz)
        with pytest.raises(KernelRefusal) as e:
            K.fpenv_check()
        assert e.value.code == "fp-environment-off-profile"
        assert word in e.value.message and "0x" in e.value.message
        if ftz and before["arch"] == "x86_64":
            # why it matters: the subnormal sum flushes to zero
            out = np.empty(1)
            K.add(out, np.array([5e-324]), np.array([5e-324]))
            assert out[0] == 0.0
    finally:
        fpenv.set_ftz_daz(before["ftz"], before["daz"])
    assert K.fpenv_check()["on_profile"]


# ----------------------------------------------------------------------------- build


@pytest.mark.parametrize(
    "extra",
    [
        "-ffast-math",
        "-O2 -Ofast",
        "-ffp-contract=fast",
        "-ffp-contract=on",
        "-funsafe-math-optimizations",
        "-mlow-precision-recip-sqrt",
        "-freciprocal-math",
        "-ffinite-math-only",
        "-fassociative-math",
        "-mrecip",
    ],
)
def test_build_refuses_fast_math(extra):
    from alpha_mpi.kernel import build as kb

    with pytest.raises(KernelRefusal) as e:
        kb.cflags({"ALPHA_MPI_CFLAGS": extra})
    assert e.value.code == "fast-math-refused"


def test_build_allows_value_safe_flags():
    from alpha_mpi.kernel import build as kb

    flags = kb.cflags({"ALPHA_MPI_CFLAGS": "-march=native -g -fno-associative-math"})
    assert flags[: len(kb.BASE_CFLAGS)] == kb.BASE_CFLAGS and "-march=native" in flags
    assert "-ffp-contract=off" in kb.BASE_CFLAGS


def test_build_script_stops_with_code():
    env = dict(os.environ, ALPHA_MPI_CFLAGS="-ffast-math")
    r = subprocess.run(
        [sys.executable, str(ROOT / "alpha_mpi" / "kernel" / "build.py")],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert r.returncode != 0 and "fast-math-refused" in r.stderr


def test_build_info_identity():
    from alpha_mpi.kernel import build as kb

    info = K.build_info()
    assert "-ffp-contract=off" in info["flags"] and "-ffast-math" not in info["flags"]
    assert len(info["build_id"]) == 64
    if (kb.KERNEL_DIR / "alpha_kernel.c").exists():
        assert info["build_id"] == kb.build_id(info["flags"]), (
            "compiled kernel is stale: rebuild (pip install -e .)"
        )


def test_build_refuses_fast_math_in_cflags_too():
    from alpha_mpi.kernel import build as kb

    with pytest.raises(KernelRefusal) as e:
        kb.cflags({"CFLAGS": "-O2 -ffast-math"})
    assert e.value.code == "fast-math-refused" and "CFLAGS" in e.value.message
