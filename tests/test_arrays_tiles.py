"""N-d tiles of alpha_mpi.arrays in one process: the geometry (runs, record counts, the room a
kernel pass needs), the coverage verdicts against a brute-force count, the frame capacity
against the summaries the exchange really holds, and the kernel's tile summaries merged in
any order, compared bit for bit with the independent oracle over the flattened array.

Tiling independence is shown here without MPI: every Cartesian tiling (uneven, empty tiles,
halo views, any merge order) gives the oracle's bits; test_arrays_tiles_mpi.py shows the
exchange delivers exactly that on every rank.
"""

import itertools
import math

import numpy as np
import pytest
from array_oracle import oracle_dot, oracle_norm2, oracle_sum, sequential_sum
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tile_cases import SHAPES, block, cartesian, global_data, oracle_values, tilings, with_halo

from alpha_mpi.arrays import local, pairwise, tiles
from alpha_mpi.planning import array_program
from alpha_mpi.refusals import Refusal

_WANT: dict = {}


def want(shape, seed=0):
    key = (shape, seed)
    if key not in _WANT:
        g, h = global_data(shape, seed)
        _WANT[key] = oracle_values(g, h, oracle_sum, oracle_dot, oracle_norm2)
    return _WANT[key]


def u64(v):
    return int(np.float64(v).view(np.uint64))


@st.composite
def boxes(draw, max_ndim=4, max_side=9):
    """(shape, offset, extent) of one tile, possibly empty."""
    d = draw(st.integers(1, max_ndim))
    shape = tuple(draw(st.lists(st.integers(0, max_side), min_size=d, max_size=d)))
    offset = tuple(draw(st.integers(0, s)) for s in shape)
    extent = tuple(draw(st.integers(0, s - o)) for s, o in zip(shape, offset))
    return shape, offset, extent


def flat_indices(shape, offset, extent):
    grid = np.meshgrid(*[np.arange(o, o + e) for o, e in zip(offset, extent)], indexing="ij")
    return np.ravel_multi_index(tuple(a.ravel() for a in grid), shape) if grid[0].size else np.zeros(0, int)


# ----------------------------------------------------------------------------- geometry


@given(b=boxes())
def test_runs_are_exactly_the_tiles_flat_indices(b):
    shape, offset, extent = b
    starts, length = tiles.runs(shape, offset, extent)
    held = np.concatenate([np.arange(s, s + length) for s in starts]) if starts.size else np.zeros(0, int)
    assert held.tolist() == sorted(flat_indices(shape, offset, extent).tolist())
    if starts.size > 1:  # runs of one tile never meet: a gap between every two
        assert (np.diff(starts) > length).all()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=boxes(max_side=12), halo=st.booleans(), k=st.integers(1, 2))
