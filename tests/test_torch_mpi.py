"""alpha_mpi.torch over MPI: the same bits on every rank count (groups of 1, 2, 4 and the whole
world), BatchNorm's slot-mean buffers too, the C optimizers over a ModuleModel in every partition
mode, and a checkpoint saved on one rank count resumed on another equal to the uninterrupted run.

Written to hold at any size: groups are the first k ranks and the rest; every group's digest must
equal the run alone on COMM_SELF. Skips cleanly without torch.
"""

import os
import sys
import tempfile

import pytest

torch = pytest.importorskip("torch")

from alpha_mpi.learning import DataParallelLearner, SlotStream, digest, stream_batch  # noqa: E402
from alpha_mpi.refusals import Refusal  # noqa: E402
from alpha_mpi.torch import DataParallel, ModuleModel, parameter_digest  # noqa: E402

from conftest import ROOT, agree, groups  # noqa: E402
from torch_common import Fussy  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "examples"))
from torch_cnn import DigitsCNN  # noqa: E402

SUM = torch.nn.CrossEntropyLoss(reduction="sum")
SLOTS = 8


def data(n=300, d=64, c=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, d, generator=g), torch.randint(0, c, (n,), generator=g)


X, Y = data()


def mlp(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)).to(dtype)


def bn_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 10)
    )


def cnn():
    torch.manual_seed(0)
    return DigitsCNN()


def run(comm, make, steps, *, buffers="refuse", opt="adam", start=None, ckpt=None, save_at=None):
    torch.set_num_threads(1)
    net = make()
    dp = DataParallel(net, comm, slots=SLOTS, buffers=buffers, timeout=30)
    o = (
        torch.optim.Adam(net.parameters(), lr=1e-2)
        if opt == "adam"
        else torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    )
    if start:
        dp.restore(start, o)
    stream = SlotStream(len(Y), 50, 1, 0)
    Xd = X.to(dp.dtype)
    while dp.steps < steps:
        idx = torch.from_numpy(stream.indices(dp.steps, 0))
        dp.step(Xd[idx], Y[idx], SUM)
        o.step()
        o.zero_grad()
        if ckpt and dp.steps == save_at:
            dp.save(ckpt, o)
    out = parameter_digest(net)
    if buffers == "slot-mean":
        out += "".join(digest(b.double().numpy()) for b in net.buffers())
    return out


def shared_dir(world):
    return world.bcast(tempfile.mkdtemp(prefix="alpha-torch-") if world.Get_rank() == 0 else None, root=0)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", ["mlp32", "mlp64", "cnn", "batchnorm"])
def test_one_digest_on_every_rank_count(world, name):
    from mpi4py import MPI

    make = {"mlp32": mlp, "mlp64": lambda: mlp(torch.float64), "cnn": cnn, "batchnorm": bn_net}[name]
    buffers = "slot-mean" if name == "batchnorm" else "refuse"
    opt = "sgd" if name == "mlp64" else "adam"
    alone = run(MPI.COMM_SELF, make, 6, buffers=buffers, opt=opt)
    d = run(world, make, 6, buffers=buffers, opt=opt)
    agree(world, d == alone, f"{name} world: {d[:12]} vs {alone[:12]}")
    for g in groups(world):
        d = run(g, make, 6, buffers=buffers, opt=opt)
        agree(world, d == alone, f"{name} group of {g.Get_size()}: {d[:12]} vs {alone[:12]}")


@pytest.mark.mpi(min_size=2)
def test_ranks_start_from_rank_0s_parameters(world):
    torch.manual_seed(world.Get_rank())  # every rank initialises differently
    net = torch.nn.Linear(4, 3)
    DataParallel(net, world, slots=world.Get_size())
    mine = parameter_digest(net)
    agree(world, world.allgather(mine) == [mine] * world.Get_size(), "parameters synchronised")


@pytest.mark.mpi(min_size=2)
def test_save_on_p_ranks_resume_alone_then_on_p_equals_uninterrupted(world):
    from mpi4py import MPI

    alone = run(MPI.COMM_SELF, cnn, 8)
    root = shared_dir(world)
    run(world, cnn, 3, ckpt=os.path.join(root, "p"), save_at=3)
    if world.Get_rank() == 0:
        run(MPI.COMM_SELF, cnn, 5, start=os.path.join(root, "p"), ckpt=os.path.join(root, "one"), save_at=5)
    world.Barrier()
    d = run(world, cnn, 8, start=os.path.join(root, "one"))
    agree(world, d == alone, f"p -> 1 -> p: {d[:12]} vs {alone[:12]}")


@pytest.mark.mpi(min_size=4)
def test_resume_4_to_2_equals_uninterrupted(world):
    from mpi4py import MPI

    alone = run(MPI.COMM_SELF, bn_net, 8, buffers="slot-mean")
    root = shared_dir(world)
    four = world.Split(0 if world.Get_rank() < 4 else 1, world.Get_rank())
    if world.Get_rank() < 4:
        run(four, bn_net, 4, buffers="slot-mean", ckpt=os.path.join(root, "four"), save_at=4)
    world.Barrier()
    two = world.Split(0 if world.Get_rank() < 2 else 1, world.Get_rank())
    d = alone
    if world.Get_rank() < 2:
        d = run(two, bn_net, 8, buffers="slot-mean", start=os.path.join(root, "four"))
    agree(world, d == alone, f"4 -> 2: {d[:12]} vs {alone[:12]}")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("partition", ["none", "state", "grads", "params"])
