"""Every realization of a declared tree, planned and run symbolically in one process (no MPI).

The symbolic checker executes every rank's program with interned expressions: each receiver must
end with exactly the declared tree in every coordinate, no rank may wait forever, and no region
may be touched while a receive into it is pending or written while a send from it is in flight.
"""

import json

import numpy as np
import pytest

from alpha_mpi import Branch, DeliverTo, Leaf, Refusal, hierarchy, pairwise, plan, star
from alpha_mpi.model import leaf_sequence
from alpha_mpi.planning.check import check, count
from alpha_mpi.planning.cost import Calibration, choose, estimate, load_calibration
from alpha_mpi.planning.program import Eval, Op
from alpha_mpi.planning.realize import REALIZATIONS, applicable, realize

from conftest import topologies

TOPOLOGIES = topologies()


@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("n", [1, 5, 9000])
def test_every_applicable_realization_ends_with_the_declared_tree(topology, size, n):
    for slots in (size, 2 * size, 8):
        tree = TOPOLOGIES[topology](slots, size)
        target = max(leaf.owner for leaf in leaf_sequence(tree))
        for delivery in (None, DeliverTo(target)):
            tp = plan(tree, delivery, n, size=size)
            why = applicable(tp)
            assert why["tree"] is why["scatter"] is why["replicate"] is None  # any tree
            for name in REALIZATIONS:
                if why[name] is not None:
                    with pytest.raises(Refusal) as e:
                        realize(tp, name)
                    assert e.value.code == "realization-inapplicable" and "tree, scatter, replicate" in str(
                        e.value
                    )
                    continue
                prog = realize(tp, name, segment=3 if n < 100 else 4000)
                check(prog)
                assert prog.layout_order_id == tp.layout_order_id and prog.tree_order_id == tp.tree_order_id
                assert prog.identity != tp.identity or name == "tree"


