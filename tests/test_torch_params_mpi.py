"""Sharded parameters for torch over MPI (issue 43): `DataParallel(partition="params")` (ZeRO-3)
with torch's AdamW over parameter groups, a warmup-cosine LambdaLR and `dp.clip_grad_norm_`
trains nanoGPT's shape (the head tied to the token embedding) to the state digest of
`partition="none"` on 1 rank, the whole world and groups of 2, 3 and 4 ranks (3 ranks own
unequal slot counts: a rank runs the gathers of the turns it has no slot for), no_sync
accumulation included; units given by name with the tie across them; a unit that never runs
(its parameters unused) beside replicated BatchNorm buffers; a checkpoint saved on 4 ranks in
params mode resumes on 2 in none, state and params (and the other way) to the uninterrupted
digest; the parameters a rank holds at rest shrink with the rank count; a unit that does not
exist, named on one rank, is refused by name on every rank, the next construction working; a
slot that fails on one rank while the others gather is named on every rank and the next step
works. Holds at any size >= 2 (the 4 -> 2 resume needs 4); skips without torch."""

import math
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")

from alpha_mpi.refusals import Refusal  # noqa: E402
from alpha_mpi.torch import DataParallel  # noqa: E402

from conftest import agree, groups  # noqa: E402
from lm_common import BLOCK, VOCAB, CausalLM, batch, token_pair  # noqa: E402

SLOTS = 6
STEPS = 4
WARMUP = 2


def lm(layers=2):
    torch.manual_seed(0)
    return CausalLM(VOCAB, BLOCK, d=32, layers=layers, heads=2, dropout=0.1)


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
    comm, partition, steps=STEPS, *, start=None, ckpt=None, save_at=None, accum=1, units=None, memory=False
):
    """The token model trained to `steps` updates of `accum` batches, clipped, restored from
    `start`, saved at `save_at`: its state digest (and dp.memory(opt) with `memory`)."""
    torch.set_num_threads(1)
    model = lm()
    kw = {} if units is None else {"units": units}
    dp = DataParallel(model, comm, slots=SLOTS, seed=2, timeout=120, partition=partition, **kw)
    opt = dp.optimizer(torch.optim.AdamW, decay_groups(model), lr=3e-3, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine)
    dp.register("scheduler", sched)
    if start:
        dp.restore(start, opt, scheduler=sched)
    while dp.updates < steps:
        if accum > 1:
            with dp.no_sync():
                for _ in range(accum - 1):
                    dp.step(*batch(dp.steps * 20, 20), token_pair)
        dp.step(*batch(dp.steps * 20, 20), token_pair)
        dp.clip_grad_norm_(0.05)
        opt.step()
        opt.zero_grad()
        sched.step()
        if ckpt and dp.updates == save_at:
            dp.save(ckpt, opt, scheduler=sched)
    out = dp.state_digest(opt), (dp.memory(opt) if memory else None)
    dp.free()
    return out


def shared_dir(world):
    return world.bcast(tempfile.mkdtemp(prefix="alpha-zero3-") if world.Get_rank() == 0 else None, root=0)


@pytest.mark.mpi(min_size=2)
def test_params_partition_gives_the_digest_of_none_on_every_rank_count(world):
    from mpi4py import MPI

    alone, _ = train(MPI.COMM_SELF, "none")
    for comm in [MPI.COMM_SELF, world, *groups(world, sizes=(2, 3, 4))]:
        d, _ = train(comm, "params")
        agree(world, d == alone, f"params on {comm.Get_size()} ranks: {d[:12]} vs {alone[:12]}")
    short, _ = train(world, "params", steps=STEPS - 1)  # the comparison can fail
    agree(world, short != alone, "a step fewer gave the same digest")