def test_c_optimizers_over_a_module_model_in_every_partition_mode(world, partition):
    from mpi4py import MPI

    Xn, yn = X.double().numpy(), Y.numpy()
    stream = SlotStream(len(yn), 50, SLOTS, 0)

    def go(comm, mode):
        lr = DataParallelLearner(
            comm, ModuleModel(mlp()), slots=SLOTS, lr=1e-2, partition=mode, seed=3, timeout=30
        )
        while lr.step < 5:
            lr.train_step(stream_batch(stream, lr.step, lr.my_slots, Xn, yn))
        return digest(lr.final_params())

    alone = go(MPI.COMM_SELF, "none")
    d = go(world, partition)
    agree(world, d == alone, f"{partition}: {d[:12]} vs {alone[:12]}")


@pytest.mark.mpi(min_size=2)
def test_a_nan_in_one_slot_is_refused_on_every_rank(world):
    torch.set_num_threads(1)
    net = mlp()
    dp = DataParallel(net, world, slots=SLOTS, timeout=30)
    before = parameter_digest(net)
    Xb, yb = X[:64].clone(), Y[:64]
    Xb[63, 0] = float("nan")  # the last slot: owned by the last rank
    code = None
    try:
        dp.step(Xb, yb, SUM)
    except Refusal as e:
        code = e.code
    agree(world, code is not None and code.startswith(("non-finite", "peer-failed")), f"refused: {code}")
    agree(
        world,
        all(p.grad is None for p in net.parameters()) and parameter_digest(net) == before,
        "nothing applied",
    )


def _two_layer(act=torch.nn.ReLU):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), act(), torch.nn.Linear(6, 2))  # 44 parameters


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(
    "other",
    [lambda: torch.nn.Linear(43, 1), lambda: _two_layer(torch.nn.Tanh)],
    ids=["same-count-other-shapes", "same-shapes-other-activation"],
)
def test_another_architecture_on_one_rank_is_refused_by_name_on_every_rank(world, other):
    last = world.Get_rank() == world.Get_size() - 1
    net = other() if last else _two_layer()
    assert sum(p.numel() for p in net.parameters()) == 44
    code = None
    try:
        DataParallel(net, world, slots=world.Get_size(), timeout=30)
    except Refusal as e:
        code = e.code, e.context.get("ranks")
    agree(world, code == ("torch-module-mismatch", [world.Get_size() - 1]), f"refused: {code}")
    net = _two_layer()  # the next construction, with the same module everywhere, works
    dp = DataParallel(net, world, slots=world.Get_size(), timeout=30)
    dp.step(torch.rand(8, 4), torch.randint(0, 2, (8,)), SUM)
    agree(world, all(p.grad is not None for p in net.parameters()), "a step after the refusal")


@pytest.mark.mpi(min_size=2)
def test_a_restore_one_rank_refuses_leaves_every_rank_as_it_was_and_the_next_one_works(world):
    """Issue 36 item 5: a registered object whose load_state_dict raises on one rank only. Was:
    that rank half-restored (parameters and Adam state in, steps 0) with a bare ValueError, the
    others restored and trained on until the peer bound. Now every rank refuses by name before
    any rank installs anything (that rank checkpoint-config-mismatch, the others peer-refused
    naming it), and the next restore works everywhere."""
    root = shared_dir(world)
    odd = world.Get_size() - 1
    net = mlp()
    dp = DataParallel(net, world, slots=SLOTS, timeout=30)
    o = torch.optim.Adam(net.parameters(), lr=1e-2)
    dp.register("counter", Fussy(fail=False))
    dp.registered["counter"].n = 5
    for _ in range(2):
        dp.step(X[:40], Y[:40], SUM)
        o.step()
        o.zero_grad()
    dp.save(root, o)
    fresh = mlp()
    dp2 = DataParallel(fresh, world, slots=SLOTS, timeout=30)
    o2 = torch.optim.Adam(fresh.parameters(), lr=1e-2)
    counter = Fussy(fail=world.Get_rank() == odd)
    dp2.register("counter", counter)
    before = (parameter_digest(fresh), len(o2.state), dp2.steps, counter.n)
    try:
        dp2.restore(root, o2)
        got = None
    except Refusal as e:
        got = (e.code, e.context.get("peer"), e.context.get("peer_code"))
    want = (
        ("checkpoint-config-mismatch", None, None)
        if world.Get_rank() == odd
        else ("peer-refused", odd, "checkpoint-config-mismatch")
    )
    agree(world, got == want, f"refused as {got}")
    agree(world, (parameter_digest(fresh), len(o2.state), dp2.steps, counter.n) == before, "changed")
    counter.fail = False
    dp2.restore(root, o2)
    agree(
        world, parameter_digest(fresh) == parameter_digest(net) and dp2.steps == 2 and counter.n == 5, "next"
    )
