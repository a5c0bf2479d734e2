"""A user's numpy model through the public API over MPI: one digest on every rank count, and a
checkpoint saved on one rank count resumed on another equal to the uninterrupted run.

Written to hold at any size: ranks split into groups (the first k ranks, the rest), every group
trains, and every group's digest must equal the run alone on COMM_SELF.
"""

import os
import sys
import tempfile

import pytest

from alpha_mpi.learning import DataParallelLearner, SlotStream, digest, stream_batch
from alpha_mpi.learning.data import synthetic

from conftest import ROOT, agree

sys.path.insert(0, os.path.join(ROOT, "examples"))
from numpy_softmax import SoftmaxRegression  # noqa: E402

SLOTS = 8
DATA = synthetic(5, n=400, n_eval=10, inputs=7, classes=4)
CFG = {"slots": SLOTS, "batch": 45, "seed": 2}


def learner(comm, partition="none"):
    return DataParallelLearner(
        comm, SoftmaxRegression(7, 4), slots=SLOTS, lr=1e-2, partition=partition, seed=2, timeout=30
    )


def train(lr, until):
    stream = SlotStream(len(DATA.y), 45, SLOTS, 2)
    while lr.step < until:
        lr.train_step(stream_batch(stream, lr.step, lr.my_slots, DATA.X, DATA.y))
    return lr


def split(world, k):
    """Ranks [0, k) and the others, each a communicator. Never freed: see alpha_mpi.torch.same_module.take_rank0_values."""
    return world.Split(0 if world.Get_rank() < k else 1, world.Get_rank())


def shared_dir(world):
    path = tempfile.mkdtemp(prefix="alpha-api-") if world.Get_rank() == 0 else None
    return world.bcast(path, root=0)  # test-side bookkeeping only


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("partition", ["none", "state", "grads", "params"])
def test_protocol_model_gives_one_digest_on_every_group_size(world, partition):
    from mpi4py import MPI

    alone = digest(train(learner(MPI.COMM_SELF), 15).final_params())
    d = digest(train(learner(world, partition), 15).final_params())
    agree(world, d == alone, f"world {partition}: {d[:12]} vs {alone[:12]}")
    for k in (2, 4):
        if k < world.Get_size():
            g = split(world, k)
            d = digest(train(learner(g, partition), 15).final_params())
            agree(world, d == alone, f"group of {g.Get_size()} {partition}: {d[:12]} vs {alone[:12]}")


@pytest.mark.mpi(min_size=2)
def test_save_on_all_ranks_restore_alone_and_back_equals_the_uninterrupted_run(world):
    from mpi4py import MPI

    alone = digest(train(learner(MPI.COMM_SELF), 14).final_params())
    root = shared_dir(world)
    a = train(learner(world, "grads"), 6)
    a.save(os.path.join(root, "p"), CFG)
    ok = True
    if world.Get_rank() == 0:  # resume alone from the p-rank checkpoint, save again at step 10
        b = learner(MPI.COMM_SELF)
        b.restore(os.path.join(root, "p"), CFG)
        train(b, 10)
        b.save(os.path.join(root, "one"), CFG)
        ok = b.step == 10
    world.Barrier()
    c = learner(world, "params")
    c.restore(os.path.join(root, "one"), CFG)
    d = digest(train(c, 14).final_params())
    agree(world, ok and d == alone, f"p -> 1 -> p: {d[:12]} vs {alone[:12]}")


@pytest.mark.mpi(min_size=4)
def test_resume_4_to_2_equals_the_uninterrupted_run(world):
    from mpi4py import MPI

    alone = digest(train(learner(MPI.COMM_SELF), 14).final_params())
    root = shared_dir(world)
    four = split(world, 4)
    if world.Get_rank() < 4:
        train(learner(four, "state"), 7).save(os.path.join(root, "four"), CFG)
    world.Barrier()
    two = split(world, 2)
    d = alone
    if world.Get_rank() < 2:
        lr = learner(two)
        lr.restore(os.path.join(root, "four"), CFG)
        d = digest(train(lr, 14).final_params())
    agree(world, d == alone, f"4 -> 2: {d[:12]} vs {alone[:12]}")
