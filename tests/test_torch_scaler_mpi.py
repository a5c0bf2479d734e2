"""ShardedGradScaler (alpha_mpi.torch.scaling): float16 loss scaling in the sharded partitions.

The token model under float16 autocast, AdamW, a scale that overflows at step 0 (the update
skipped on every rank, the scale backed off to 2^12) and then grows (2^13 after two clean
steps): every sharded partition with a ShardedGradScaler trains to the digest and the scales of
`partition="none"` with torch's own GradScaler on one rank, on the whole world and on groups
of it, with and without `scaler.unscale_(opt)` + `dp.clip_grad_norm_` between the step and the
update (the clipping sees the unscaled gradient); a model whose shards are empty on some ranks
too (the empty ranks record the overflow from the combined flag), and with fused AdamW (the
scale applied inside its update). torch's GradScaler there and
`scaler.step(opt)` before any step are refused by name. Holds at any size >= 2."""

import os
import tempfile

import pytest

torch = pytest.importorskip("torch")

from alpha_mpi.torch import DataParallel, ShardedGradScaler  # noqa: E402

from conftest import agree, groups, refusal_code  # noqa: E402
from lm_common import batch, lm, token_pair  # noqa: E402

SLOTS = 8
SCALE = dict(init_scale=2.0**24, backoff_factor=2.0**-12, growth_interval=2)


def _overflowed_then_grew(scales) -> bool:
    """The first step overflowed (backed off by 2^-12) and a later one grew the scale."""
    return scales[0] == SCALE["init_scale"] * SCALE["backoff_factor"] and scales[-1] > min(scales)


def _tiny():
    """Two scalars: on more than two ranks some shards are empty."""
    torch.manual_seed(3)
    return torch.nn.Linear(1, 1)


def _tiny_batch(t):
    x = torch.linspace(-1.0, 1.0, 16).reshape(16, 1) * (t + 1)
    return x, 3.0 * x + 0.5


def _tiny_loss(out, y):
    return ((out.float() - y) ** 2).sum(), y.shape[0]


def train(comm, partition, clip=False, tiny=False, fused=False, steps=4, save=None, start=None):
    """(digest, the scale after each step run here). `save`: checkpoint directory written after
    step 2, then stop; `start`: a checkpoint to resume from (the scaler rides in it, registered)."""
    torch.set_num_threads(1)
    model = _tiny() if tiny else lm()
    dp = DataParallel(
        model, comm, slots=SLOTS, seed=2, timeout=120, autocast=torch.float16, partition=partition
    )
    if partition == "none":
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=fused)
    else:
        opt = dp.optimizer(torch.optim.AdamW, model.parameters(), lr=3e-3, fused=fused)
    # torch's own in "none" (the reference), unless resuming: the checkpoint names the class
    plain = partition == "none" and start is None
    scaler = (torch.amp.GradScaler if plain else ShardedGradScaler)("cpu", **SCALE)
    dp.register("loss scaler", scaler)
    if start is not None:
        dp.restore(start, opt)
    scales = []
    for t in range(dp.updates, steps):
        if tiny:
            dp.step(*_tiny_batch(t), _tiny_loss, scaler=scaler)
        else:
            dp.step(*batch(t * 20, 20), token_pair, scaler=scaler)
        if clip:
            scaler.unscale_(opt)
            dp.clip_grad_norm_(0.05)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        scales.append(scaler.get_scale())
        if save is not None and t + 1 == 2:
            dp.save(save, opt)
            break
    digest = dp.digest()
    dp.free()
    return digest, scales


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("clip", [False, True])
def test_every_sharded_partition_with_a_sharded_grad_scaler_gives_the_bits_of_none(world, clip):
    from mpi4py import MPI

    alone = train(MPI.COMM_SELF, "none", clip)
    agree(world, _overflowed_then_grew(alone[1]), f"the overflow and the growth did not happen: {alone[1]}")
    if clip:  # the clipping changed the update: it saw the gradient
        agree(world, alone[0] != train(MPI.COMM_SELF, "none")[0], "clipping changed nothing")
    for comm in [world, *groups(world)] if not clip else [world]:
        for partition in ("state", "grads", "params"):
            got = train(comm, partition, clip)
            agree(world, got == alone, f"{partition} on {comm.Get_size()} ranks: {got} vs {alone}")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("partition", ["state", "grads", "params"])
