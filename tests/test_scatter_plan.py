"""The scatter realization's program, without MPI: chunking, messages, traffic, identity."""

import warnings

import pytest

from alpha_mpi import DeliverTo, Layout, hierarchy, pairwise, plan, simulate, star
from alpha_mpi.model.delivery import ReduceScatter
from alpha_mpi.planning.check import check, count
from alpha_mpi.planning.realizations.scatter import chunk_bounds
from alpha_mpi.planning.realize import plan_scatter
from alpha_mpi.refusals import Refusal


@pytest.mark.parametrize("n", [1, 2, 3, 7, 10, 64, 1000, 1001])
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 8])
def test_chunks_tile_the_payload_contiguously_sizes_within_one(n, p):
    chunks = chunk_bounds(n, p)
    assert len(chunks) == p
    assert chunks[0][0] == 0 and chunks[-1][1] == n
    for (_a, b), (c, _d) in zip(chunks, chunks[1:]):
        assert b == c
    sizes = [b - a for a, b in chunks]
    assert max(sizes) - min(sizes) <= 1
    assert sorted(sizes, reverse=True) == sizes  # the extra elements go to the first ranks
    if n < p:
        assert sizes == [1] * n + [0] * (p - n)


def _messages(sp, r, kind="S"):
    rp = sp.rank(r)
    return [rp.messages[o.index] for o in rp.ops if o.kind == kind]


@pytest.mark.parametrize("p", [2, 3, 4, 5])
@pytest.mark.parametrize("n", [4000, 4001, 4003])
def test_traffic_is_two_p_minus_one_over_p_of_the_vector_per_rank(p, n):
    sp = plan_scatter(star(range(p), p), None, n, size=p)
    check(sp)
    c = count(sp)
    ideal = 2 * (p - 1) * n * 8 / p
    assert sum(c.bytes_sent) == 2 * (p - 1) * n * 8
    for r in range(p):
        assert abs(c.bytes_sent[r] - ideal) <= 8 * (p - 2) + 1e-9  # chunk-size rounding only
        if n % p == 0:
            assert c.bytes_sent[r] == ideal
        assert c.sends[r] == 2 * (p - 1)  # one piece per chunk owner, one chunk per receiver


def test_the_tree_realization_moves_more_at_the_root():
    p, n = 4, 4000
    tree = star(range(p), p)
    tt = simulate(plan(tree, None, n, size=p))
    received = [
        sum(8 * m.count for m in _messages(plan_scatter(tree, None, n, size=p), r, "W")) for r in range(p)
    ]
    assert max(tt.recv_bytes) == (p - 1) * n * 8  # the hub receives every contribution
    assert max(received) == 2 * (p - 1) * n * 8 // p


def test_a_ranks_operands_travel_as_pieces_one_frame_per_chunk_owner():
    p, k, n = 3, 4, 999
    owners = [r for r in range(p) for _ in range(k)]
    # pairwise: each rank's 4 slots form one subtree, pre-evaluated into one operand;
    # star (a left-deep chain): every slot of ranks 1 and 2 is an operand of its own.
    for tree, pieces_of in (
        (pairwise(range(p * k), owners), [1, 1, 1]),
        (star(range(p * k), owners), [1, k, k]),
    ):
        sp = plan_scatter(tree, None, n, size=p)
        check(sp)
        for r in range(p):
            frames = [m for m in _messages(sp, r) if m.phase == "s"]
            assert sorted(m.dst for m in frames) == sorted(set(range(p)) - {r})
            assert all(m.count == pieces_of[r] * 333 for m in frames)
            assert sorted(sp.slots_of(r)) == list(range(r * k, (r + 1) * k))


def test_fewer_coordinates_than_ranks_leave_empty_chunks_without_traffic():
    p, n = 5, 3
    sp = plan_scatter(star(range(p), p), None, n, size=p)
    check(sp)
    for r in (3, 4):
        assert not [m for m in _messages(sp, r, "W") if m.phase == "s"]  # nobody sends empty pieces
        assert not [m for m in _messages(sp, r) if m.phase == "g"]  # and they gather nothing out
    # ranks 3 and 4 still own leaves: they send their pieces and receive the whole result
    assert sum(8 * m.count for m in _messages(sp, 3)) == 3 * 8
    assert sum(8 * m.count for m in _messages(sp, 3, "W")) == 3 * 8


def test_segmentation_splits_large_chunks_into_several_frames():
    p, n, seg = 2, 1000, 128
    sp = plan_scatter(star(range(p), p), None, n, size=p, segment=seg)
    check(sp)
    pieces = [m for m in _messages(sp, 0) if m.phase == "s"]
    assert [m.count for m in pieces] == [128, 128, 128, 116]
    assert [m.seq for m in pieces] == [0, 1, 2, 3]  # each its own MPI tag pair
    assert count(sp).bytes_sent == [2 * 500 * 8, 2 * 500 * 8]
    assert sp.to_dict()["segment"] == seg


