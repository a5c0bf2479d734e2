"""One-rank mistakes in a torch training script are refused on every rank by name, in the step's
own combine, and the next step works (issue 34 item 4, issue 36 items 3 and 4).

Each case is a script where the last rank alone does something else: another global batch
length (31 or 33 against 32 with `step`, a SlotSampler batch of 33), a forgotten `set_epoch`, a
data set one sample longer, a forgotten resume `start`, another `DataParallel(seed=)`,
`module.eval()` left on (also with `audit_slots`: never `sdc-detected`), `no_sync()` forgotten.
And the DDP habits on every rank: the whole batch to `step_local`, each rank's own half to
`step`. Every rank must raise the same code naming the same field (the verdict is read from the
combined words), `.grad` must be left None, and the step after, done right, must work. Integer
buffers are copied from rank 0 and digested; a parameter registered after construction is
refused at the next step. Holds at any size >= 2; skips without torch.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from alpha_mpi.refusals import Refusal  # noqa: E402
from alpha_mpi.torch import DataParallel, SlotSampler, parameter_digest  # noqa: E402

from conftest import agree  # noqa: E402

SUM = torch.nn.CrossEntropyLoss(reduction="sum")
SLOTS, BATCH, N = 8, 32, 200
G = torch.Generator().manual_seed(5)
X, Y = torch.randn(N + 1, 12, generator=G), torch.randint(0, 4, (N + 1,), generator=G)


class Pairs(torch.utils.data.Dataset):
    def __init__(self, n=N):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return X[i], Y[i]


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Dropout(0.25), torch.nn.Linear(16, 4)
    )


def last(world):
    return world.Get_rank() == world.Get_size() - 1


def outcome(fn):
    """(code, field) of the refusal `fn()` raised, or (None, None)."""
    try:
        fn()
    except Refusal as e:
        return e.code, e.context.get("field")
    return None, None


def refused_alike(world, dp, got, code, field):
    """Every rank refused with `code` naming `field`, and nothing was applied."""
    agree(world, got == (code, field), f"expected ({code}, {field}), got {got}")
    agree(world, all(p.grad is None for p in dp.params), "nothing applied")


def share(sampler, ds):
    """This rank's share of the sampler's first batch, through a DataLoader (its note left)."""
    return next(iter(torch.utils.data.DataLoader(ds, batch_sampler=sampler)))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("delta", [-1, 1])
def test_a_global_batch_of_another_length_on_one_rank_is_refused(world, delta):
    torch.set_num_threads(1)
    dp = DataParallel(net(), world, slots=SLOTS, timeout=60)
    n = BATCH + (delta if last(world) else 0)
    got = outcome(lambda: dp.step(X[:n], Y[:n], SUM))
    refused_alike(world, dp, got, "slot-cut-mismatch", "global batch length")
    agree(world, np.isfinite(dp.step(X[:BATCH], Y[:BATCH], SUM)), "the next step works")


@pytest.mark.mpi(min_size=2)
def test_each_ranks_own_half_given_to_step_is_refused(world):
    """The DDP habit `dp.step(X[my_half], ...)`: batches of one length, other samples."""
    torch.set_num_threads(1)
    dp = DataParallel(net(), world, slots=SLOTS, timeout=60)
    r = world.Get_rank()
    mine = slice(r * BATCH, (r + 1) * BATCH)
    got = outcome(lambda: dp.step(X[mine], Y[mine], SUM))
    refused_alike(world, dp, got, "batch-mismatch", "batch digest")
    agree(world, np.isfinite(dp.step(X[:BATCH], Y[:BATCH], SUM)), "the next step works")


@pytest.mark.mpi(min_size=2)
def test_the_whole_batch_given_to_step_local_on_every_rank_is_refused(world):
    """The DDP habit of a plain DataLoader of global batches on every rank with step_local:
    nothing says which global batch the samples belong to, so it is refused, not trained on
    duplicated data; the SlotSampler's batch then works."""
    torch.set_num_threads(1)
    dp = DataParallel(net(), world, slots=SLOTS, timeout=60)
    got = outcome(lambda: dp.step_local(X[:BATCH], Y[:BATCH], SUM))
    refused_alike(world, dp, got, "slot-cut-mismatch", None)
    sampler = SlotSampler(Pairs(), dp, batch_size=BATCH, seed=1)
    agree(world, np.isfinite(dp.step_local(*share(sampler, Pairs()), SUM)), "the next step works")


def sampler_case(world, code, field, *, n=N, batch=BATCH, epoch=1, start=0):
    """The last rank's sampler built with the arguments given, the others' with the defaults:
    refused alike with `code` naming `field`, and the next step, right, works."""
    torch.set_num_threads(1)
    dp = DataParallel(net(), world, slots=SLOTS, timeout=60)
    odd = last(world)
    ds = Pairs(n if odd else N)
    sampler = SlotSampler(ds, dp, batch_size=batch if odd else BATCH, seed=1)
    sampler.set_epoch(epoch if odd else 1, start if odd else 0)
    refused_alike(world, dp, outcome(lambda: dp.step_local(*share(sampler, ds), SUM)), code, field)
    right = SlotSampler(Pairs(), dp, batch_size=BATCH, seed=1)
    right.set_epoch(1)
    agree(world, np.isfinite(dp.step_local(*share(right, Pairs()), SUM)), "the next step works")


@pytest.mark.mpi(min_size=2)
def test_a_sampler_batch_of_33_on_one_rank_is_refused(world):
    sampler_case(world, "slot-cut-mismatch", "global batch length", batch=BATCH + 1)


