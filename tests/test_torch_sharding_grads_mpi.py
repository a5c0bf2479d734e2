"""partition="grads" (ZeRO-2) for torch over MPI (issue 43): the token model with AdamW parameter
groups, a warmup-cosine LambdaLR and `dp.clip_grad_norm_` (clipped from the shards' block sums)
trains to the state digest of `partition="none"` on 1 rank, the whole world and groups of 2, 3
and 4 ranks, DDP's no_sync accumulation included; each rank's shard of the combined gradient has
the bits of the independent oracle of the declared tree (pairwise, star and hierarchy trees,
data where another order gives other bits); a checkpoint saved in grads mode on 4 ranks resumes
on 2 in every mode (and one saved in none resumes in grads) to the uninterrupted digest; the
gradient per rank shrinks with the rank count; every refusal is named on every rank and the
next call works. Holds at any size >= 2 (the 4 -> 2 resume needs 4); skips without torch."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_torch_sharding_mpi import SLOTS, STEPS, shared_dir, train  # noqa: E402

import alpha_mpi.oracle as oracle  # noqa: E402
from alpha_mpi.refusals import Refusal  # noqa: E402
from alpha_mpi.torch import DataParallel  # noqa: E402

from conftest import agree, groups  # noqa: E402
from lm_common import batch, lm, token_pair  # noqa: E402


@pytest.mark.mpi(min_size=2)
def test_grads_partition_gives_the_digest_of_none_on_every_rank_count(world):
    from mpi4py import MPI

    alone, _ = train(MPI.COMM_SELF, "none")
    for comm in [MPI.COMM_SELF, world, *groups(world, sizes=(2, 3, 4))]:
        d, _ = train(comm, "grads")
        agree(world, d == alone, f"grads on {comm.Get_size()} ranks: {d[:12]} vs {alone[:12]}")
    unclipped, _ = train(world, "grads", clip=None)
    agree(world, unclipped != alone, "no clipping gave the same digest: the clip was not seen")


@pytest.mark.mpi(min_size=2)
def test_no_sync_accumulation_in_grads_mode_gives_the_bits_of_none(world):
    """Under no_sync each micro-step's combined shard is carried (accumulation.py, over the
    shard's words) and the update divides the sums once: the shard holds none's `.grad`."""
    from mpi4py import MPI

    alone, _ = train(MPI.COMM_SELF, "none", steps=3, accum=2)
    for comm in [world, *groups(world, sizes=(3,))]:
        d, _ = train(comm, "grads", steps=3, accum=2)
        agree(world, d == alone, f"accum 2, grads on {comm.Get_size()} ranks: {d[:12]} vs {alone[:12]}")
    plain, _ = train(MPI.COMM_SELF, "none", steps=3)
    agree(world, plain != alone, "accumulating 2 batches gave the digest of 1")


def _linear(seed=0):
    torch.manual_seed(seed)  # 64·40 + 40 = 2600 words: six blocks of the grid
    return torch.nn.Linear(64, 40)


def _data(slots):
    """One sample a slot: the same input scaled by 2^40 on even slots, the target negated on
    every fourth. The loss (out · t) is linear, so slot 2's weight gradient is slot 0's negated,
    exactly, and 2^40·v + v rounds in binary64: the chain, the pairwise and the hierarchy trees
    give other bits after the one narrowing (checked below)."""
    g = torch.Generator().manual_seed(5)
    base, T = torch.randn(64, generator=g), torch.randn(40, generator=g)
    X = torch.stack([base * (2.0**40 if s % 2 == 0 else 1.0) for s in range(slots)])
    return X, torch.stack([T * (-1.0 if s % 4 == 2 else 1.0) for s in range(slots)])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("topology", ["pairwise", "star", "hierarchy:2"])
def test_each_ranks_shard_is_the_oracles_combine_of_the_declared_tree(world, topology):
    """Independent oracle: per-slot gradients of a separate copy of the module, widened by the
    oracle, the declared tree evaluated in Python floats, one division, one narrowing; the
    ranks' shards, put end to end, are those bits, and no parameter holds a `.grad`."""
    from alpha_mpi.model import build
    from alpha_mpi.torch import summed

    loss = summed(lambda out, t: (out * t).sum())
    slots = 8
    net, ref = _linear(), _linear()
    X, t = _data(slots)
    dp = DataParallel(net, world, slots=slots, topology=topology, timeout=120, partition="grads")
    dp.step(X, t, loss)
    leaves = {}
    for s in range(slots):
        ref.zero_grad()
        loss(ref(X[s : s + 1]), t[s : s + 1]).backward()
        g = torch.cat([p.grad.reshape(-1) for p in ref.parameters()]).numpy()
        leaves[s] = oracle.widen(g.view(np.uint32))
    want = oracle.narrow([v / slots for v in oracle.evaluate(dp.tree, leaves)])
    a, b = dp.grads.a, dp.grads.b
    pieces = world.allgather((a, b, dp.grads.flat.numpy().view(np.uint32).tolist()))  # the test's channel
    got = [0] * dp.n
    for lo, hi, bits in pieces:
        got[lo:hi] = bits
    agree(world, got == want, f"{topology}: the shards differ from the oracle's combine")
    agree(world, all(p.grad is None for p in net.parameters()), "a parameter holds a whole .grad")
    # the data make the order visible: another topology's tree gives other bits
    other = build("pairwise" if topology == "star" else "star", range(slots), world.Get_size())
    wrong = oracle.narrow([v / slots for v in oracle.evaluate(other, leaves)])
    agree(world, wrong != want, f"{topology}: another tree gave the declared tree's bits")
    dp.free()


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize(
    "saved,resumed", [("grads", "none"), ("grads", "state"), ("grads", "grads"), ("none", "grads")]
)
def test_saved_in_grads_mode_on_4_resumes_on_2_in_every_mode_to_the_uninterrupted_digest(
    world, saved, resumed
):
    from mpi4py import MPI

    alone, _ = train(MPI.COMM_SELF, "none")
    root = os.path.join(shared_dir(world), "ckpt")
    rank = world.Get_rank()
    four = world.Split(0 if rank < 4 else 1, rank)
    if rank < 4:
        train(four, saved, steps=3, ckpt=root, save_at=3)
    world.Barrier()
    two = world.Split(0 if rank < 2 else 1, rank)
    d = alone
    if rank < 2:
        d, _ = train(two, resumed, start=root)
    agree(world, d == alone, f"{saved} on 4 -> {resumed} on 2: {d[:12]} vs {alone[:12]}")