def test_deliver_to_gathers_only_at_the_target():
    p, n = 4, 400
    sp = plan_scatter(star(range(p), p), DeliverTo(2), n, size=p)
    check(sp)
    assert sp.receivers == frozenset([2])
    gathers = [m for r in range(p) for m in _messages(sp, r) if m.phase == "g"]
    assert {m.dst for m in gathers} == {2} and len(gathers) == p - 1
    assert sp.rank(0).result is None and sp.rank(2).result is not None


def test_reduce_scatter_keeps_chunks_and_sends_only_header_only_flag_frames():
    p, n = 4, 400
    sp = plan_scatter(star(range(p), p), ReduceScatter(), n, size=p)
    check(sp)
    assert sp.mode == "reduce-scatter" and sp.receivers == frozenset()
    assert sp.chunks == ((0, 100), (100, 200), (200, 300), (300, 400))
    for r in range(p):
        sent = _messages(sp, r)
        assert sum(8 * m.count for m in sent) == (p - 1) * 100 * 8  # (p-1)/p of the vector
        flags = [m for m in sent if m.phase != "s"]
        assert flags and all(m.count == 0 for m in flags)
        assert sp.rank(r).result.count == 100


def test_replicate_all_reaches_the_same_ranks_as_the_tree_realization():
    tree = star(range(3), [0, 1, 1])  # rank 2 of 3 owns nothing
    tp = plan(tree, None, 30, size=3)
    sp = plan_scatter(tp)
    check(sp)
    assert sp.receivers == tp.receivers == frozenset([0, 1])
    # rank 2 still owns a chunk: it evaluates it and sends it to both receivers
    assert {m.dst for m in _messages(sp, 2) if m.phase == "g"} == {0, 1}


def test_identity_is_its_own_order_ids_are_the_tree_plans():
    p, n = 4, 1000
    tree = hierarchy(range(8), p, 2)
    tp = plan(tree, None, n, size=p)
    sp = plan_scatter(tree, None, n, size=p)
    assert sp.layout_order_id == tp.layout_order_id and sp.tree_order_id == tp.tree_order_id == tree.order_id
    assert sp.layout_order_id != tree.order_id  # the layout is part of the combine, not of the tree
    assert sp.identity != tp.identity
    assert sp.realization == "scatter" and tp.realization == "tree"
    assert plan_scatter(tp).identity == sp.identity
    # the chunking is part of the identity, not of the order
    other = plan_scatter(tree, None, n, size=p, segment=100)
    assert other.identity != sp.identity and other.layout_order_id == sp.layout_order_id
    assert plan_scatter(tree, DeliverTo(1), n, size=p).identity != sp.identity
    assert plan_scatter(tp, DeliverTo(1)).receivers == frozenset([1])
    assert plan_scatter(tree, ReduceScatter(), n, size=p).identity != sp.identity
    # the same order on another placement: same order ids, another identity
    placed = plan_scatter(hierarchy(range(8), 2, 2), None, n, size=2)
    assert placed.layout_order_id == sp.layout_order_id and placed.identity != sp.identity
    d = sp.to_dict()
    assert d["realization"] == "scatter" and d["layout_order_id"] == sp.layout_order_id
    assert "realization   scatter" in sp.describe()


def test_order_id_is_a_deprecated_name_of_the_layout_order_id():
    sp = plan_scatter(star(range(2), 2), None, 10, size=2)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert sp.order_id == sp.layout_order_id
    assert [x.category for x in w] == [DeprecationWarning] and "layout_order_id" in str(w[0].message)


@pytest.mark.parametrize(
    "tree",
    [
        hierarchy(range(200), 4, 1),  # a right-deep chain: the stack must be cut
        hierarchy(range(50), 5, 3),
        star(range(300), 3),
    ],
)
def test_every_chunk_owner_evaluates_the_whole_declared_tree(tree):
    # check() runs the programs symbolically and compares every result coordinate with the
    # declared expression; the kernel's stack bound is checked there too.
    check(plan_scatter(tree, None, 16, size=5))
    check(plan_scatter(tree, ReduceScatter(), 16, size=5))


def test_refusals_name_the_mistake():
    tree = star(range(4), [0, 0, 1, 1])
    cases = [
        (lambda: plan_scatter(tree, DeliverTo(2), 10, size=3), "delivery-target-not-owner"),
        (lambda: plan_scatter(tree, None, 10, size=3, segment=0), "segment-invalid"),
        (lambda: plan_scatter(tree, None, 10, size=0), "plan-size-invalid"),
        (lambda: plan_scatter(tree, None, 10, size=1), "owner-out-of-range"),
        (lambda: plan_scatter(tree, None, 10, size=2).rank(2), "rank-out-of-range"),
        (lambda: plan_scatter(star([0, 1, 1], 2), None, 10, size=2), "coverage-duplicate-leaf"),
    ]
    for make, code in cases:
        with pytest.raises(Refusal) as e:
            make()
        assert e.value.code == code


def test_layout_components_are_chunked_as_one_payload():
    sp = plan_scatter(star(range(2), 2), ReduceScatter(), Layout.weighted(5), size=2)
    assert sp.chunks == ((0, 3), (3, 6))  # numerator[5] + mass[1] = 6 coordinates