def test_record_count_and_room_are_exact(b, halo, k):
    """ap_tile_records counts the summary's records, and the room it reports is what the pass
    needs: that capacity works, one less overflows (strides decide where blocks are cut)."""
    shape, offset, extent = b
    g, h = global_data(shape) if 0 not in shape else (np.zeros(shape), np.zeros(shape))
    x = block(g, (offset, extent))
    x = with_halo(x) if halo and x.size else x
    xs, ys = [x] * k, [block(h, (offset, extent))] * k
    s = local.tile_summary(xs, ys, offset, shape)  # capacity: the room the pass reports
    assert s.count == local.tile_records(offset, shape, extent)
    assert all(pairwise.is_node(a, c, int(np.prod(shape))) for a, c in s.ranges())
    if s.count:
        room = int(s.words.size // (2 + k))
        with pytest.raises(Refusal) as e:
            local.tile_summary(xs, ys, offset, shape, capacity=room - 1)
        assert "capacity" in str(e.value)


def test_a_tile_has_one_record_per_aligned_row_segment():
    """The summary size the exchange carries: half rows of a 512-wide array are complete
    aligned subtrees (one record each), whole rows join into one run."""
    assert local.tile_records((0, 256), (512, 512), (512, 256)) == 512
    assert local.tile_records((256, 0), (512, 512), (256, 512)) == 1
    assert local.tile_records((0, 0, 32), (64, 64, 64), (64, 64, 32)) == 4096
    assert local.tile_records((0, 32, 0), (64, 64, 64), (64, 32, 64)) == 64
    assert local.tile_records((32, 0, 0), (64, 64, 64), (32, 64, 64)) == 1
    # awkward widths: a few records per row segment (at most 2 * log2 + 1)
    assert 37 <= local.tile_records((0, 20), (37, 53), (37, 33)) <= 37 * 11


# ----------------------------------------------------------------------------- the kernel


def merged(parts, n, order):
    acc = parts[order[0]]
    for j in order[1:]:
        acc = local.merge(acc, parts[j], n, capacity=sum(p.count for p in parts) + 256)
    return acc.root()


@pytest.mark.parametrize("shape", SHAPES)
def test_every_cartesian_tiling_gives_the_oracle_bits(shape):
    """Every process grid of 1 to 5 ranks, even and uneven cuts (empty tiles), alternately
    contiguous tiles and halo views, merged in a random order: sum and (dot, y.y) are the
    oracle's bits over the flattened array."""
    g, h = global_data(shape)
    w, n = want(shape), g.size
    rng = np.random.default_rng(len(shape))
    seen = 0
    for p in range(1, 6):
        for boxes_ in tilings(shape, p, rng):
            sums, dots = [], []
            for r, box in enumerate(boxes_):
                x, y = block(g, box), block(h, box)
                if r % 2 and x.size:
                    x = with_halo(x)
                sums.append(local.tile_summary([x], None, box[0], shape))
                dots.append(local.tile_summary([x, y], [y, y], box[0], shape))
            order = rng.permutation(len(boxes_)).tolist()
            assert u64(merged(sums, n, order)[0]) == u64(w["sum"]), (shape, boxes_)
            assert [u64(v) for v in merged(dots, n, order)] == [u64(w["dot"]), u64(w["dotyy"])]
            seen += 1
    assert seen >= 10


def test_the_data_makes_the_order_observable():
    for shape in SHAPES:
        g, _ = global_data(shape)
        assert u64(sequential_sum(g.ravel().tolist())) != u64(want(shape)["sum"]), shape


def test_a_non_cartesian_tiling_too():
    """Boxes of a recursive bisection (not a grid) of 37 x 53."""
    shape = (37, 53)
    g, h = global_data(shape)
    boxes_ = [
        ((0, 0), (20, 10)),
        ((0, 10), (20, 43)),
        ((20, 0), (17, 30)),
        ((20, 30), (9, 23)),
        ((29, 30), (8, 23)),
    ]
    parts = [local.tile_summary([block(g, b)], [block(h, b)], b[0], shape) for b in boxes_]
    assert u64(merged(parts, g.size, [3, 0, 4, 2, 1])[0]) == u64(want(shape)["dot"])


@pytest.mark.parametrize(
    "view",
    [
        lambda t: t[::-1].copy()[::-1],  # negative strides
        lambda t: np.asfortranarray(t),  # last stride not one element: copied
        lambda t: np.repeat(t, 2, axis=-1)[..., ::2],  # every other element of a wider array: copied
        lambda t: with_halo(t),
    ],
)
def test_any_strided_view_gives_the_contiguous_bits(view):
    shape = (7, 9, 11)
    g, _ = global_data(shape)
    box = ((2, 1, 3), (4, 7, 5))
    t = block(g, box)
    want_s = local.tile_summary([np.ascontiguousarray(t)], None, box[0], shape)
    got = local.tile_summary([view(t)], None, box[0], shape)
    assert got.ranges() == want_s.ranges()
    assert (got.values().view(np.uint64) == want_s.values().view(np.uint64)).all()


# ----------------------------------------------------------------------------- verdicts


def tile(rank, shape, offset, extent, status=pairwise.STATUS_OK):
    return tiles.Tile(rank, status, 1, 1, tuple(shape), tuple(offset), tuple(extent))


def verdict(ts) -> tuple:
    """(code, message) of check_tiles over `ts`, (None, '') when it accepts them."""
    try:
        tiles.check_tiles(ts, "dot")
    except Refusal as e:
        return e.code, str(e)
    return None, ""


def brute_verdict(shape, boxes_):
    """(code, first bad global index) by counting every index's owners."""
    count = np.zeros(int(np.prod(shape)), dtype=int)
    for offset, extent in boxes_:
        count[flat_indices(shape, offset, extent)] += 1
    bad = np.flatnonzero(count != 1)
    if not bad.size:
        return None, None
    i = int(bad[0])
    return ("array-coverage-hole" if count[i] == 0 else "array-coverage-overlap"), i


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_coverage_verdict_names_the_first_bad_global_index(data):
    d = data.draw(st.integers(1, 3))
    shape = tuple(data.draw(st.lists(st.integers(1, 6), min_size=d, max_size=d)))
    grid = [sorted({0, s, *data.draw(st.lists(st.integers(0, s), max_size=2))}) for s in shape]
    boxes_ = cartesian(grid)
    for _ in range(data.draw(st.integers(0, 2))):  # break it: drop, move or grow a box
        j = data.draw(st.integers(0, len(boxes_) - 1))
        (o, e), dim = boxes_[j], data.draw(st.integers(0, d - 1))
        what = data.draw(st.sampled_from(["drop", "grow", "shrink"]))
        if what == "drop":
            if len(boxes_) > 1:  # every communicator has a rank
                boxes_ = boxes_[:j] + boxes_[j + 1 :]
            continue
        e = list(e)
        e[dim] = min(shape[dim] - o[dim], e[dim] + 1) if what == "grow" else max(0, e[dim] - 1)
        boxes_[j] = (o, tuple(e))
    code, index = brute_verdict(shape, boxes_)
    got, text = verdict([tile(r, shape, o, e) for r, (o, e) in enumerate(boxes_)])
    assert got == code
    if code is not None:
        at = tuple(int(v) for v in np.unravel_index(index, shape))
        assert f"global index {index} = {at}" in text


@pytest.mark.parametrize(
    "rows, code",
    [
        ([((0, 0), (2, 3)), ((2, 0), (1, 3))], None),
        ([((0, 0), (2, 3)), ((2, 0), (1, 2))], "array-coverage-hole"),  # global index 8 = (2, 2)
        ([((0, 0), (2, 3)), ((1, 0), (2, 3))], "array-coverage-overlap"),  # index 3 = (1, 0)
    ],
)
def test_verdict_messages(rows, code):
    got, text = verdict([tile(r, (3, 3), o, e) for r, (o, e) in enumerate(rows)])
    assert got == code
    if code is not None:
        want_text = (
            "global index 8 = (2, 2)"
            if code.endswith("hole")
            else "ranks 0 and 1 both hold global index 3 = (1, 0)"
        )
        assert want_text in text


def test_verdicts_shape_refused_nonfinite():
    ok = [tile(0, (2, 3), (0, 0), (1, 3)), tile(1, (2, 3), (1, 0), (1, 3))]
    with pytest.raises(Refusal) as e:
        tiles.check_tiles([ok[0], tile(1, (2, 4), (1, 0), (1, 4))], "dot")
    assert e.value.code == "array-length-mismatch" and "(2, 3) on ranks [0]" in str(e.value)
    with pytest.raises(Refusal) as e:
        tiles.check_tiles([ok[0], tiles.Tile.refused(1, pairwise.refused_status("dtype-invalid"))], "dot")
    assert e.value.code == "peer-refused" and "rank 1 [dtype-invalid]" in str(e.value)
    with pytest.raises(Refusal) as e:
        tiles.check_tiles([ok[0], tile(1, (2, 3), (1, 0), (1, 3), pairwise.STATUS_NONFINITE)], "dot")
    assert e.value.code == "non-finite-contribution"
    rows = [t.words() for t in ok]
    assert [tiles.Tile.from_words(r, w) for r, w in enumerate(rows)] == ok
    assert len(rows[0]) == tiles.ROW_WORDS


# ----------------------------------------------------------------------------- frames


def test_capacity_bounds_every_state_the_exchange_holds():
    """Run the exchange's merges (array_program.schedule, the Bruck windows) on real tile summaries and
    check that no state and no merge on the way holds more than capacity_needed records, the
    final merge's prefix of the root included (a 10,717-element array: a deep tree)."""
    rng = np.random.default_rng(7)
    for shape in [(37, 53), (64, 32), (7, 9, 11), (1531, 7)]:
        g, _ = global_data(shape)
        n = g.size
        for p in (2, 3, 4, 5, 6):
            for boxes_ in tilings(shape, p, rng):
                parts = [local.tile_summary([block(g, b)], None, b[0], shape) for b in boxes_]
                ts = [
                    tiles.Tile(r, 0, s.count, int(s.words.size // 3), shape, *b)
                    for r, (s, b) in enumerate(zip(parts, boxes_))
                ]
                cap = tiles.capacity_needed(ts, p)
                state = list(parts)
                rounds = array_program.rounds(p)
                for i in range(rounds):
                    nxt = []
                    for r in range(p):
                        theirs = state[array_program.schedule(p, r)[i].recv_from]
                        assert state[r].count <= cap and theirs.count <= cap
                        out = local.merge(state[r], theirs, n, capacity=cap)  # refused beyond it
                        nxt.append(out)
                    state = nxt
                assert all(s.root() == state[0].root() for s in state)


def test_capacity_needed_is_the_largest_window():
    ts = [tiles.Tile(r, 0, c, c, (9,), (0,), (0,)) for r, c in enumerate([5, 1, 1, 7, 2])]
    assert tiles.capacity_needed(ts, 5) == 7 + 2 + 5 + 1  # 4 ranks, wrapping around
    assert tiles.capacity_needed(ts[:2], 2) == 5  # one round: each rank's own
    assert tiles.capacity_needed([tiles.Tile(0, 0, 1, 9, (9,), (0,), (9,))], 1) == 9  # room


@given(st.integers(1, 1 << 40))
def test_bucket(need):
    b = tiles.bucket(need)
    assert b >= max(need, tiles.FLOOR) and tiles.bucket(b) == b
    assert need <= tiles.FLOOR or b <= need + need / 16 + 1


def test_capacity_grows_at_once_and_shrinks_after_a_run_of_small_calls():
    c = tiles.Capacity()
    assert c.current == pairwise.CAPACITY and not c.settle(100)
    assert c.settle(5000) and c.current == tiles.bucket(5000)
    for big_small in range(40):  # alternating tilings keep the big frames
        assert not c.settle(5000 if big_small % 2 else 10)
    assert c.current == tiles.bucket(5000)
    for _ in range(tiles.Capacity.SHRINK_AFTER - 1):
        assert not c.settle(300)
    assert c.current == tiles.bucket(5000)
    assert not c.settle(10) and c.current == tiles.bucket(300)


def test_a_solvers_small_tiles_shrink_the_frames_to_the_floor():
    """The capacity starts at the 1-D blocks' bound; a run of calls needing a few records (a
    Krylov solver's tiles) brings it down to FLOOR, far below pairwise.CAPACITY."""
    c = tiles.Capacity()
    assert c.current == pairwise.CAPACITY > tiles.FLOOR
    for _ in range(tiles.Capacity.SHRINK_AFTER):
        assert not c.settle(6)
    assert c.current == tiles.FLOOR
    assert not c.settle(tiles.FLOOR) and c.current == tiles.FLOOR
    assert c.settle(tiles.FLOOR + 1) and c.current == tiles.FLOOR + 1  # more: at once


def test_a_refused_call_keeps_settled_frames_and_starts_over_otherwise():
    """Capacity.refused: a refusal that may have come on this rank only keeps frames that were
    settled (the next call works where every rank was) and otherwise starts over at the start,
    counting nothing."""
    c = tiles.Capacity()
    for _ in range(tiles.Capacity.SHRINK_AFTER):
        c.settle(6)
    assert not c.settle(6) and c.steady == 6 and c.current == tiles.FLOOR  # settled
    c.refused()
    assert c.current == tiles.FLOOR and c.steady == -1
    assert not c.settle(6) and c.steady == 6  # settled again by the next call
    c = tiles.Capacity()
    for _ in range(5):
        c.settle(6)  # on the way to shrinking
    c.settle(5000)  # grown
    assert c.current == tiles.bucket(5000) and c.steady == -1
    c.refused()
    assert (c.current, c._low, c._low_calls, c.steady) == (pairwise.CAPACITY, 0, 0, -1)


def test_a_call_that_skips_settle_for_the_steady_need_keeps_the_same_capacity():
    """The arrays' one call skips settle when the need is `steady` (nothing would change): over
    a run of needs that grow, shrink and repeat, skipping it leaves the same capacity and
    counters as settling every call."""
    rng = np.random.default_rng(5)
    every, skipping = tiles.Capacity(), tiles.Capacity()
    for need in rng.choice([10, 10, 300, 5000, 5000, 5000, 9000], size=600).tolist():
        grew = every.settle(need)
        assert grew == (skipping.settle(need) if need != skipping.steady else False)
        assert (every.current, every._low, every._low_calls) == (
            skipping.current,
            skipping._low,
            skipping._low_calls,
        )


# ----------------------------------------------------------------------------- the API, p = 1


@pytest.mark.parametrize("shape", SHAPES)
def test_api_whole_array_on_one_rank(self_comm, shape):
    from alpha_mpi import arrays

    g, h = global_data(shape)
    w, origin = want(shape), (0,) * len(shape)
    assert u64(arrays.sum(self_comm, g, origin, shape)) == u64(w["sum"])
    assert u64(arrays.dot(self_comm, with_halo(g), h, origin, list(shape))) == u64(w["dot"])
    assert u64(arrays.norm2(self_comm, g, origin, shape)) == u64(w["norm2"])
    got = arrays.dots(self_comm, [(g, h), (h, h)], origin, shape)
    assert [u64(v) for v in got] == [u64(w["dot"]), u64(w["dotyy"])]
    flat = arrays.dot(self_comm, g.ravel(), h.ravel(), 0, g.size)  # the 1-D call: the same bits
    assert u64(flat) == u64(w["dot"])


def test_api_one_dimensional_tuples_are_the_int_form(self_comm):
    from alpha_mpi import arrays

    g, _ = global_data((37, 53))
    x = g.ravel()
    assert u64(arrays.sum(self_comm, x, (0,), (x.size,))) == u64(arrays.sum(self_comm, x, 0, x.size))
    assert arrays.sum(self_comm, np.zeros((0, 5)), (0, 0), (0, 5)) == 0.0


@pytest.mark.parametrize(
    "call, code",
    [
        (lambda a, c: a.sum(c, np.ones((2, 3)), (0, 0), (2, 4)), "array-coverage-hole"),
        (lambda a, c: a.sum(c, np.ones((2, 3)), (0, 1), (2, 3)), "array-block-invalid"),
        (lambda a, c: a.sum(c, np.ones((2, 3)), (0, -1), (2, 3)), "array-block-invalid"),
        (lambda a, c: a.sum(c, np.ones((2, 3)), (0,), (2, 3)), "array-block-invalid"),
        (lambda a, c: a.sum(c, np.ones((2, 3)), (0, 0), 6), "array-block-invalid"),
        (lambda a, c: a.sum(c, np.ones((2, 3)), (0, 0.0), (2, 3)), "array-block-invalid"),
        (lambda a, c: a.sum(c, np.ones(6), (0, 0), (2, 3)), "array-block-invalid"),
        (lambda a, c: a.sum(c, np.ones((1,) * 5), (0,) * 5, (1,) * 5), "array-block-invalid"),
        (lambda a, c: a.sum(c, np.ones((2, 3), dtype=np.float32), (0, 0), (2, 3)), "dtype-invalid"),
        (lambda a, c: a.dot(c, np.ones((2, 3)), np.ones((3, 2)), (0, 0), (2, 3)), "array-block-invalid"),
        (lambda a, c: a.dots(c, [], (0, 0), (2, 3)), "array-batch-invalid"),
        (lambda a, c: a.sum(c, np.full((2, 3), np.nan), (0, 0), (2, 3)), "non-finite-contribution"),
        (
            lambda a, c: a.dot(c, np.full((2, 3), 1e200), np.full((2, 3), 1e200), (0, 0), (2, 3)),
            "non-finite-combined",
        ),
        (lambda a, c: a.sum(c, np.ones((2, 3)), (0, 0), (2, 3), timeout=-1), "usage"),
    ],
)
def test_api_refusals_then_the_next_call_works(self_comm, call, code):
    from alpha_mpi import arrays

    with pytest.raises(Refusal) as e:
        call(arrays, self_comm)
    assert e.value.code == code, e.value
    assert arrays.sum(self_comm, np.arange(6.0).reshape(2, 3), (0, 0), (2, 3)) == 15.0


def test_nonfinite_refusal_names_the_tile_and_global_index(self_comm):
    from alpha_mpi import arrays

    x = np.ones((3, 4))
    x[1, 2] = -np.inf
    with pytest.raises(Refusal) as e:
        arrays.sum(self_comm, x, (0, 0), (3, 4))
    assert "x[1, 2] = -inf (global index 6 = (1, 2))" in str(e.value)


def test_norm2_is_the_square_root_of_the_tree(self_comm):
    from alpha_mpi import arrays

    g, _ = global_data((7, 9, 11))
    assert arrays.norm2(self_comm, g, (0, 0, 0), g.shape) == math.sqrt(
        oracle_dot(g.ravel().tolist(), g.ravel().tolist())
    )


def test_tilings_helper_covers_every_grid():
    rng = np.random.default_rng(0)
    got = tilings((37, 53), 4, rng, uneven=0)
    assert len(got) == 3 and all(len(b) == 4 for b in got)  # 4x1, 2x2, 1x4
    for boxes_ in got:
        assert brute_verdict((37, 53), boxes_) == (None, None)
    assert len(list(itertools.chain.from_iterable(tilings((7, 9, 11), 3, rng)))) == 2 * 3 * 3