def test_ranks_with_an_empty_shard_skip_and_scale_alike(world, partition):
    from mpi4py import MPI

    alone = train(MPI.COMM_SELF, "none", tiny=True)
    agree(world, _overflowed_then_grew(alone[1]), f"the overflow and the growth did not happen: {alone[1]}")
    got = train(world, partition, tiny=True)
    agree(world, got == alone, f"{partition}: {got} vs {alone}")


@pytest.mark.mpi(min_size=2)
def test_a_fused_optimizer_takes_the_scale_inside_its_step_alike(world):
    """fused AdamW: torch's GradScaler hands the scale and the overflow to the fused update
    (`_step_supports_amp_scaling`) instead of unscaling first; the ShardedGradScaler's overflow
    check records the combined flag there too."""
    from mpi4py import MPI

    alone = train(MPI.COMM_SELF, "none", fused=True)
    agree(world, alone[0] != train(MPI.COMM_SELF, "none")[0], "fused gave the for-loop's bits: not fused")
    for partition in ("state", "grads", "params"):
        got = train(world, partition, fused=True)
        agree(world, got == alone, f"{partition}: {got} vs {alone}")


@pytest.mark.mpi(min_size=2)
def test_a_sharded_grad_scaler_refuses_an_update_before_a_step_and_torchs_scaler_is_named(world):
    """scaler.step(opt) before any step; torch's GradScaler in a sharded mode; opt.step() of a
    gradient that still carries the scale (every rank refuses, nothing changes): each named, and
    scaler.step(opt) then updates."""
    model = lm()
    dp = DataParallel(model, world, slots=SLOTS, timeout=120, partition="grads", autocast=torch.float16)
    opt = dp.optimizer(torch.optim.AdamW, model.parameters(), lr=1e-3)
    scaler = ShardedGradScaler("cpu", init_scale=2.0**8)
    scaler.scale(torch.ones(()))  # torch's lazy start of the scale
    got = refusal_code(lambda: scaler.step(opt))
    agree(world, got == "usage", f"scaler.step before dp.step: {got}")
    plain = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    got = refusal_code(lambda: dp.step(*batch(0, 20), token_pair, scaler=plain))
    agree(world, got == "options-conflict", f"torch's GradScaler in grads: {got}")
    scaler = ShardedGradScaler("cpu", init_scale=2.0**8)
    dp.step(*batch(0, 20), token_pair, scaler=scaler)
    before = dp.digest()
    got = refusal_code(lambda: opt.step())  # the gradient still carries the scale
    agree(world, got == "usage" and dp.digest() == before, f"opt.step() of a scaled gradient: {got}")
    scaler.step(opt)
    scaler.update()
    agree(world, dp.updates == 1 and scaler.get_scale() == 2.0**8, "the next step and update work")
    agree(world, dp.digest() != before, "scaler.step(opt) updated nothing")
    dp.free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("saved,resumed", [("grads", "params"), ("params", "state"), ("state", "none")])
def test_a_run_saved_sharded_resumes_on_one_rank_with_its_scale_to_the_uninterrupted_bits(
    world, saved, resumed
):
    """Saved after step 2 on the whole world (the scale backed off at step 0, one clean step
    towards the growth), resumed on one rank in another mode (a ShardedGradScaler in "none"
    too: the checkpoint names the registered object's class): the growth comes at the same step
    and the digest is the uninterrupted run's (a scaler restored without its growth tracker
    would grow a step later)."""
    from mpi4py import MPI

    alone = train(MPI.COMM_SELF, "none")
    root = world.bcast(tempfile.mkdtemp(prefix="alpha-scaler-") if world.Get_rank() == 0 else None, root=0)
    ckpt = os.path.join(root, "ckpt")
    first = train(world, saved, save=ckpt)
    agree(world, first[1] == alone[1][:2], f"the first two scales: {first[1]} vs {alone[1]}")
    world.Barrier()
    rest = train(MPI.COMM_SELF, resumed, start=ckpt) if world.Get_rank() == 0 else alone
    agree(world, rest == (alone[0], alone[1][2:]) or world.Get_rank() != 0, f"{rest} vs {alone}")
