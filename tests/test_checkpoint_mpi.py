"""Checkpoints across ranks: a refusal on one rank leaves every rank's learner as it was (every
rank reads first, votes, and only then installs); a second Checkpointer on a directory another
job holds is refused on every rank; resume on the same ranks gives the saved state.

    timeout 300 mpiexec -n 2 python -m pytest -q --with-mpi -m mpi tests/test_checkpoint_mpi.py
"""

import os
import tempfile

import pytest

from conftest import agree, bits

CFG = {"slots": 8, "batch": 29, "seed": 3, "hidden": 5, "optimizer": "adam", "lr": 1e-2}


def learner(comm, partition="state"):
    from alpha_mpi.learning import MLP, DataParallelLearner

    return DataParallelLearner(comm, MLP(6, 5, 3), slots=8, lr=1e-2, seed=3, partition=partition, timeout=60)


def step(lr, steps):
    from alpha_mpi.learning.data import SlotStream, synthetic

    data = synthetic(3, n=300, n_eval=8, inputs=6, classes=3)
    stream = SlotStream(len(data.y), 29, 8, 3)
    for _ in range(steps):
        t = lr.step
        lr.train_step({s: (data.X[stream.indices(t, s)], data.y[stream.indices(t, s)]) for s in lr.my_slots})


def snapshot(lr):
    return (
        lr.step,
        bits(lr.params).tobytes(),
        bits(lr.opt.m).tobytes(),
        bits(lr.opt.v).tobytes(),
        lr.opt.b1t,
    )


def shared_dir(world):
    root = tempfile.mkdtemp(prefix="ckmpi-") if world.rank == 0 else None
    return world.bcast(root, root=0)  # the test's own channel, never the product's


@pytest.mark.mpi(min_size=2)
def test_a_refusal_on_one_rank_leaves_every_learner_unchanged(world):
    from alpha_mpi.checkpoint import Checkpointer, open_checkpoint
    from alpha_mpi.refusals import Refusal

    root = shared_dir(world)
    a = learner(world)
    step(a, 2)
    with Checkpointer(world, root, a, CFG, timeout=60) as ck:
        ck.save()
    world.Barrier()
    last = open_checkpoint(root).components["optimizer.m"]["shards"][-1]
    if world.rank == 0:  # corrupt the optimizer.m shard that only its owner reads back
        b = bytearray(open(last["file"], "rb").read())
        b[-1] ^= 1
        open(last["file"], "wb").write(bytes(b))
    world.Barrier()
    b = learner(world)
    before = snapshot(b)
    code = named = None
    with Checkpointer(world, root, b, CFG, timeout=60) as ck:
        try:
            ck.resume()
        except Refusal as e:
            code, named = e.code, e.context.get("peer_code")
    lo, hi = b.own
    reads_it = lo < last["stop"] and last["start"] < hi  # moments: each rank reads its own range only
    # the ranks that read good shards name the refusing rank's code (the verdict round)
    ok = code == "checkpoint-corrupt" if reads_it else (code, named) == ("peer-refused", "checkpoint-corrupt")
    agree(world, ok, f"code {code} naming {named}")
    agree(world, snapshot(b) == before, "a learner changed although a rank refused")


@pytest.mark.mpi(min_size=2)
def test_resume_gives_the_saved_state_on_every_rank(world):
    from alpha_mpi.checkpoint import Checkpointer

    root = shared_dir(world)
    a = learner(world, "grads")
    step(a, 3)
    with Checkpointer(world, root, a, CFG, timeout=60) as ck:
        ck.save()
    b = learner(world, "grads")
    with Checkpointer(world, root, b, CFG, timeout=60) as ck:
        r = ck.resume()
    agree(world, r.step == 3 and snapshot(b) == snapshot(a), "resumed state differs")


@pytest.mark.mpi(min_size=2)
def test_a_locked_directory_is_refused_on_every_rank(world):
    import subprocess
    import sys

    from alpha_mpi.checkpoint import Checkpointer
    from alpha_mpi.refusals import Refusal

    root = shared_dir(world)
    holder = None
    if world.rank == 0:  # another job (process) holds the directory
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys, time; from alpha_mpi.checkpoint.lock import "
                "DirectoryLock; l = DirectoryLock(sys.argv[1]); print('held', flush=True); "
                "time.sleep(60)",
                root,
            ],
            stdout=subprocess.PIPE,
            text=True,
            env={
                k: v
                for k, v in os.environ.items()  # a singleton, not a member of this job
                if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_"))
            },
        )
        assert holder.stdout.readline().strip() == "held"
    world.Barrier()
    code = named = None
    try:
        Checkpointer(world, root, learner(world), CFG, timeout=60)
    except Refusal as e:
        code, named = e.code, e.context.get("peer_code")
    if holder is not None:
        holder.kill()
        holder.wait()
    want = ("checkpoint-locked", None) if world.rank == 0 else ("peer-refused", "checkpoint-locked")
    agree(world, (code, named) == want, f"code {code} naming {named}")
    agree(world, not [f for f in os.listdir(root) if f.startswith("step-")], "something was written")
