"""alpha_mpi.arrays in one process: the tree, the schedule, the verdicts, the kernel's summaries
and merges, and the API on COMM_SELF, all compared bit for bit with tests/array_oracle.py.

Decomposition independence is shown here without MPI: any cut of [0, n) into blocks, summarized
by the kernel and merged in any order, gives the oracle's bits. The MPI suite
(test_arrays_mpi.py) then shows the exchange delivers exactly that on every rank.
"""

import math

import numpy as np
import pytest
from array_oracle import oracle_dot, oracle_norm2, oracle_sum, pairwise, sequential_sum
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alpha_mpi.arrays import local
from alpha_mpi.arrays import pairwise as pw
from alpha_mpi.planning import array_program as ap
from alpha_mpi.planning.check import check
from alpha_mpi.refusals import PlanRefusal, Refusal

from conftest import order_sensitive

NS = [1, 2, 3, 1000, 2**20 + 7]
_DATA: dict = {}
_ORACLE: dict = {}


def data(n, seed=0):
    key = (n, seed)
    if key not in _DATA:
        rng = np.random.default_rng(1000 + n + 7919 * seed)
        _DATA[key] = (order_sensitive(rng, n), order_sensitive(rng, n))
    return _DATA[key]


def oracle(op, n, seed=0):
    key = (op, n, seed)
    if key not in _ORACLE:
        x, y = data(n, seed)
        _ORACLE[key] = {
            "sum": lambda: oracle_sum(x.tolist()),
            "dot": lambda: oracle_dot(x.tolist(), y.tolist()),
            "dotyy": lambda: oracle_dot(y.tolist(), y.tolist()),
            "norm2": lambda: oracle_norm2(x.tolist()),
        }[op]()
    return _ORACLE[key]


def f64bits(v):
    return np.float64(v).view(np.uint64)


@st.composite
def cuts(draw, n, max_blocks=6):
    """Block boundaries 0 = c0 <= c1 <= ... <= ck = n (empty blocks allowed) and a merge order."""
    k = draw(st.integers(1, max_blocks))
    inner = sorted(draw(st.lists(st.integers(0, n), min_size=k - 1, max_size=k - 1)))
    bounds = [0] + inner + [n]
    order = draw(st.permutations(range(k)))
    return bounds, order


# ----------------------------------------------------------------------------- the tree


def test_split_rule_and_nodes():
    assert pw.split(0, 2) == 1 and pw.split(0, 3) == 2 and pw.split(0, 8) == 4 and pw.split(0, 9) == 8
    assert pw.split(8, 11) == 10
    # every node reached from the root by the split rule is a node, and nothing else of [0, n) is
    for n in range(1, 40):
        seen, todo = set(), [(0, n)]
        while todo:
            lo, hi = todo.pop()
            seen.add((lo, hi))
            if hi - lo > 1:
                m = pw.split(lo, hi)
                todo += [(lo, m), (m, hi)]
        assert seen == {(a, b) for a in range(n) for b in range(a + 1, n + 1) if pw.is_node(a, b, n)}, n


@given(n=st.integers(1, 1 << 62), data=st.data())
def test_summary_ranges_are_nodes_and_bounded(n, data):
    offset = data.draw(st.integers(0, n - 1))
    length = data.draw(st.integers(0, n - offset))
    rs = pw.summary_ranges(offset, length, n)
    assert len(rs) <= 2 * 63 + 1
    assert all(pw.is_node(a, b, n) for a, b in rs)
    assert all(b == c for (_, b), (c, _) in zip(rs, rs[1:]))
    assert (rs[0][0], rs[-1][1]) == (offset, offset + length) if length else rs == []


@given(n=st.integers(1, 1 << 62), data=st.data())
def test_two_runs_fit_the_capacity(n, data):
    """The bound the frame capacity rests on: a window of rank-ordered blocks is at most two
    runs (it wraps around at most once), [a, n) and [0, b) or one [a, b)."""
    a = data.draw(st.integers(0, n))
    b = data.draw(st.integers(0, a))
    both = pw.merge_ranges(pw.summary_ranges(a, n - a, n) + pw.summary_ranges(0, b, n), n)
    assert len(both) <= 2 * 64 + 1 <= pw.CAPACITY