@pytest.mark.mpi(min_size=2)
def test_a_forgotten_set_epoch_on_one_rank_is_refused(world):
    sampler_case(world, "batch-mismatch", "epoch", epoch=0)


@pytest.mark.mpi(min_size=2)
def test_a_data_set_one_sample_longer_on_one_rank_is_refused(world):
    sampler_case(world, "batch-mismatch", "data set length", n=N + 1)


@pytest.mark.mpi(min_size=2)
def test_a_forgotten_resume_start_on_one_rank_is_refused(world):
    """Resumed mid-epoch: the last rank calls set_epoch(1, 2), the others forgot the start."""
    sampler_case(world, "batch-mismatch", "batch index", start=2)  # the last rank: 2, the others 0


@pytest.mark.mpi(min_size=2)
def test_another_seed_on_one_rank_is_refused(world):
    torch.set_num_threads(1)
    dp = DataParallel(net(), world, slots=SLOTS, timeout=60, seed=1 if last(world) else 0)
    got = outcome(lambda: dp.step(X[:BATCH], Y[:BATCH], SUM))
    refused_alike(world, dp, got, "step-mismatch", "seed")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("audit", [0, 1], ids=["plain", "audit_slots"])
def test_eval_left_on_one_rank_is_refused_never_called_a_faulty_host(world, audit):
    torch.set_num_threads(1)
    model = net()
    dp = DataParallel(model, world, slots=SLOTS, timeout=60, audit_slots=audit)
    if last(world):
        model.eval()
    got = outcome(lambda: dp.step(X[:BATCH], Y[:BATCH], SUM))
    refused_alike(world, dp, got, "step-mismatch", "training")
    model.train()
    agree(world, np.isfinite(dp.step(X[:BATCH], Y[:BATCH], SUM)), "the next step works")


@pytest.mark.mpi(min_size=2)
def test_no_sync_forgotten_on_one_rank_is_refused(world):
    torch.set_num_threads(1)
    dp = DataParallel(net(), world, slots=SLOTS, timeout=60)
    dp.step(X[:BATCH], Y[:BATCH], SUM)

    def accumulating():
        if last(world):
            dp.step(X[BATCH : 2 * BATCH], Y[BATCH : 2 * BATCH], SUM)
        else:
            with dp.no_sync():
                dp.step(X[BATCH : 2 * BATCH], Y[BATCH : 2 * BATCH], SUM)

    refused_alike(world, dp, outcome(accumulating), "step-mismatch", "accumulate")


def bn_net(world, counter):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 6), torch.nn.BatchNorm1d(6), torch.nn.Linear(6, 4))
    model[1].num_batches_tracked.fill_(counter)
    return model, model[1]


@pytest.mark.mpi(min_size=2)
def test_integer_buffers_are_rank_0s_after_construction(world):
    model, bn = bn_net(world, 7 + world.Get_rank())  # counters differ before construction
    DataParallel(model, world, slots=SLOTS, timeout=60, buffers="slot-mean")
    counts = world.allgather(int(bn.num_batches_tracked))
    agree(world, counts == [7] * world.Get_size(), f"counters after construction: {counts}")


@pytest.mark.mpi(min_size=2)
def test_integer_buffers_are_in_the_replica_digests(world):
    """A counter changed on one rank after a step is named by the replica digests."""
    model, bn = bn_net(world, 7)
    dp = DataParallel(model, world, slots=SLOTS, timeout=60, buffers="slot-mean", audit_digests=1)
    dp.step(X[:BATCH], Y[:BATCH], SUM)
    if last(world):
        bn.num_batches_tracked.add_(1)
    got = outcome(lambda: dp.step(X[:BATCH], Y[:BATCH], SUM))
    agree(world, got[0] == "replica-diverged", f"refused: {got}")


@pytest.mark.mpi(min_size=2)
def test_a_parameter_registered_after_construction_is_refused_at_the_next_step(world):
    torch.set_num_threads(1)
    model = net()
    dp = DataParallel(model, world, slots=SLOTS, timeout=60)
    model.extra = torch.nn.Parameter(torch.zeros(3))  # a head added after DataParallel, on every rank
    got = outcome(lambda: dp.step(X[:BATCH], Y[:BATCH], SUM))
    agree(world, got[0] == "torch-module-changed", f"refused: {got}")
    del model.extra
    agree(world, np.isfinite(dp.step(X[:BATCH], Y[:BATCH], SUM)), "the next step works")


@pytest.mark.mpi(min_size=2)
def test_the_same_script_on_every_rank_trains_to_the_one_rank_digest(world):
    """The control: the same sampler, epochs and settings on every rank train, and to the digest
    of one rank alone (the agreement words change no bits)."""
    from mpi4py import MPI

    def train(comm):
        torch.set_num_threads(1)
        model = net()
        dp = DataParallel(model, comm, slots=SLOTS, timeout=60, seed=3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sampler = SlotSampler(Pairs(), dp, batch_size=BATCH, seed=1)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for Xb, yb in torch.utils.data.DataLoader(Pairs(), batch_sampler=sampler, num_workers=0):
                dp.step_local(Xb, yb, SUM)
                opt.step()
                opt.zero_grad()
        return parameter_digest(model)

    alone = train(MPI.COMM_SELF)
    d = train(world)
    agree(world, d == alone, f"{d[:12]} vs {alone[:12]}")
