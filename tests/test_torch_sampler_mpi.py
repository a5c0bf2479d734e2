"""A DDP-style script over alpha_mpi.torch: a DataLoader with SlotSampler, `dp.step_local`,
torch.optim.SGD with momentum, two epochs. One digest on 1 rank, the whole world and groups of 2
and 4 (run under mpiexec -n 2, 4 and 5), equal to `dp.step` on the global batches, with 0 and 2
loader workers; every rank's data set reads are exactly its share (counted per index in shared
memory, so the workers' reads count too). Skips cleanly without torch."""

import multiprocessing

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from alpha_mpi.learning import slot_ranges  # noqa: E402
from alpha_mpi.torch import DataParallel, SlotSampler, parameter_digest  # noqa: E402

from conftest import agree, groups  # noqa: E402

SUM = torch.nn.CrossEntropyLoss(reduction="sum")
SLOTS, BATCH, N = 8, 48, 300  # 300 = 6 * 48 + 12: drop_last=False keeps a short batch of 12


class Counted(torch.utils.data.Dataset):
    """Samples made from their index; every __getitem__ counted per index in shared memory."""

    def __init__(self, n=N):
        g = torch.Generator().manual_seed(7)
        self.X, self.y = torch.randn(n, 16, generator=g), torch.randint(0, 5, (n,), generator=g)
        self.reads = multiprocessing.Array("i", n)  # inherited by forked loader workers

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        with self.reads.get_lock():
            self.reads[i] += 1
        return self.X[i], self.y[i]

    def counts(self):
        return np.frombuffer(self.reads.get_obj(), dtype=np.int32).copy()


def net():
    torch.manual_seed(0)  # dropout makes every slot's random stream visible in the bits
    return torch.nn.Sequential(
        torch.nn.Linear(16, 24), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(24, 5)
    )


def train(comm, ds, *, local=True, workers=0, drop_last=True, epochs=2):
    """The script a DDP user writes, with the sampler and step_local (or, local=False, dp.step on
    the same global batches read whole). Returns the digest and the sampler."""
    torch.set_num_threads(1)
    model = net()
    dp = DataParallel(model, comm, slots=SLOTS, seed=11, timeout=60)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = SlotSampler(ds, dp, batch_size=BATCH, shuffle=True, seed=3, drop_last=drop_last)
    loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler, num_workers=workers)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        if local:
            for X, y in loader:
                dp.step_local(X, y, SUM)
                opt.step()
                opt.zero_grad()
        else:
            for idx in sampler.global_batches():
                dp.step(ds.X[idx], ds.y[idx], SUM)
                opt.step()
                opt.zero_grad()
    return parameter_digest(model), dp, sampler


def expected_reads(dp, sampler, epochs=2):
    """Per index: how often this rank's slots of each global batch hold it (the share), cut by
    slot_ranges, not by the sampler's own arithmetic."""
    out = np.zeros(N, dtype=np.int32)
    for e in range(epochs):
        for idx in sampler.global_batches(e):
            for s in dp.my_slots:
                a, b = slot_ranges(len(idx), SLOTS)[s]
                np.add.at(out, idx[a:b], 1)
    return out


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("drop_last", [True, False], ids=["drop_last", "short_last"])
def test_ddp_style_script_one_digest_on_every_rank_count_reading_only_its_share(world, workers, drop_last):
    from mpi4py import MPI

    whole, _, _ = train(MPI.COMM_SELF, Counted(), local=False, drop_last=drop_last)
    alone, _, _ = train(MPI.COMM_SELF, Counted(), workers=workers, drop_last=drop_last)
    agree(world, alone == whole, f"1 rank: step_local {alone[:12]} vs step {whole[:12]}")
    for comm in [world, *groups(world)]:
        ds = Counted()
        d, dp, sampler = train(comm, ds, workers=workers, drop_last=drop_last)
        p = comm.Get_size()
        agree(world, d == alone, f"{p} ranks, {workers} workers: {d[:12]} vs {alone[:12]}")
        reads, share = ds.counts(), expected_reads(dp, sampler)
        agree(world, np.array_equal(reads, share), f"{p} ranks: reads are not the share")
        # The share is a fraction of the data: what a rank owns of every batch, not all of it.
        frac = len(dp.my_slots) / SLOTS
        agree(world, reads.sum() < 2 * N * frac + 2 * SLOTS, f"{p} ranks read {reads.sum()} samples")