@pytest.mark.mpi(min_size=2)
def test_no_sync_and_named_units_with_a_tie_across_them_give_the_bits_of_none(world):
    """Units by name: the token embedding and the head (tied: the weight goes to the root,
    gathered for the whole slot) and the blocks; and DDP's accumulation under no_sync."""
    from mpi4py import MPI

    alone, _ = train(MPI.COMM_SELF, "none", steps=2, accum=2)
    d, _ = train(world, "params", steps=2, accum=2)
    agree(world, d == alone, f"accum 2 on {world.Get_size()} ranks: {d[:12]} vs {alone[:12]}")
    plain, _ = train(MPI.COMM_SELF, "none", steps=2)
    named, _ = train(world, "params", steps=2, units=["tok", "blocks.0", "blocks.1", "ln", "head"])
    agree(world, named == plain, f"named units: {named[:12]} vs {plain[:12]}")
    agree(world, plain != alone, "accumulating 2 batches gave the digest of 1")


class Skipping(torch.nn.Module):
    """Three units, the middle one never run (its parameters unused: .grad None, AdamW skips
    them), a BatchNorm's replicated running statistics (buffers="slot-mean")."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(6, 6) for _ in range(3))
        self.norm = torch.nn.BatchNorm1d(6)
        self.out = torch.nn.Linear(6, 2)

    def forward(self, x):
        h = torch.tanh(self.layers[0](x))
        h = self.norm(torch.tanh(self.layers[2](h)))
        return self.out(h)


def train_skipping(comm, partition, steps=3, unused="none"):
    """The parameters' digest (the optimizer holds no state for the unused ones, which a state
    digest refuses in every mode), and with unused="zeros" the state digest."""
    torch.set_num_threads(1)
    net = Skipping()
    dp = DataParallel(
        net, comm, slots=SLOTS, timeout=120, partition=partition, buffers="slot-mean", unused=unused
    )
    opt = dp.optimizer(torch.optim.AdamW, net.parameters(), lr=1e-2, weight_decay=0.1)
    g = torch.Generator().manual_seed(5)
    for _ in range(steps):
        X, y = torch.randn(16, 6, generator=g), torch.randint(0, 2, (16,), generator=g)
        dp.step(X, y, torch.nn.CrossEntropyLoss(reduction="sum"))
        opt.step()
        opt.zero_grad()
    d = dp.digest() if unused == "none" else dp.state_digest(opt)
    dp.free()
    return d


@pytest.mark.mpi(min_size=2)
def test_a_unit_that_never_runs_and_replicated_buffers_give_the_bits_of_none(world):
    from mpi4py import MPI

    for unused in ("none", "zeros"):
        alone = train_skipping(MPI.COMM_SELF, "none", unused=unused)
        for comm in [world, *groups(world, sizes=(3,))]:
            d = train_skipping(comm, "params", unused=unused)
            agree(world, d == alone, f"{unused} on {comm.Get_size()} ranks: {d[:12]} vs {alone[:12]}")


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize(
    "saved,resumed", [("params", "none"), ("params", "state"), ("params", "params"), ("none", "params")]
)
def test_saved_on_4_in_one_mode_resumes_on_2_in_another_to_the_uninterrupted_digest(world, saved, resumed):
    from mpi4py import MPI

    alone, _ = train(MPI.COMM_SELF, "none")
    root = os.path.join(shared_dir(world), "ckpt")
    rank = world.Get_rank()
    four = world.Split(0 if rank < 4 else 1, rank)
    if rank < 4:
        train(four, saved, steps=2, ckpt=root, save_at=2)
    world.Barrier()
    two = world.Split(0 if rank < 2 else 1, rank)
    d = alone
    if rank < 2:
        d, _ = train(two, resumed, start=root)
    agree(world, d == alone, f"{saved} on 4 -> {resumed} on 2: {d[:12]} vs {alone[:12]}")


@pytest.mark.mpi(min_size=2)
def test_the_parameters_a_rank_holds_at_rest_shrink_with_the_ranks(world):
    from mpi4py import MPI

    _, one = train(MPI.COMM_SELF, "none", steps=1, memory=True)
    _, mine = train(world, "params", steps=1, memory=True)
    p = world.Get_size()
    most = max(world.allgather(mine["params"]))
    # whole blocks of the 512 grid: at most one block over the even share
    agree(world, most <= one["params"] / p + 512 * 4, f"{most} bytes of parameters on {p} ranks: {one}")
    agree(world, mine["params_peak"] < one["params"] or p < 3, f"peak {mine['params_peak']} vs {one}")
    # .grad is the shard of the gradient (grads mode's reduce-scatter): the parameters' shard's size
    agree(world, mine["peak"] >= mine["at_rest"] and mine["grads"] == mine["params"], f"{mine} vs {one}")


@pytest.mark.mpi(min_size=2)
def test_a_unit_that_does_not_exist_is_refused_on_every_rank_and_the_next_build_works(world):
    odd = world.Get_size() - 1
    try:
        DataParallel(
            lm(),
            world,
            slots=SLOTS,
            timeout=120,
            partition="params",
            units=["blocks.0", "blocks.7" if world.Get_rank() == odd else "blocks.1"],
        )
        got = None
    except Refusal as e:
        got = (e.code, e.context.get("peer"), e.context.get("peer_code"))
    want = (
        ("torch-units-unknown", None, None)
        if world.Get_rank() == odd
        else ("peer-refused", odd, "torch-units-unknown")
    )
    agree(world, got == want, f"refused as {got}")
    dp = DataParallel(
        lm(), world, slots=SLOTS, timeout=120, partition="params", units=["blocks.0", "blocks.1"]
    )
    agree(world, dp.partition == "params", "the next construction works")
    dp.free()


@pytest.mark.mpi(min_size=2)
def test_a_slot_failing_on_one_rank_while_others_gather_is_named_everywhere_and_the_next_step_works(world):
    """Rank `odd`'s loss raises in its first slot's forward (after some gathers); the others
    are in their gathers or their slots: every rank refuses by name, none waits, and the
    next step gives the bits of a run that never failed."""
    model = lm()
    dp = DataParallel(model, world, slots=SLOTS, seed=2, timeout=120, partition="params")
    opt = dp.optimizer(torch.optim.AdamW, model.parameters(), lr=1e-3)
    odd = world.Get_size() - 1

    def bad(out, y):
        if world.Get_rank() == odd:
            raise ValueError("a bad slot")
        return token_pair(out, y)

    try:
        dp.step(*batch(0, 20), bad)
        got = None
    except Exception as e:
        got = getattr(e, "code", type(e).__name__)
    agree(world, got in ("peer-refused", "torch-slot-failed", "ValueError"), f"refused as {got}")
    dp.step(*batch(0, 20), token_pair)
    opt.step()
    d = dp.state_digest(opt)
    dp.free()
    from mpi4py import MPI

    model = lm()
    ref = DataParallel(model, MPI.COMM_SELF, slots=SLOTS, seed=2, timeout=120)
    opt = ref.optimizer(torch.optim.AdamW, model.parameters(), lr=1e-3)
    ref.step(*batch(0, 20), token_pair)
    opt.step()
    agree(world, d == ref.state_digest(opt), "the step after the refusal")
    ref.free()


@pytest.mark.mpi(min_size=2)
def test_a_rank_refusing_before_its_slots_runs_their_gathers_and_every_rank_names_it(world):
    """Rank `odd` refuses its loss before any slot (a declared mean): it runs its turns'
    gathers carrying the refusal, so the ranks gathering for their slots do not wait; every
    rank refuses by name, and the next step works."""
    model = lm()
    dp = DataParallel(model, world, slots=SLOTS, seed=2, timeout=120, partition="params")
    odd = world.Get_size() - 1
    loss = torch.nn.CrossEntropyLoss() if world.Get_rank() == odd else token_pair
    try:
        dp.step(*batch(0, 20), loss)
        got = None
    except Refusal as e:
        got = (e.code, e.context.get("peer"), e.context.get("peer_code"))
    want = (
        ("torch-loss-invalid", None, None)
        if world.Get_rank() == odd
        else ("peer-refused", odd, "torch-loss-invalid")
    )
    agree(world, got == want, f"refused as {got}")
    dp.step(*batch(0, 20), token_pair)
    held = all(dp.grads.present) and all(p.grad is None for p in model.parameters())
    agree(world, dp.steps == 1 and held, "the next step")
    dp.free()