@pytest.mark.mpi(min_size=2)
def test_the_gradient_and_optimizer_state_per_rank_shrink_with_the_ranks(world):
    from mpi4py import MPI

    _, one = train(MPI.COMM_SELF, "grads", steps=1, memory=True)
    _, mine = train(world, "grads", steps=1, memory=True)
    p = world.Get_size()
    most = {k: max(world.allgather(mine[k])) for k in ("grads", "optimizer_state")}
    # whole blocks of the grid: at most one block over the even share (and Adam's steps)
    agree(world, most["grads"] <= one["grads"] / p + 512 * 4, f"{most} on {p} ranks, p=1: {one}")
    agree(world, most["optimizer_state"] <= one["optimizer_state"] / p + 2 * 512 * 4 + 4 * 64, f"{most}")
    agree(world, mine["params"] == one["params"], "parameters are whole on every rank")
    agree(world, mine["accumulators"] < one["accumulators"], f"{mine} vs {one}")


def _tiny(comm, partition, steps=3):
    """A module smaller than one block: one rank holds the whole shard, the others none."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    dp = DataParallel(net, comm, slots=SLOTS, timeout=120, partition=partition)
    opt = dp.optimizer(torch.optim.SGD, net.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    g = torch.Generator().manual_seed(3)
    X, y = torch.randn(40, 3, generator=g), torch.randint(0, 2, (40,), generator=g)
    loss = torch.nn.CrossEntropyLoss(reduction="sum")
    for t in range(steps):
        dp.step(X[10 * t : 10 * t + 16], y[10 * t : 10 * t + 16], loss)
        dp.clip_grad_norm_(0.1)
        opt.step()
        opt.zero_grad()
    out = dp.state_digest(opt)
    dp.free()
    return out


@pytest.mark.mpi(min_size=2)
def test_a_module_smaller_than_a_block_leaves_ranks_an_empty_shard_and_keeps_the_bits(world):
    from mpi4py import MPI

    alone = _tiny(MPI.COMM_SELF, "none")
    d = _tiny(world, "grads")
    agree(world, d == alone, f"on {world.Get_size()} ranks: {d[:12]} vs {alone[:12]}")


def _refused(world, build):
    """(code, peer, peer_code) of what `build()` raised on this rank, or None."""
    try:
        build()
    except Refusal as e:
        return (e.code, e.context.get("peer"), e.context.get("peer_code"))
    return None


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kw", [{"bucket_mb": 1.0}, {"audit_slots": 1}])
def test_an_option_grads_mode_refuses_on_one_rank_is_named_on_every_rank(world, kw):
    odd = world.Get_size() - 1
    mine = kw if world.Get_rank() == odd else {}
    got = _refused(
        world, lambda: DataParallel(lm(), world, slots=SLOTS, timeout=120, partition="grads", **mine)
    )
    want = ("options-conflict", None, None) if mine else ("peer-refused", odd, "options-conflict")
    agree(world, got == want, f"refused as {got}")
    dp = DataParallel(lm(), world, slots=SLOTS, timeout=120, partition="grads")
    agree(world, dp.partition == "grads", "the next construction works")
    dp.free()


@pytest.mark.mpi(min_size=2)
def test_an_optimizer_off_the_list_on_one_rank_is_named_on_every_rank_in_grads_mode(world):
    model = lm()
    dp = DataParallel(model, world, slots=SLOTS, timeout=120, partition="grads")
    odd = world.Get_size() - 1
    cls = torch.optim.RMSprop if world.Get_rank() == odd else torch.optim.AdamW
    got = _refused(world, lambda: dp.optimizer(cls, model.parameters(), lr=1e-3))
    want = (
        ("torch-optimizer-unsharded", None, None)
        if world.Get_rank() == odd
        else ("peer-refused", odd, "torch-optimizer-unsharded")
    )
    agree(world, got == want, f"refused as {got}")
    opt = dp.optimizer(torch.optim.AdamW, model.parameters(), lr=1e-3)
    dp.step(*batch(0, 20), token_pair)
    dp.clip_grad_norm_(1.0)
    opt.step()
    got = _refused(world, lambda: setattr(dp, "partition", "none"))
    agree(world, got == ("torch-partition-change", None, None), f"a mode change: {got}")
    agree(world, dp.steps == 1 and dp.updates == 1 and STEPS > 1, "the next call works")
    dp.free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("partition", ["state", "grads", "params"])
def test_a_grad_scaler_in_a_sharded_mode_on_one_rank_is_named_on_every_rank(world, partition):
    """torch's scaler.step(opt) cannot see a shard's overflow (scaling.py): the step refuses the
    scaler by name, flagged in the combine, and the next step without it works."""
    model = lm()
    dp = DataParallel(model, world, slots=SLOTS, timeout=120, partition=partition, autocast=torch.float16)
    odd = world.Get_size() - 1
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8) if world.Get_rank() == odd else None
    got = _refused(world, lambda: dp.step(*batch(0, 20), token_pair, scaler=scaler))
    want = ("options-conflict", None, None) if scaler else ("peer-refused", odd, "options-conflict")
    agree(world, got == want, f"refused as {got}")
    dp.step(*batch(0, 20), token_pair)
    agree(world, dp.steps == 1, "the next step works")
    dp.free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("partition", ["grads", "params"])
def test_torch_s_own_clipping_of_a_sharded_gradient_is_refused_on_every_rank(world, partition):
    model = lm()
    dp = DataParallel(model, world, slots=SLOTS, timeout=120, partition=partition)
    opt = dp.optimizer(torch.optim.AdamW, model.parameters(), lr=1e-3)
    dp.step(*batch(0, 20), token_pair)
    got = _refused(world, lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    agree(world, got == ("torch-clip-sharded", None, None), f"refused as {got}")
    dp.clip_grad_norm_(1.0)
    opt.step()
    agree(world, dp.updates == 1, "dp's own clipping and the update work")
    dp.free()
