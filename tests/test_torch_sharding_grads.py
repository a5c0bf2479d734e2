"""partition="grads" (ZeRO-2) for torch, in one process (issue 43): the slot fold (each rank's
single-owner subtrees evaluated as slots finish) against the independent oracle, with its
buffers counted; the collapsed tree the reduce-scatter runs, evaluated by the oracle, gives the
whole tree's bits; the reduce-scatter payload's regions read back by name; on one rank the
shard is the whole `.grad` of partition="none" bit for bit, `.grad` stays None, accumulation,
zero_grad and a refused step behave as in none; the refusals by name; dp.memory(). The rank-count
runs are tests/test_torch_sharding_grads_mpi.py's."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import alpha_mpi.oracle as oracle  # noqa: E402
from alpha_mpi.model import build  # noqa: E402
from alpha_mpi.model.tree import leaf_sequence  # noqa: E402
from alpha_mpi.refusals import Refusal  # noqa: E402
from alpha_mpi.torch import DataParallel  # noqa: E402
from alpha_mpi.torch.payload import PayloadLayout  # noqa: E402
from alpha_mpi.torch.shard_combine import ChunkReader, ScatterLayout, SlotFold, collapse  # noqa: E402
from alpha_mpi.torch.sharding import ShardLayout  # noqa: E402

from conftest import random_tree  # noqa: E402
from lm_common import batch, lm, token_pair  # noqa: E402
from torch_common import comm_self  # noqa: E402


def _leaf_values(slots, width, seed):
    """Values over twelve decades with both signs: a sum in another order rounds otherwise."""
    rng = np.random.default_rng(seed)
    return {s: rng.standard_normal(width) * 10.0 ** rng.integers(-6, 6, width) for s in range(slots)}


def _trees():
    yield "pairwise 16 on 4", build("pairwise", range(16), 4)
    yield "pairwise 13 on 3", build("pairwise", range(13), 3)
    yield "pairwise 7 on 1", build("pairwise", range(7), 1)
    yield "star 6 on 2", build("star", range(6), 2)
    yield "hierarchy:2 9 on 3", build("hierarchy:2", range(9), 3)
    for seed in range(4):
        yield f"random 11 on 3 ({seed})", random_tree(range(11), 3, seed)


@pytest.mark.parametrize("name,tree", list(_trees()))
def test_the_fold_gives_each_single_owner_subtree_the_oracles_bits_in_any_finishing_order(name, tree):
    width = 64
    values = _leaf_values(max(leaf.slot for leaf in leaf_sequence(tree)) + 1, width, 7)
    top, ops = collapse(tree)
    for rank in sorted({o.owner for o in ops}):
        mine = [o for o in ops if o.owner == rank]
        slots = [leaf.slot for o in mine for leaf in leaf_sequence(o.node)]
        for order in (slots, slots[::-1]):
            fold = SlotFold(mine, width, lambda src, dst: np.copyto(dst, src))
            for s in order:
                fold.push(s, values[s])
            assert fold.done and sorted(fold.values) == [o.index for o in mine]
            for o in mine:
                want = oracle.bits(oracle.evaluate(o.node, {s: values[s].tolist() for s in values}))
                assert fold.values[o.index].view(np.uint64).tolist() == want, (name, rank, o.index)
        # In tree order, at most the postorder stack along one path plus the finished subtrees.
        depth = max(o.node.depth for o in mine)
        assert fold.planned <= depth + len(mine), (name, fold.planned)


def test_the_fold_of_a_rank_s_slots_holds_log_buffers_not_one_per_slot():
    tree = build("pairwise", range(64), 2)  # 32 slots per rank, one subtree each
    _, ops = collapse(tree)
    mine = [o for o in ops if o.owner == 0]
    fold = SlotFold(mine, 4, lambda src, dst: np.copyto(dst, src))
    for s in range(32):
        fold.push(s, np.full(4, float(s)))
    assert fold.planned == fold.peak == 6  # log2(32) + 1, not 32
    assert fold.values[mine[0].index].tolist() == [float(sum(range(32)))] * 4


@pytest.mark.parametrize("seed", range(6))
def test_the_collapsed_tree_over_the_subtrees_values_is_the_whole_trees_expression(seed):
    tree = random_tree(range(12), 4, seed)
    values = {s: v.tolist() for s, v in _leaf_values(12, 16, seed).items()}
    top, ops = collapse(tree)
    assert [leaf.slot for leaf in leaf_sequence(top)] == [o.index for o in ops]
    sub = {o.index: oracle.evaluate(o.node, values) for o in ops}
    assert oracle.bits(oracle.evaluate(top, sub)) == oracle.bits(oracle.evaluate(tree, values))
    # the data make the order visible: the chain over the same slots gives other bits
    chain = oracle.chain([values[s] for s in range(12)])
    assert oracle.bits(chain) != oracle.bits(oracle.evaluate(tree, values))


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_region_r_of_the_scatter_payload_is_rank_rs_shard_and_the_tail(p):
    params = [torch.zeros(700), torch.zeros(3, 300), torch.zeros(5)]
    payload = PayloadLayout.of(params, [], 6)
    shards = ShardLayout.of(payload.offsets, p)
    sl = ScatterLayout.of(payload, shards)
    src = np.arange(1.0, payload.total + 1)
    dst = np.zeros(sl.words)
    sl.scatter(src, dst)
    for r, (a, b) in enumerate(shards.bounds):
        region = dst[r * sl.width : (r + 1) * sl.width]
        read = ChunkReader(payload, b - a, sl.shard_width)
        assert read.gradient(region).tolist() == src[a:b].tolist()
        assert not region[b - a : sl.shard_width].any()  # the padding: +0
        for at in ("mass_at", "loss_at", "inf_at", "stop_at"):
            assert region[getattr(read, at)] == src[getattr(payload, at)]
        assert read.sizes(region).tolist() == payload.sizes(src).tolist()
        assert read.agreement(region).tolist() == payload.agreement(src).tolist()
        assert read.used(region).tolist() == payload.used(src).tolist()


def _groups(model):
    named = list(model.named_parameters())
    return [
        {"params": [p for _, p in named if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0},
    ]


def _flat_grads(model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy()


def test_on_one_rank_the_shard_holds_the_whole_grad_of_none_and_grad_stays_none():
    a, b = lm(), lm()
    none = DataParallel(a, comm_self(), slots=4, seed=1, partition="none")
    grads = DataParallel(b, comm_self(), slots=4, seed=1, partition="grads")
    opt = grads.optimizer(torch.optim.AdamW, _groups(b), lr=1e-3)
    for accumulate in (False, True):  # overwrite, then added to the held gradient
        none.step(*batch(0, 12), token_pair, accumulate=accumulate)
        grads.step(*batch(0, 12), token_pair, accumulate=accumulate)
        assert all(p.grad is None for p in b.parameters())
        assert np.array_equal(grads.grads.flat.numpy().view(np.uint32), _flat_grads(a).view(np.uint32))
    n1, n2 = none.clip_grad_norm_(0.01), grads.clip_grad_norm_(0.01)
    assert n1.item() > 0.01 and n1.numpy().view(np.uint32) == n2.numpy().view(np.uint32)
    assert np.array_equal(grads.grads.flat.numpy().view(np.uint32), _flat_grads(a).view(np.uint32))
    # what the sharded optimizer's shard tensors see is the shard
    opt.step()
    views = [v for g in opt.param_groups for v in g["params"]]
    assert all(v.grad is not None for v in views)
    opt.zero_grad()
    opt.step()
    assert all(v.grad is None for v in views)  # zero_grad cleared the shard: the step did nothing
    none.free()
    grads.free()


def test_a_refused_step_leaves_no_gradient_in_the_shard():
    b = lm()
    dp = DataParallel(b, comm_self(), slots=4, partition="grads")
    opt = dp.optimizer(torch.optim.SGD, b.parameters(), lr=0.1, momentum=0.9)
    dp.step(*batch(0, 12), token_pair)
    before = [p.detach().clone() for p in b.parameters()]
    x, y = batch(0, 12)
    with pytest.raises(Refusal):
        dp.step(x, y, lambda out, yy: (token_pair(out, yy)[0] * float("nan"), token_pair(out, yy)[1]))
    opt.step()  # after a refusal: nothing to apply, as with .grad None in partition="none"
    assert all(torch.equal(p, q) for p, q in zip(b.parameters(), before))
    dp.free()


@pytest.mark.parametrize("kw", [{"bucket_mb": 1.0}, {"audit_slots": 1}, {"realization": "halving"}])
def test_options_that_need_every_slots_whole_payload_are_refused_in_grads_mode(kw):
    with pytest.raises(Refusal) as e:
        DataParallel(lm(), comm_self(), slots=4, partition="grads", **kw)
    assert e.value.code == "options-conflict" and next(iter(kw)) in str(e.value)
    if "audit_slots" not in kw:  # (the audit needs two ranks)
        DataParallel(lm(), comm_self(), slots=4, partition="state", **kw).free()  # state takes it


def test_memory_in_grads_mode_counts_the_shard_and_the_folds_buffers():
    b = lm()
    slots = 16
    dp = DataParallel(b, comm_self(), slots=slots, partition="grads")
    opt = dp.optimizer(torch.optim.AdamW, b.parameters(), lr=1e-3)
    dp.step(*batch(0, 32), token_pair)
    opt.step()
    m = dp.memory(opt)
    n = dp.n
    assert m["grads"] == 4 * n and m["params"] == 4 * n and m["optimizer_state"] >= 8 * n
    words = dp.combine.scatter_layout.words
    assert dp.combine.fold.planned == int(math.log2(slots)) + 1
    assert m["peak"] - m["at_rest"] == 4 * n + 8 * dp.payload.total + 8 * words * dp.combine.fold.planned
    none = DataParallel(lm(), comm_self(), slots=slots, partition="none")
    # none keeps one payload per owned slot between steps; grads frees its fold at the step's end
    assert none.memory()["accumulators"] > 8 * slots * n > m["accumulators"]
    dp.free()
    none.free()
