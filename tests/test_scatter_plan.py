"""The scatter realization's plan, without MPI: chunking, frames, traffic, identity, programs."""

import pytest

from alpha_mpi import DeliverTo, Layout, ReplicateAll, hierarchy, plan, star
from alpha_mpi.model.tree import expression
from alpha_mpi.planning.combine_plan import STACK_LIMIT
from alpha_mpi.planning.scatter_plan import (
    ReduceScatter,
    chunk_bounds,
    plan_scatter,
    scatter_traffic,
    segment_bounds,
)
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


def test_segments_cut_a_chunk_into_pieces_of_at_most_segment():
    assert segment_bounds(10, 35, 10) == ((10, 20), (20, 30), (30, 35))
    assert segment_bounds(0, 5, 64) == ((0, 5),)
    assert segment_bounds(4, 4, 8) == ()


def _trees(p, per_rank):
    slots = p * per_rank
    return {"star": star(range(slots), p), "hierarchy:2": hierarchy(range(slots), p, 2)}


@pytest.mark.parametrize("p", [2, 3, 4, 5])
@pytest.mark.parametrize("n", [4000, 4001, 4003])
def test_traffic_is_two_p_minus_one_over_p_of_the_vector_per_rank(p, n):
    sp = plan_scatter(star(range(p), p), ReplicateAll(), n, size=p)
    t = scatter_traffic(sp)
    ideal = 2 * (p - 1) * n * 8 / p
    assert sum(t.sent_bytes) == sum(t.recv_bytes) == 2 * (p - 1) * n * 8
    for r in range(p):
        # exact when p divides n; otherwise off by the chunk-size rounding only
        assert abs(t.sent_bytes[r] - ideal) <= 8 * (p - 2) + 1e-9
        assert abs(t.recv_bytes[r] - ideal) <= 8 * (p - 2) + 1e-9
        if n % p == 0:
            assert t.sent_bytes[r] == t.recv_bytes[r] == ideal
        # one frame per (sender, chunk owner) and per chunk owner to each receiver
        assert t.sent_msgs[r] == 2 * (p - 1)


def test_tree_realization_moves_more_at_the_root():
    p, n = 4, 4000
    tree = star(range(p), p)
    from alpha_mpi import simulate

    tt = simulate(plan(tree, None, n, size=p))
    st = scatter_traffic(plan_scatter(tree, None, n, size=p))
    assert max(tt.recv_bytes) == (p - 1) * n * 8  # the hub receives every contribution
    assert max(st.recv_bytes) == 2 * (p - 1) * n * 8 // p


def test_several_slots_per_rank_travel_in_one_frame_per_chunk_owner():
    p, k, n = 3, 4, 999
    sp = plan_scatter(hierarchy(range(p * k), p, 2), None, n, size=p)
    for r in range(p):
        scatter = [f for f in sp.frames_from(r) if f.phase == "s"]
        assert len(scatter) == p - 1
        assert {f.dst for f in scatter} == set(range(p)) - {r}
        for f in scatter:
            assert f.pieces == k and f.count == k * (f.stop - f.start)
        assert sorted(sp.slots_of(r)) == list(range(r * k, (r + 1) * k))
    t = scatter_traffic(sp)
    assert t.sent_bytes[0] == k * (n - 333) * 8 + 2 * 333 * 8


def test_fewer_coordinates_than_ranks_leave_empty_chunks_without_traffic():
    p, n = 5, 3
    sp = plan_scatter(star(range(p), p), None, n, size=p)
    assert [b - a for a, b in sp.chunks] == [1, 1, 1, 0, 0]
    t = scatter_traffic(sp)
    for r in (3, 4):
        assert not [f for f in sp.frames_to(r) if f.phase == "s"]  # nobody sends pieces of empty chunks
        assert not [f for f in sp.frames_from(r) if f.phase == "g"]  # and they gather nothing out
        assert sp.segments(r) == ()
    # ranks 3 and 4 still own leaves: they send their pieces and receive the whole result
    assert t.sent_bytes[3] == 3 * 8 and t.recv_bytes[3] == 3 * 8
    assert sum(t.sent_bytes) == (p - 1) * n * 8 + (p - 1) * n * 8


def test_segmentation_splits_large_chunks_into_several_frames():
    p, n, seg = 2, 1000, 128
    sp = plan_scatter(star(range(p), p), None, n, size=p, segment=seg)
    frames = sp.frames_from(0)
    scatter = [f for f in frames if f.phase == "s"]
    assert [(f.start, f.stop) for f in scatter] == [
        (500 + a, min(500 + a + seg, 1000)) for a in range(0, 500, seg)
    ]
    assert [f.segment for f in scatter] == list(range(4))
    t = scatter_traffic(sp)
    assert t.sent_bytes == [2 * 500 * 8, 2 * 500 * 8]
    assert "E3" in [str(s) for s in sp.rank_program(0)]