@pytest.mark.parametrize("size", [1, 2, 4, 8])
@pytest.mark.parametrize("n", [1, 7, 9000])
def test_reduce_scatter_forms_end_with_their_chunk_of_the_tree(size, n):
    for tree in (pairwise(range(2 * size), size), hierarchy(range(2 * size), size, 2)):
        tp = plan(tree, None, n, size=size)
        for name in ("halving", "scatter"):
            if applicable(tp, "reduce-scatter")[name] is not None:
                continue
            prog = realize(tp, name, mode="reduce-scatter", segment=2 if n < 100 else 4000)
            check(prog)
            chunks = sorted(prog.chunks)
            assert chunks[0][0] == 0 and chunks[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
            assert max(b - a for a, b in chunks) - min(b - a for a, b in chunks) <= 1


def test_butterflies_apply_exactly_to_rank_partitioned_tops():
    ok = plan(pairwise(range(16), 4), None, 4, size=4)
    assert applicable(ok)["butterfly"] is None and applicable(ok)["halving"] is None
    # A mirrored balanced top is still a butterfly (both partners add left then right).
    mirrored = Branch(Branch(Leaf(1, 1), Leaf(0, 0), 1), Branch(Leaf(3, 3), Leaf(2, 2), 3), 1)
    check(realize(plan(mirrored, None, 3, size=4), "butterfly"))
    # Any rank count, and any top whose branches join disjoint rank sets (a star over ranks too).
    for tree, size in ((pairwise(range(6), 3), 3), (pairwise(range(8), 6), 6), (star(range(4), 4), 4)):
        tp = plan(tree, None, 4, size=size)
        assert applicable(tp)["butterfly"] is None and applicable(tp)["halving"] is None
        for name in ("butterfly", "halving"):
            check(realize(tp, name))
    for tree, size in (
        (pairwise(range(6), 2), 2),  # blocks [0,3) [3,6) are not subtrees
        (pairwise(range(8), 3), 3),  # blocks of 3, 3, 2 slots: rank 0 holds [0,2) and 2
        (hierarchy(range(8), 4, 2), 4),
    ):
        tp = plan(tree, None, 4, size=size)
        assert "not rank-partitioned" in applicable(tp)["butterfly"]
        assert "several operands" in applicable(tp)["halving"]
        with pytest.raises(Refusal) as e:
            realize(tp, "halving")
        assert e.value.code == "realization-inapplicable" and e.value.context["applicable"] == [
            "tree",
            "scatter",
            "replicate",
        ]
    with pytest.raises(Refusal) as e:
        realize(ok, "tree", mode="reduce-scatter")
    assert e.value.code == "realization-inapplicable"


@pytest.mark.parametrize("name, sends", [("butterfly", 10), ("halving", 20), ("tree", None)])
def test_1024_ranks_on_paper(name, sends):
    tp = plan(pairwise(range(1024), 1024), None, 1024, size=1024)
    cost = check(realize(tp, name))
    if sends is not None:
        assert cost.sends_per_rank_max == sends and cost.rounds == sends
    if name == "halving":  # 2(p-1)/p of the vector per rank
        assert cost.bytes_per_rank_max <= 2 * 8 * 1024


def test_replicate_at_256_ranks_any_tree():
    tp = plan(hierarchy(range(256), 256, 3), None, 1, size=256)
    cost = check(realize(tp, "replicate"))
    assert cost.rounds == 8 and cost.sends_per_rank_max == 8


def test_the_checker_refuses_a_swapped_operand_and_a_write_under_a_send():
    tp = plan(pairwise(range(4), 2), None, 3, size=2)
    prog = realize(tp, "butterfly")
    r0 = prog.rank(0)
    ev = r0.evals[-1]
    swapped = Eval((ev.inputs[1], ev.inputs[0]), ev.program, ev.output)
    prog._ranks[0] = _replace(r0, evals=r0.evals[:-1] + (swapped,))
    with pytest.raises(Refusal) as e:
        check(prog)
    assert e.value.code == "plan-simulation-failed" and "another expression" in str(e.value)
    # The same data-flow with the first send's completion (D) moved to the end: an E then
    # writes over the region the send still reads.
    big = realize(plan(pairwise(range(2), 2), None, 9000, size=2), "butterfly")
    r0 = big.rank(0)
    assert any(o.kind == "D" for o in r0.ops)
    ops = [o for o in r0.ops if o.kind != "D"] + [o for o in r0.ops if o.kind == "D"]
    big._ranks[0] = _replace(r0, ops=tuple(ops))
    check(big)  # one round: the E writes `out`, never the leaf it sends from, so still fine
    # Large payloads reuse dead work buffers: a D then guards a later write to its region, and
    # moving that D to the end must be refused.
    wide = realize(plan(pairwise(range(16), 16), None, 9000, size=16), "butterfly")
    r, d = _guarding_d(wide)
    rp = wide.rank(r)
    ops = [o for o in rp.ops if o != d] + [d]
    wide._ranks[r] = _replace(rp, ops=tuple(ops))
    with pytest.raises(Refusal) as e:
        check(wide)
    assert "still sent from" in str(e.value)


def _guarding_d(prog):
    """(rank, D op) whose send region is written (by an E, a C or a receive, at its W) after it."""
    for r in range(prog.size):
        rp = prog.rank(r)
        for i, o in enumerate(rp.ops):
            if o.kind != "D" or rp.regions.get(o.index) is None:
                continue
            src = rp.regions[o.index]
            for later in rp.ops[i + 1 :]:
                written = (
                    rp.evals[later.index].output
                    if later.kind == "E"
                    else rp.copies[later.index][1]
                    if later.kind == "C"
                    else rp.regions.get(later.index)
                    if later.kind == "W"
                    else None
                )
                if written is not None and written.overlaps(src):
                    return r, o
    raise AssertionError("no D guards a later write: the test data does not exercise reuse")


def _replace(rp, **kw):
    return rp.replace(**kw)


def test_ops_print_and_parse():
    for text in ("P3", "S12", "W0", "D7", "E2", "C1", "F0"):
        assert str(Op.parse(text)) == text
    with pytest.raises(Refusal) as e:
        Op.parse("X3")
    assert e.value.code == "step-parse-error"


def test_cost_model_prefers_latency_for_small_and_bandwidth_for_large_payloads():
    cal = Calibration()
    small = plan(pairwise(range(8), 4), None, 1, size=4)
    large = plan(pairwise(range(8), 4), None, 8 << 20, size=4)
    names = [k for k, v in applicable(small).items() if v is None]
    assert choose(small, names, cal)[0] == "butterfly"
    assert choose(large, names, cal)[0] == "halving"
    other = plan(star(range(8), 3), None, 1, size=3)
    assert choose(other, ["tree", "scatter", "replicate"], cal)[0] in ("replicate", "tree")
    assert all(estimate(large, k, cal) > 0 for k in names)


def test_calibration_file_changes_the_choice_and_a_bad_one_is_refused(tmp_path, monkeypatch):
    f = tmp_path / "cal.json"
    f.write_text(json.dumps({"alpha": 1.0, "beta": 0.0, "gamma": 0.0}))  # latency is all that costs
    monkeypatch.setenv("ALPHA_MPI_CALIBRATION", str(f))
    cal = load_calibration()
    large = plan(pairwise(range(8), 4), None, 8 << 20, size=4)
    assert choose(large, ["butterfly", "halving"], cal)[0] == "butterfly"
    f.write_text('{"alpha": -1, "beta": 0, "gamma": 0}')
    with pytest.raises(Refusal) as e:
        load_calibration()
    assert e.value.code == "calibration-invalid"
    f.write_text("not json")
    with pytest.raises(Refusal) as e:
        load_calibration()
    assert e.value.code == "calibration-invalid"


def test_traffic_counts_without_simulation():
    tp = plan(pairwise(range(8), 8), None, 100, size=8)
    c = count(realize(tp, "butterfly"))
    assert c.sends == [3] * 8 and c.bytes_sent == [3 * 800] * 8


def test_builders_name_their_shape_as_the_search_would():
    from alpha_mpi.model.topology import classify, classify_slowly

    for n in range(1, 41):
        for t in [star(range(n)), pairwise(range(n))] + [hierarchy(range(n), None, k) for k in range(1, 7)]:
            assert classify(t) == classify_slowly(t), (n, classify(t), classify_slowly(t))


def test_planning_100000_slots_and_a_deep_hierarchy_stay_near_linear():
    """A hang guard (generous bound), not a timing assertion: O(n^2) would take minutes."""
    import subprocess
    import sys

    for args in (["--slots", "100000"], ["--slots", "16000", "--topology", "hierarchy:100000000"]):
        r = subprocess.run(
            [sys.executable, "-m", "alpha_mpi", "plan", "--ranks", "4", "--format", "json", *args],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        d = json.loads(r.stdout)
        assert d["size"] == 4 and sum(d["traffic"]["sent_msgs"]) > 0


def test_the_0_1_keywords_are_gone_and_unknown_ones_are_a_type_error():
    """crossover_bytes= and depth= (0.1; ignored with a warning through 0.2's development) and
    0.1's sixth positional argument are TypeErrors now, like any other unknown argument."""
    from mpi4py import MPI

    from alpha_mpi.execution import Allreducer, ScatterCombiner, allreduce
    from alpha_mpi.planning import plan_scatter

    tree = pairwise(range(2), 1)
    a = Allreducer(MPI.COMM_SELF, tree, 4)
    with pytest.warns(DeprecationWarning, match="Allreducer.order_id is deprecated"):
        assert a.order_id == a.layout_order_id == a.plan.layout_order_id
    a.free()
    for kw in ({"crossover_bytes": 1 << 16}, {"depth": 2}, {"crossover": 1}):
        with pytest.raises(TypeError, match=repr(next(iter(kw)))):
            Allreducer(MPI.COMM_SELF, tree, 4, **kw)
    with pytest.raises(TypeError, match="positional"):
        Allreducer(MPI.COMM_SELF, tree, 4, None, "auto", 1 << 16)
    with pytest.raises(TypeError, match="'depth'"):
        ScatterCombiner(MPI.COMM_SELF, plan_scatter(tree, None, 4, size=1), depth=2)
    x = {0: np.arange(4.0), 1: np.ones(4)}
    with pytest.raises(TypeError, match="'crossover_bytes'"):
        allreduce(MPI.COMM_SELF, tree, x, crossover_bytes=0)
    assert np.array_equal(allreduce(MPI.COMM_SELF, tree, x), np.arange(4.0) + 1)


def test_two_latencies_charge_further_messages_of_a_round_apart(tmp_path, monkeypatch):
    """scatter posts p-1 messages in each of its two rounds: with α_msg = α it costs what the
    one-latency model charged (2(p-1) α), with α_msg = 0 two rounds; a 0.1 file (no α_msg)
    charges messages like rounds."""
    tp = plan(star(range(10), 5), None, 1, size=5)
    f = tmp_path / "cal.json"
    f.write_text(json.dumps({"alpha": 1e-3, "beta": 0.0, "gamma": 0.0}))
    monkeypatch.setenv("ALPHA_MPI_CALIBRATION", str(f))
    old = load_calibration()
    assert old.alpha_msg == old.alpha and estimate(tp, "scatter", old) == pytest.approx(2 * 4 * 1e-3)
    f.write_text(json.dumps({"alpha": 1e-3, "alpha_msg": 0.0, "beta": 0.0, "gamma": 0.0}))
    cheap = load_calibration()
    assert estimate(tp, "scatter", cheap) == pytest.approx(2 * 1e-3)
    assert estimate(tp, "replicate", cheap) == estimate(tp, "replicate", old)  # one message a round
    assert cheap.to_dict()["alpha_msg"] == 0.0
    f.write_text(json.dumps({"alpha": 1e-3, "alpha_msg": -1, "beta": 0.0, "gamma": 0.0}))
    with pytest.raises(Refusal) as e:
        load_calibration()
    assert e.value.code == "calibration-invalid"


def test_the_per_run_cost_is_added_once_to_every_realization_and_never_changes_the_choice(
    tmp_path, monkeypatch
):
    """α0 (the call into the executor) is the same for every realization: it adds to every
    estimate alike, so the choice is the one without it; files without it (0.1, 0.2) read as 0."""
    f = tmp_path / "cal.json"
    monkeypatch.setenv("ALPHA_MPI_CALIBRATION", str(f))
    base = {"alpha": 2e-6, "alpha_msg": 1e-6, "beta": 0.2e-9, "gamma": 0.2e-9}
    f.write_text(json.dumps(base))
    without = load_calibration()
    assert without.alpha0 == 0.0
    f.write_text(json.dumps({**base, "alpha0": 5e-6}))
    with_fixed = load_calibration()
    assert with_fixed.to_dict()["alpha0"] == 5e-6
    for size, n in ((4, 1), (4, 1 << 20), (8, 3000)):
        tp = plan(pairwise(range(2 * size), size), None, n, size=size)
        names = [k for k, v in applicable(tp).items() if v is None]
        a, ea = choose(tp, names, without)
        b, eb = choose(tp, names, with_fixed)
        assert a == b
        assert all(eb[k] == pytest.approx(ea[k] + 5e-6) for k in names)
    f.write_text(json.dumps({**base, "alpha0": -1}))
    with pytest.raises(Refusal) as e:
        load_calibration()
    assert e.value.code == "calibration-invalid"