@pytest.mark.mpi(min_size=2)
def test_the_global_batch_given_to_step_local_on_one_rank_is_refused_on_every_rank(world):
    """Rank 0 feeds the global batch to step_local (the classic mistake): 49 samples are a valid
    cut of its own slots (of a global batch of 97), so only the combined slot sizes show that
    the ranks' slots are no one global batch's; every rank refuses the step alike, nothing is
    applied, and the next step works."""
    from alpha_mpi.refusals import Refusal

    torch.set_num_threads(1)
    ds = Counted()
    dp = DataParallel(net(), world, slots=SLOTS, timeout=60)
    sampler = SlotSampler(ds, dp, batch_size=BATCH + 1, seed=3)
    idx = next(iter(sampler.global_batches()))
    mine = next(iter(sampler))
    X, y = (ds.X[idx], ds.y[idx]) if world.Get_rank() == 0 else (ds.X[mine], ds.y[mine])
    code = None
    try:
        dp.step_local(X, y, SUM)
    except Refusal as e:
        code = e.code
    agree(world, code == "slot-cut-mismatch", f"refused: {code}")
    agree(world, all(p.grad is None for p in dp.params), "nothing applied")
    # and the next step works on every rank (the sampler's next batch: its note travels along)
    mine = next(iter(sampler))
    d = dp.step_local(ds.X[mine], ds.y[mine], SUM)
    agree(world, np.isfinite(d), "the next step works")


@pytest.mark.mpi(min_size=2)
def test_one_ranks_exception_or_refusal_in_a_slot_reaches_every_rank_and_the_next_step_works(world):
    """What one rank's slot raises (its module, its loss, a loss it failed to declare) travels as
    a flag in the step's combine: that rank gets its own exception, every other rank
    `peer-refused` naming it, within the step and not after a timeout."""
    from alpha_mpi.refusals import Refusal

    torch.set_num_threads(1)
    ds = Counted()
    dp = DataParallel(net(), world, slots=SLOTS, timeout=60)
    sampler = SlotSampler(ds, dp, batch_size=BATCH, seed=3)

    def share():  # this rank's share of the first batch, its note left for the step
        mine = next(iter(sampler))
        return ds.X[mine], ds.y[mine]

    last = world.Get_size() - 1

    def broken(out, target):
        if world.Get_rank() == last:
            raise ValueError("a bug in this rank's loss")
        return SUM(out, target)

    undeclared = (lambda o, t: SUM(o, t)) if world.Get_rank() == last else SUM
    for loss_fn, own in ((broken, ValueError), (undeclared, Refusal)):
        got = None
        try:
            dp.step_local(*share(), loss_fn, reduction="sum" if loss_fn is broken else None)
        except Exception as e:
            got = e
        if world.Get_rank() == last:
            agree(world, isinstance(got, own), f"own error: {got!r}")
        else:
            ok = isinstance(got, Refusal) and got.code == "peer-refused" and got.context.get("peer") == last
            agree(world, ok, f"peer-refused naming {last}: {got!r}")
        agree(world, all(p.grad is None for p in dp.params), "nothing applied")
    agree(world, np.isfinite(dp.step_local(*share(), SUM)), "the next step works")


@pytest.mark.mpi(min_size=2)
def test_saved_mid_epoch_on_the_world_resumed_alone_with_set_epoch_start_equals_uninterrupted(world):
    """Preempted in the middle of epoch 1 on p ranks, resumed on 1 rank: `set_epoch(*divmod(
    dp.steps, steps_per_epoch))` continues with the next global batch, and the digest is the
    uninterrupted run's (SGD momentum state and the sampler position both come back)."""
    import os
    import tempfile

    from mpi4py import MPI

    alone, _, _ = train(MPI.COMM_SELF, Counted())
    root = world.bcast(tempfile.mkdtemp(prefix="alpha-sampler-") if world.Get_rank() == 0 else None)
    ck = os.path.join(root, "ck")

    def run(comm, stop_at=None, resume=False):
        torch.set_num_threads(1)
        ds, model = Counted(), net()
        dp = DataParallel(model, comm, slots=SLOTS, seed=11, timeout=60)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        sampler = SlotSampler(ds, dp, batch_size=BATCH, shuffle=True, seed=3)
        if resume:
            dp.restore(ck, opt)
        loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler)
        while dp.steps < 2 * sampler.steps_per_epoch:
            sampler.set_epoch(*divmod(dp.steps, sampler.steps_per_epoch))
            for X, y in loader:
                dp.step_local(X, y, SUM)
                opt.step()
                opt.zero_grad()
                if dp.steps == stop_at:
                    dp.save(ck, opt)
                    return None
        return parameter_digest(model)

    run(world, stop_at=8)  # epoch 1 (6 steps an epoch), batch 2
    d = run(MPI.COMM_SELF, resume=True) if world.Get_rank() == 0 else alone
    agree(world, d == alone, f"resumed: {str(d)[:12]} vs {alone[:12]}")