def test_schedule_and_simulation_at_every_size():
    for p in range(1, 34):
        assert len(ap.schedule(p, 0)) == ap.rounds(p) == (math.ceil(math.log2(p)) if p > 1 else 0)
        assert pw.simulate(p)[p - 1] == [p - 1, *range(p - 1)]
        rng = np.random.default_rng(p)
        order = tuple(rng.permutation(p).tolist())
        assert pw.simulate(p, order)[order[0]] == list(order)
    r = ap.schedule(5, 3)[2]
    assert str(r) == "R2 >4 <2 g1" and ap.Round.parse(str(r)) == r
    with pytest.raises(PlanRefusal) as e:
        ap.Round.parse("R2 4 2")
    assert e.value.code == "step-parse-error"
    for bad in ((0, 0, 1), (0, 1)):
        with pytest.raises(PlanRefusal) as e:
            pw.simulate(3, bad)
        assert e.value.code == "rank-order-invalid"


def test_the_simulator_refuses_a_broken_exchange():
    """planning.check runs the exchange's Program: a rank that files the rows it receives at
    the wrong table row, or merges a state it never received, is refused by name."""
    prog = pw.exchange_program(4)
    rp = prog.rank(1)
    lands = [i for i, (_, dst) in enumerate(rp.copies) if dst.buf == ap.TABLE]
    copies = list(rp.copies)
    src, dst = copies[lands[1]]  # round 1's two rows land at row 2: put them at row 1 instead
    copies[lands[1]] = (src, dst.sub(-pw.ROW_WORDS, dst.count))
    for broken, says in (
        (rp.replace(copies=tuple(copies)), "rank 1 ends with another row"),
        (rp.replace(merges=(rp.merges[0].replace(b=rp.merges[1].b), *rp.merges[1:])), "holds no value"),
    ):
        with pytest.raises(PlanRefusal) as e:
            check(prog.replace(builder=lambda r, b=broken: b if r == 1 else prog.rank(r)))
        assert e.value.code == "plan-simulation-failed" and says in e.value.message, e.value.message


def test_frame_sizes_depend_on_size_round_and_batch_only():
    assert pw.frame_words(2, 0, 1) == 2 + 4 + pw.CAPACITY * 3
    assert [ap.rows_in_round(5, i) for i in range(3)] == [1, 2, 1]


# ----------------------------------------------------------------------------- verdicts


def rows(*specs):
    return [pw.Row(r, *s) for r, s in enumerate(specs)]


@pytest.mark.parametrize(
    "specs, code",
    [
        ([(0, 4, 10, 0), (5, 5, 10, 0)], "array-coverage-hole"),
        ([(0, 6, 10, 0), (5, 5, 10, 0)], "array-coverage-overlap"),
        ([(0, 4, 10, 0), (4, 5, 10, 0)], "array-coverage-hole"),  # the tail
        ([(0, 5, 10, 0), (5, 5, 11, 0)], "array-length-mismatch"),
        ([(0, 5, 10, 0), (5, 5, 10, pw.STATUS_NONFINITE)], "non-finite-contribution"),
        ([(0, 5, 10, 0), (0, 0, 0, pw.STATUS_REFUSED)], "peer-refused"),
    ],
)
def test_verdicts_name_the_problem(specs, code):
    with pytest.raises(Refusal) as e:
        pw.check_rows(rows(*specs), "dot")
    assert e.value.code == code


def test_verdict_accepts_any_order_and_empty_blocks():
    rs = rows((5, 5, 10, 0), (3, 0, 10, 0), (0, 5, 10, 0))
    pw.check_rows(rs, "dot")
    assert not pw.in_rank_order(rs) and pw.sorted_order(rs) == (2, 0, 1)
    assert pw.in_rank_order(rows((0, 5, 10, 0), (7, 0, 10, 0), (5, 5, 10, 0)))


# ----------------------------------------------------------------------------- the kernel


def test_pairwise_order_is_observable_on_the_test_data():
    for n in (1000, 2**20 + 7):
        x, _ = data(n)
        assert f64bits(sequential_sum(x.tolist())) != f64bits(oracle("sum", n)), "left to right must differ"


@pytest.mark.parametrize("n", NS)
def test_whole_tree_equals_oracle(n):
    x, y = data(n)
    assert f64bits(local.tree_value(x)) == f64bits(oracle("sum", n))
    assert f64bits(local.tree_value(x, y)) == f64bits(oracle("dot", n))


