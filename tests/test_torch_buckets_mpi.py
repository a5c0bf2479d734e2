"""DataParallel with buckets (bucket_mb): the combine starts during the last owned slot's
backward, and the bits are those of the one combine: the same digest with buckets of every size
and without, on 1 rank, the world and groups of 2 and 4. A refusal or exception on one rank
still reaches every rank in the same bucket, and the next step works. Skips without torch."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from alpha_mpi.refusals import Refusal  # noqa: E402
from alpha_mpi.torch import DataParallel, parameter_digest  # noqa: E402

from conftest import agree, groups  # noqa: E402

SUM = torch.nn.CrossEntropyLoss(reduction="sum")
SLOTS = 8
G = torch.Generator().manual_seed(1)
X, Y = torch.randn(200, 16, generator=G), torch.randint(0, 5, (200,), generator=G)


def net(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.2),
        torch.nn.Linear(64, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 5),
    ).to(dtype)


def train(comm, bucket_mb, dtype=torch.float32, steps=5):
    torch.set_num_threads(1)
    m = net(dtype)
    dp = DataParallel(m, comm, slots=SLOTS, bucket_mb=bucket_mb, seed=3, timeout=60)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    for t in range(steps):
        a = 24 * t
        dp.step(X[a : a + 24 + t].to(dtype), Y[a : a + 24 + t], SUM)
        opt.step()
        opt.zero_grad()
    d = parameter_digest(m)
    dp.free()
    return d


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_buckets_of_every_size_give_the_bits_of_one_combine_on_every_rank_count(world, dtype):
    from mpi4py import MPI

    alone = train(MPI.COMM_SELF, None, dtype)
    # 0.001 MiB: one bucket per two parameters; 0.01: two buckets; 100: one bucket
    for mb in (None, 0.001, 0.01, 100):
        for comm in [world, *groups(world)]:
            d = train(comm, mb, dtype)
            agree(world, d == alone, f"bucket_mb={mb} on {comm.Get_size()}: {d[:12]} vs {alone[:12]}")


@pytest.mark.mpi(min_size=2)
def test_with_buckets_a_refusal_or_exception_on_one_rank_reaches_every_rank(world):
    torch.set_num_threads(1)
    m = net()
    dp = DataParallel(m, world, slots=SLOTS, bucket_mb=0.001, timeout=60)
    last = world.Get_size() - 1
    Xn = X[:40].clone()
    Xn[39, 0] = float("nan")  # the last slot: the last rank's armed slot, its buckets non-finite
    got = None
    try:
        dp.step(Xn, Y[:40], SUM)
    except Refusal as e:
        got = e.code
    agree(world, got is not None and got.startswith(("non-finite", "peer-")), f"nan: {got}")
    agree(world, all(p.grad is None for p in m.parameters()), "nothing applied after the nan")

    def loss(out, target):  # the last rank's last backward fails inside a hook's bucket walk
        if world.Get_rank() == last:
            raise RuntimeError("this rank's loss broke")
        return SUM(out, target)

    got = None
    try:
        dp.step(X[:40], Y[:40], loss, reduction="sum")
    except Exception as e:
        got = e
    if world.Get_rank() == last:
        agree(world, isinstance(got, RuntimeError), f"own exception: {got!r}")
    else:
        agree(world, isinstance(got, Refusal) and got.code == "peer-refused", f"peer: {got!r}")
    agree(world, np.isfinite(dp.step(X[:40], Y[:40], SUM)), "the next step works")
    dp.free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("options", [{"bucket_mb": 0.001}, {"audit_slots": 1, "audit_digests": 1}])
def test_a_data_parallel_duplicates_its_communicator_once(world, options):
    """Buckets (one executor each), or the audit's tables and replica digests, the module check
    and rank 0's values: one library duplicate of the communicator in all (the endpoint's),
    where the audited DataParallel used to make about six and one more per bucket."""
    from spycomm import SpyComm

    spy = SpyComm(world.Dup())
    torch.set_num_threads(1)
    dp = DataParallel(net(), spy, slots=SLOTS, seed=3, timeout=60, **options)
    made = [c for c in spy.calls if c in ("Dup", "Idup", "Clone", "Create", "Split")]
    agree(world, made == ["Idup"], f"rank {world.Get_rank()}: {made}")
    agree(world, dp.combine.buckets is None or len(dp.combine.buckets.reducers) > 2, "several buckets")
    dp.free()