def test_deliver_to_gathers_only_at_the_target():
    p, n = 4, 400
    sp = plan_scatter(star(range(p), p), DeliverTo(2), n, size=p)
    assert sp.receivers == frozenset([2])
    gathers = [f for r in range(p) for f in sp.frames_from(r) if f.phase == "g"]
    assert {f.dst for f in gathers} == {2} and len(gathers) == p - 1
    t = scatter_traffic(sp)
    assert t.recv_bytes[2] == 3 * 100 * 8 + 3 * 100 * 8
    assert t.recv_bytes[0] == 3 * 100 * 8


def test_reduce_scatter_keeps_chunks_and_sends_only_header_only_flag_frames():
    p, n = 4, 400
    sp = plan_scatter(star(range(p), p), ReduceScatter(), n, size=p)
    assert sp.mode == "reduce-scatter" and sp.receivers == frozenset()
    t = scatter_traffic(sp)
    for r in range(p):
        g = [f for f in sp.frames_from(r) if f.phase == "g"]
        assert len(g) == p - 1 and all(f.nbytes == 0 for f in g)
        assert t.sent_bytes[r] == (p - 1) * 100 * 8  # (p-1)/p of the vector


def test_replicate_all_reaches_the_same_ranks_as_the_tree_realization():
    tree = star(range(3), [0, 1, 1])  # rank 2 of 3 owns nothing
    tp = plan(tree, None, 30, size=3)
    sp = plan_scatter(tp)
    assert sp.receivers == tp.receivers == frozenset([0, 1])
    # rank 2 still owns a chunk: it evaluates it and sends it to both receivers
    assert {f.dst for f in sp.frames_from(2) if f.phase == "g"} == {0, 1}


def test_identity_is_its_own_order_id_is_the_tree_plans():
    p, n = 4, 1000
    tree = hierarchy(range(8), p, 2)
    tp = plan(tree, None, n, size=p)
    sp = plan_scatter(tree, None, n, size=p)
    assert sp.order_id == tp.order_id
    assert sp.identity != tp.identity
    assert sp.realization == "scatter" and tp.realization == "tree"
    assert plan_scatter(tp).identity == sp.identity
    # the chunking is part of the identity, not of the order
    other = plan_scatter(tree, None, n, size=p, segment=100)
    assert other.identity != sp.identity and other.order_id == sp.order_id
    assert plan_scatter(tree, DeliverTo(1), n, size=p).identity != sp.identity
    assert plan_scatter(tree, ReduceScatter(), n, size=p).identity != sp.identity
    # the same order on another placement: same order id
    placed = plan_scatter(hierarchy(range(8), 2, 2), None, n, size=2)
    assert placed.order_id == sp.order_id and placed.identity != sp.identity
    d = sp.to_dict()
    assert d["realization"] == "scatter" and d["chunks"][0] == [0, 250]
    assert "realization scatter" in sp.describe(scatter_traffic(sp))


def _eval_groups(groups):
    values = {}
    for g in groups:
        stack = []
        for op in g.program:
            if op == -1:
                right, left = stack.pop(), stack.pop()
                stack.append(f"({left}+{right})")
            else:
                kind, v = g.inputs[op]
                stack.append(f"s{v}" if kind == "leaf" else values[v])
        (values[g.index],) = stack
        if g.output[0] == "root":
            return values[g.index]


def _depth(program):
    d = m = 0
    for op in program:
        d += 1 if op >= 0 else -1
        m = max(m, d)
    return m


@pytest.mark.parametrize(
    "tree",
    [
        hierarchy(range(200), 4, 1),  # a right-deep chain: the stack must be cut
        hierarchy(range(50), 5, 3),
        star(range(300), 3),
    ],
)
def test_the_local_programs_evaluate_the_whole_declared_tree_within_the_stack_limit(tree):
    sp = plan_scatter(tree, None, 16, size=5)
    assert _eval_groups(sp.groups) == expression(tree)
    assert all(_depth(g.program) <= STACK_LIMIT + 1 for g in sp.groups)
    leaves = [v for g in sp.groups for k, v in g.inputs if k == "leaf"]
    assert sorted(leaves) == list(range(tree.leaves))


def test_refusals():
    tree = star(range(4), [0, 0, 1, 1])
    with pytest.raises(Refusal) as e:
        plan_scatter(tree, DeliverTo(2), 10, size=3)
    assert e.value.code == "delivery-target-not-owner"
    with pytest.raises(Refusal) as e:
        plan_scatter(tree, None, 10, size=3, segment=0)
    assert e.value.code == "plan-rank-mismatch"
    with pytest.raises(Refusal) as e:
        plan_scatter(tree, None, 10, size=1)
    assert e.value.code == "owner-out-of-range"
    with pytest.raises(Refusal) as e:
        plan_scatter(star([0, 1, 1], 2), None, 10, size=2)
    assert e.value.code.startswith("coverage")


def test_layout_components_are_chunked_as_one_payload():
    sp = plan_scatter(star(range(2), 2), None, Layout.weighted(5), size=2)
    assert sp.chunks == ((0, 3), (3, 6))  # numerator[5] + mass[1] = 6 coordinates