def test_small_sizes_every_length():
    rng = np.random.default_rng(3)
    for n in range(0, 300):
        x, y = order_sensitive(rng, n), order_sensitive(rng, n)
        assert f64bits(local.tree_value(x)) == f64bits(pairwise(x.tolist()))
        assert f64bits(local.tree_value(x, y)) == f64bits(oracle_dot(x.tolist(), y.tolist()))


def merged_root(xs, ys, n, bounds, order):
    """Summarize each block [lo, hi) alone, merge the summaries in `order`, return the root."""
    parts = [
        local.summary([a[lo:hi] for a in xs], None if ys is None else [b[lo:hi] for b in ys], lo, n)
        for lo, hi in zip(bounds, bounds[1:])
    ]
    acc = parts[order[0]]
    for j in order[1:]:
        acc = local.merge(acc, parts[j], n)
    return acc.root()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.sampled_from([1, 2, 3, 1000]), draw=st.data())
def test_any_cut_and_merge_order_gives_the_oracle_bits(n, draw):
    bounds, order = draw.draw(cuts(n))
    x, y = data(n)
    assert f64bits(merged_root([x], None, n, bounds, order)[0]) == f64bits(oracle("sum", n))
    dxy, dyy = merged_root([x, y], [y, y], n, bounds, order)
    assert (f64bits(dxy), f64bits(dyy)) == (f64bits(oracle("dot", n)), f64bits(oracle("dotyy", n)))


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(draw=st.data())
def test_big_n_any_cut(draw):
    n = 2**20 + 7
    bounds, order = draw.draw(cuts(n, max_blocks=5))
    x, y = data(n)
    assert f64bits(merged_root([x], None, n, bounds, order)[0]) == f64bits(oracle("sum", n))
    assert f64bits(merged_root([x], [y], n, bounds, order)[0]) == f64bits(oracle("dot", n))


def test_merge_refuses_partial_overlap_and_overflow():
    x = np.ones(16)
    a = local.summary([x[0:6]], None, 0, 16)
    b = local.summary([x[4:9]], None, 4, 16)
    assert a.ranges() == [(0, 4), (4, 6)] and b.ranges() == [(4, 8), (8, 9)]
    assert local.merge(a, b, 16).ranges() == [(0, 8), (8, 9)]  # the same node twice is kept once
    tail = local.summary([x[:3]], None, 8, 11)  # [8, 11) is a node of the tree over [0, 11) only
    assert tail.ranges() == [(8, 11)]
    with pytest.raises(Refusal) as e:
        local.merge(tail, local.summary([x[:2]], None, 10, 16), 16)
    assert e.value.code == "kernel-bad-argument" and "overlapping" in str(e.value)
    with pytest.raises(Refusal) as e:
        local.summary([np.ones(1000)], None, 1, 1 << 40, capacity=3)
    assert "capacity" in str(e.value)


# ----------------------------------------------------------------------------- the API, p = 1


@pytest.mark.parametrize("n", NS)
def test_api_on_one_rank_equals_oracle(self_comm, n):
    from alpha_mpi import arrays

    x, y = data(n)
    assert f64bits(arrays.sum(self_comm, x, 0, n)) == f64bits(oracle("sum", n))
    assert f64bits(arrays.dot(self_comm, x, y, 0, n)) == f64bits(oracle("dot", n))
    assert f64bits(arrays.norm2(self_comm, x, 0, n)) == f64bits(oracle("norm2", n))
    got = arrays.dots(self_comm, [(x, y), (y, y)], 0, n)
    assert [f64bits(v) for v in got] == [f64bits(oracle("dot", n)), f64bits(oracle("dotyy", n))]


def test_api_empty_vector_and_non_contiguous(self_comm):
    from alpha_mpi import arrays

    assert arrays.sum(self_comm, np.zeros(0), 0, 0) == 0.0
    x = np.arange(20.0)[::2]
    assert arrays.sum(self_comm, x, 0, 10) == pairwise(x.tolist())


