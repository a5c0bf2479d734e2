"""Sharded optimizer state for torch over MPI (issue 43): `DataParallel(partition="state")` with
torch's AdamW over parameter groups (decay / no decay), a warmup-cosine LambdaLR and
`dp.clip_grad_norm_` trains to the state digest of `partition="none"` on 1 rank, the whole world
and groups of 2, 3 and 4 ranks, DDP's no_sync accumulation included; a checkpoint saved on 4
ranks in one mode resumes on 2 in the other to the uninterrupted digest; the optimizer state
per rank shrinks with the rank count; and a rank that builds a refused optimizer, or names an
unknown mode, is refused by name on every rank, the next call working. Holds at any size >= 2
(the 4 -> 2 resume needs 4); skips without torch."""

import math
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")

from alpha_mpi.refusals import Refusal  # noqa: E402
from alpha_mpi.torch import DataParallel  # noqa: E402

from conftest import agree, groups  # noqa: E402
from lm_common import batch, lm, token_pair  # noqa: E402

SLOTS = 8
STEPS = 6
WARMUP = 2


def decay_groups(model):
    """nanoGPT's AdamW groups: weight decay on the matrices, none on biases, norms."""
    named = list(model.named_parameters())
    return [
        {"params": [p for _, p in named if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0, "lr": 2e-3},
    ]


def warmup_cosine(t):
    return (t + 1) / WARMUP if t < WARMUP else 0.5 * (1 + math.cos(math.pi * (t - WARMUP) / STEPS))


def train(
    comm, partition, steps=STEPS, *, start=None, ckpt=None, save_at=None, memory=False, accum=1, clip=0.05
):
    """The token model trained to `steps` updates of `accum` batches (accum - 1 under no_sync),
    clipped to `clip` (None: not), restored from `start`, saved at `save_at`: its state digest
    (and dp.memory(opt) with `memory`)."""
    torch.set_num_threads(1)
    model = lm()
    dp = DataParallel(model, comm, slots=SLOTS, seed=2, timeout=120, partition=partition)
    opt = dp.optimizer(torch.optim.AdamW, decay_groups(model), lr=3e-3, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine)
    dp.register("scheduler", sched)  # in the state digest of every run, resumed or not
    if start:
        dp.restore(start, opt, scheduler=sched)
    while dp.updates < steps:
        if accum > 1:
            with dp.no_sync():  # steps inside write no .grad: the update divides the block's sums once
                for _ in range(accum - 1):
                    dp.step(*batch(dp.steps * 20, 20), token_pair)
        dp.step(*batch(dp.steps * 20, 20), token_pair)
        if clip:
            dp.clip_grad_norm_(clip)
        opt.step()
        opt.zero_grad()
        sched.step()
        if ckpt and dp.updates == save_at:
            dp.save(ckpt, opt, scheduler=sched)
    out = dp.state_digest(opt), (dp.memory(opt) if memory else None)
    dp.free()
    return out


def shared_dir(world):
    return world.bcast(tempfile.mkdtemp(prefix="alpha-zero-") if world.Get_rank() == 0 else None, root=0)


@pytest.mark.mpi(min_size=2)
def test_state_partition_gives_the_digest_of_none_on_every_rank_count(world):
    from mpi4py import MPI

    alone, _ = train(MPI.COMM_SELF, "none")
    for comm in [MPI.COMM_SELF, world, *groups(world, sizes=(2, 3, 4))]:
        for partition in ("none", "state"):
            d, _ = train(comm, partition)
            agree(world, d == alone, f"{partition} on {comm.Get_size()} ranks: {d[:12]} vs {alone[:12]}")


@pytest.mark.mpi(min_size=2)
def test_no_sync_accumulation_in_state_mode_gives_the_bits_of_none(world):
    """Under no_sync the micro-steps write no .grad and the update divides the carried sums
    once (alpha_mpi.torch.accumulation): the sharded optimizer then sees the same .grad."""
    from mpi4py import MPI

    alone, _ = train(MPI.COMM_SELF, "none", steps=3, accum=2)
    for comm in [world, *groups(world, sizes=(2,))]:
        d, _ = train(comm, "state", steps=3, accum=2)
        agree(world, d == alone, f"accum 2, state on {comm.Get_size()} ranks: {d[:12]} vs {alone[:12]}")
    plain, _ = train(MPI.COMM_SELF, "none", steps=3)
    agree(world, plain != alone, "accumulating 2 batches gave the digest of 1")


@pytest.mark.mpi(min_size=2)
def test_the_data_make_a_wrong_update_visible(world):
    """The comparison above can fail: one step fewer, or no clipping, gives another digest."""
    from mpi4py import MPI

    full, _ = train(MPI.COMM_SELF, "none")
    short, _ = train(world, "state", steps=STEPS - 1)
    agree(world, short != full, "a step fewer gave the same digest")
    unclipped, _ = train(world, "state", clip=None)
    agree(world, unclipped != full, "no clipping gave the same digest")


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("saved,resumed", [("state", "none"), ("none", "state"), ("state", "state")])
def test_saved_on_4_in_one_mode_resumes_on_2_in_another_to_the_uninterrupted_digest(world, saved, resumed):
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
def test_optimizer_state_per_rank_shrinks_with_the_ranks(world):
    from mpi4py import MPI

    _, one = train(MPI.COMM_SELF, "state", steps=1, memory=True)
    _, mine = train(world, "state", steps=1, memory=True)
    most = max(world.allgather(mine["optimizer_state"]))
    p = world.Get_size()
    # The shards are whole blocks of the grid: at most one block (2 vectors x 512 x 4 bytes)
    # over the even share, and the per-parameter steps of the pieces a rank holds.
    bound = one["optimizer_state"] / p + 2 * 512 * 4 + 4 * 64
    agree(
        world, most <= bound, f"{most} bytes of optimizer state on {p} ranks, p=1: {one['optimizer_state']}"
    )
    agree(world, mine["params"] == one["params"] and mine["grads"] == one["grads"], f"{mine} vs {one}")


@pytest.mark.mpi(min_size=2)
def test_a_refused_optimizer_on_one_rank_is_named_on_every_rank_and_the_next_call_works(world):
    model = lm()
    dp = DataParallel(model, world, slots=SLOTS, timeout=120, partition="state")
    odd = world.Get_size() - 1
    cls = torch.optim.RMSprop if world.Get_rank() == odd else torch.optim.AdamW
    try:
        dp.optimizer(cls, model.parameters(), lr=1e-3)
        got = None
    except Refusal as e:
        got = (e.code, e.context.get("peer"), e.context.get("peer_code"))
    want = (
        ("torch-optimizer-unsharded", None, None)
        if world.Get_rank() == odd
        else ("peer-refused", odd, "torch-optimizer-unsharded")
    )
    agree(world, got == want, f"refused as {got}")
    opt = dp.optimizer(torch.optim.AdamW, model.parameters(), lr=1e-3)
    dp.step(*batch(0, 20), token_pair)
    opt.step()
    agree(world, dp.steps == 1, "the next call works")
    dp.free()


@pytest.mark.mpi(min_size=2)
def test_an_unknown_mode_on_one_rank_is_named_on_every_rank(world):
    odd = world.Get_size() - 1
    try:
        DataParallel(
            lm(), world, slots=SLOTS, timeout=120, partition="zero1" if world.Get_rank() == odd else "state"
        )
        got = None
    except Refusal as e:
        got = (e.code, e.context.get("peer"), e.context.get("peer_code"))
    want = (
        ("torch-partition-unknown", None, None)
        if world.Get_rank() == odd
        else ("peer-refused", odd, "torch-partition-unknown")
    )
    agree(world, got == want, f"refused as {got}")
    dp = DataParallel(lm(), world, slots=SLOTS, timeout=120, partition="state")
    agree(world, dp.partition == "state", "the next construction works")
    dp.free()


def _tiny(comm, partition, steps=4):
    """A module smaller than one block: every rank but one holds an empty shard."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    dp = DataParallel(net, comm, slots=SLOTS, timeout=120, partition=partition)
    opt = dp.optimizer(torch.optim.SGD, net.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    g = torch.Generator().manual_seed(3)
    X, y = torch.randn(40, 3, generator=g), torch.randint(0, 2, (40,), generator=g)
    loss = torch.nn.CrossEntropyLoss(reduction="sum")
    for t in range(steps):
        dp.step(X[10 * (t % 3) : 10 * (t % 3) + 16], y[10 * (t % 3) : 10 * (t % 3) + 16], loss)
        opt.step()
        opt.zero_grad()
    out = dp.state_digest(opt)
    dp.free()
    return out


@pytest.mark.mpi(min_size=2)
def test_a_module_smaller_than_a_block_and_sgd_with_momentum_keep_the_bits(world):
    from mpi4py import MPI

    alone = _tiny(MPI.COMM_SELF, "none")
    for comm in [world, *groups(world)]:
        d = _tiny(comm, "state")
        agree(world, d == alone, f"on {comm.Get_size()} ranks: {d[:12]} vs {alone[:12]}")
