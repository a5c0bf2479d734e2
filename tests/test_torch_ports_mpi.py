"""A DDP script ported without surprises (issue 44) over MPI: DDP's no_sync accumulation with
`/ accum` deleted is plain torch's token mean of the accumulated batch and one digest (with
`dp.clip_grad_norm_`, AdamW, dropout) on 1 rank, the world and groups of 2 and 4; a hand-set
learning rate saved on the world resumes without adopt_lr on fewer ranks to the uninterrupted
digest; replica digests are on by default and name a rank that clipped alone. Holds at any size
>= 2; skips without torch."""

import math
import tempfile

import pytest

torch = pytest.importorskip("torch")

from alpha_mpi.refusals import Refusal  # noqa: E402
from alpha_mpi.torch import DataParallel  # noqa: E402
from alpha_mpi.torch.step_plan import DIGESTS_EVERY  # noqa: E402

from conftest import agree, groups  # noqa: E402
from lm_common import IGNORE, batch, lm, rel, token_mean_grad, token_pair  # noqa: E402

SLOTS = 8


def shared_dir(world):
    return world.bcast(tempfile.mkdtemp(prefix="alpha-ports-") if world.Get_rank() == 0 else None, root=0)


def _lr(it, base=3e-3, warmup=2, total=8):
    """nanoGPT's get_lr: linear warmup, then cosine to a tenth."""
    if it < warmup:
        return base * (it + 1) / warmup
    ratio = min(1.0, (it - warmup) / (total - warmup))
    return base / 10 + 0.5 * (1 + math.cos(math.pi * ratio)) * (base - base / 10)


def micro(dp):
    """The global micro-batch of call `dp.steps`: a function of the step alone (the recipe of
    docs/pytorch.md: the same on every rank and across a resume)."""
    g = torch.Generator().manual_seed(1000 + dp.steps)
    start = int(torch.randint(0, 70, (1,), generator=g))
    return batch(start, 12)


def train(dp, opt, until, accum=2, clip=0.5):
    """nanoGPT's loop, ported: hand-set LR from dp.updates, accum micro-steps (the first
    accum - 1 under no_sync), clipping after the step, AdamW."""
    while dp.updates < until:
        for g in opt.param_groups:
            g["lr"] = _lr(dp.updates)
        with dp.no_sync():
            for _ in range(accum - 1):
                dp.step(*micro(dp), token_pair)
        loss = dp.step(*micro(dp), token_pair)
        dp.clip_grad_norm_(clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return f"{loss.item():.6f}"


def fresh(comm, seed=0):
    torch.set_num_threads(1)
    model = lm(seed)
    dp = DataParallel(model, comm, slots=SLOTS, seed=4, timeout=60)
    return dp, torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1)


@pytest.mark.mpi(min_size=2)
def test_accumulation_with_clipping_gives_one_digest_on_every_rank_count(world):
    from mpi4py import MPI

    dp, opt = fresh(MPI.COMM_SELF)
    train(dp, opt, 3)
    alone = dp.state_digest(opt)
    agree(world, (dp.steps, dp.updates) == (6, 3), f"{dp.steps} {dp.updates}")
    for comm in [world, *groups(world)]:
        dp, opt = fresh(comm)
        train(dp, opt, 3)
        d = dp.state_digest(opt)
        agree(world, d == alone, f"{comm.Get_size()} ranks: {d[:12]} vs {alone[:12]}")
        dp.free()


@pytest.mark.mpi(min_size=2)
def test_ported_accumulation_is_plain_torchs_token_mean(world):
    torch.set_num_threads(1)
    model, ref = lm(dropout=0.0), lm(dropout=0.0)
    ref.load_state_dict(model.state_dict())
    (x0, y0), (x1, y1) = batch(0, 12), batch(40, 12)
    X, Y = torch.cat([x0, x1]), torch.cat([y0, y1])
    want = token_mean_grad(
        ref,
        lambda m: torch.nn.functional.cross_entropy(m(X)[0].flatten(0, 1), Y.flatten(), ignore_index=IGNORE),
    )
    dp = DataParallel(model, world, slots=SLOTS, timeout=60)
    with dp.no_sync():
        dp.step(x0, y0, token_pair)
    dp.step(x1, y1, token_pair)
    worst = max(rel([p.grad], [w]) for p, w in zip(model.parameters(), want))
    agree(world, worst <= 1e-5, f"max relative error {worst}")


@pytest.mark.mpi(min_size=2)
def test_a_hand_set_lr_saved_on_the_world_resumes_without_adopt_lr_on_fewer_ranks(world):
    from mpi4py import MPI

    dp, opt = fresh(MPI.COMM_SELF)
    train(dp, opt, 5)
    want = dp.state_digest(opt)
    ck = shared_dir(world) + "/ck"
    dp, opt = fresh(world)
    train(dp, opt, 2)
    dp.save(ck, opt)
    dp.free()
    for comm in [MPI.COMM_SELF, *groups(world, (2,))]:
        dp, opt = fresh(comm, seed=3)  # another initial rate and other weights: the checkpoint's win
        dp.restore(ck, opt)
        agree(world, (dp.steps, dp.updates) == (4, 2), f"{dp.steps} {dp.updates}")
        train(dp, opt, 5)
        d = dp.state_digest(opt)
        agree(world, d == want, f"resumed on {comm.Get_size()}: {d[:12]} vs {want[:12]}")


@pytest.mark.mpi(min_size=2)
def test_replica_digests_are_on_by_default_and_name_a_rank_that_clipped_alone(world):
    size, rank = world.Get_size(), world.Get_rank()
    dp, opt = fresh(world)
    agree(world, dp.replicas is not None and dp.replicas.every == DIGESTS_EVERY, "no default digests")
    from mpi4py import MPI

    one, _ = fresh(MPI.COMM_SELF)
    agree(world, one.replicas is None, "one rank holds no replica to compare")
    dp.steps = dp.updates = DIGESTS_EVERY - 3  # near a check, so the test stays short
    code, at = None, None
    for _ in range(4):
        try:
            dp.step(*micro(dp), token_pair)
        except Refusal as e:
            code, at = e.code, dp.steps
            break
        if rank == size - 1 and dp.steps == DIGESTS_EVERY - 2:
            dp.clip_grad_norm_(1e-3)  # one rank clips alone
        opt.step()
        opt.zero_grad()
    agree(world, code == "replica-diverged" and at == DIGESTS_EVERY, f"{code} at {at}")