@pytest.mark.parametrize(
    "call, code",
    [
        (lambda a, c: a.sum(c, np.ones(4, dtype=np.float32), 0, 4), "dtype-invalid"),
        (lambda a, c: a.sum(c, [1.0, 2.0], 0, 2), "dtype-invalid"),
        (lambda a, c: a.dot(c, np.ones(4), np.ones(3), 0, 4), "array-block-invalid"),
        (lambda a, c: a.sum(c, np.ones((2, 2)), 0, 4), "array-block-invalid"),
        (lambda a, c: a.sum(c, np.ones(4), 1, 4), "array-block-invalid"),
        (lambda a, c: a.sum(c, np.ones(4), -1, 4), "array-block-invalid"),
        (lambda a, c: a.sum(c, np.ones(4), 0.0, 4), "array-block-invalid"),
        (lambda a, c: a.sum(c, np.ones(4), 0, 5), "array-coverage-hole"),
        (lambda a, c: a.dots(c, [], 0, 4), "array-batch-invalid"),
        (lambda a, c: a.dots(c, [np.ones(4)], 0, 4), "array-batch-invalid"),
        (lambda a, c: a.sum(c, np.array([1.0, np.nan, 2.0]), 0, 3), "non-finite-contribution"),
        (lambda a, c: a.dot(c, np.ones(3), np.array([1.0, 2.0, -np.inf]), 0, 3), "non-finite-contribution"),
        (lambda a, c: a.dot(c, np.full(3, 1e200), np.full(3, 1e200), 0, 3), "non-finite-combined"),
        (lambda a, c: a.norm2(c, np.full(3, 1e160), 0, 3), "non-finite-combined"),
        (lambda a, c: a.sum(c, np.ones(4), 0, 4, timeout=-1), "usage"),
    ],
)
def test_api_refusals_then_the_next_call_works(self_comm, call, code):
    from alpha_mpi import arrays

    with pytest.raises(Refusal) as e:
        call(arrays, self_comm)
    assert e.value.code == code, e.value
    assert arrays.sum(self_comm, np.array([1.0, 2.0, 3.0]), 0, 3) == 6.0


def test_nonfinite_refusal_names_the_global_index(self_comm):
    from alpha_mpi import arrays

    with pytest.raises(Refusal) as e:
        arrays.sum(self_comm, np.array([1.0, 2.0, np.inf]), 0, 3)
    assert "x[2] = inf" in str(e.value)


@pytest.mark.parametrize("log2s", [0, 1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 16, 20])
def test_portable_lanes_give_the_same_bits_as_the_fast_ones(log2s):
    """The portable C lanes (what AArch64 and pre-AVX2 x86 run) and the lanes this CPU offers
    (AVX2 here) evaluate the same balanced tree: the same bits, and the oracle's."""
    from alpha_mpi.kernel import ffi, lib

    s = 1 << log2s
    x, y = data(s, seed=log2s)
    px, py = ffi.from_buffer("double[]", x), ffi.from_buffer("double[]", y)
    got = {}
    for portable in (0, 1):
        for name, yy in (("sum", ffi.NULL), ("dot", py)):
            v = ffi.new("double *")
            assert lib.ap_block_value(px, yy, s, portable, v) == 0
            got[(name, portable)] = f64bits(v[0])
    assert got[("sum", 0)] == got[("sum", 1)] == f64bits(pairwise(x.tolist()))
    assert got[("dot", 0)] == got[("dot", 1)] == f64bits(oracle_dot(x.tolist(), y.tolist()))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 1 << 18), st.data())
def test_block_frames_hold_every_state_of_the_exchange(n, data):
    """block_need (the frames a table of 1-D blocks needs, once they may shrink below
    pw.CAPACITY) bounds every summary, state and merge of the exchange, in rank order and in
    the sorted order that blocks out of rank order take: merged at exactly that capacity
    (ap_merge refuses beyond it, ap_summary too), every rank ends with the root."""
    from alpha_mpi.arrays.exchange import block_need

    p = data.draw(st.integers(1, 9))
    inner = sorted(data.draw(st.lists(st.integers(0, n), min_size=p - 1, max_size=p - 1)))
    bounds = [0, *inner, n]
    place = data.draw(st.permutations(range(p)))  # rank place[j] holds block j
    rows_ = [None] * p
    for j, r in enumerate(place):
        rows_[r] = pw.Row(r, bounds[j], bounds[j + 1] - bounds[j], n, 0)
    order = None if pw.in_rank_order(rows_) else pw.sorted_order(rows_)
    cap = block_need(rows_, order)
    assert cap <= pw.CAPACITY
    g = np.full(n, 0.5)
    state = [
        local.summary([g[r.offset : r.offset + r.length]], None, r.offset, n, capacity=cap) for r in rows_
    ]
    for i in range(ap.rounds(p)):
        state = [
            local.merge(state[r], state[ap.schedule(p, r, order)[i].recv_from], n, capacity=cap)
            for r in range(p)
        ]
    assert all(s.root() == local.summary([g], None, 0, n).root() for s in state)
