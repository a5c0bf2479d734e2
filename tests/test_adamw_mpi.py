"""The numpy learner's AdamW over MPI (issue 44 item 7): one digest on 1, 2, 4 ranks and the whole
world, in every partition mode, and the oracle's bits; a resume with another weight decay refused
on every rank by name unless adopted (then recorded).

Each rank also trains alone on COMM_SELF (every slot on one rank) and with the independent oracle
(the declared tree in Python floats, oracle.adamw): every run must end in those bits.
"""

from __future__ import annotations

import tempfile

import numpy as np
import pytest
from test_adamw import oracle_adamw_run

from alpha_mpi.learning import MLP, DataParallelLearner
from alpha_mpi.learning.data import SlotStream, synthetic
from alpha_mpi.model import build
from alpha_mpi.refusals import Refusal

from conftest import agree, bits, groups

SLOTS, BATCH, LR, WD = 8, 53, 2e-2, 0.1
MODES = ("none", "state", "grads", "params")


def _data():
    return synthetic(7, n=600, n_eval=16, inputs=12, classes=4)


def run(comm, mode, steps, *, wd=WD, learner=None):
    data = _data()
    learner = learner or DataParallelLearner(
        comm,
        MLP(12, 24, 4),
        slots=SLOTS,
        optimizer="adamw",
        lr=LR,
        weight_decay=wd,
        partition=mode,
        seed=9,
        timeout=60,
    )
    stream = SlotStream(len(data.y), BATCH, SLOTS, 9)  # 53 over 8 slots: unequal slots
    for _ in range(steps):
        t = learner.step
        idx = {s: stream.indices(t, s) for s in learner.my_slots}
        learner.train_step({s: (data.X[i], data.y[i]) for s, i in idx.items()})
    return learner


def oracle_params(steps):
    """The run in plain Python floats (tests/test_adamw.py's oracle learner)."""
    data = _data()
    model = MLP(12, 24, 4)
    p0 = model.init(9)
    stream = SlotStream(len(data.y), BATCH, SLOTS, 9)
    return oracle_adamw_run(model, build("pairwise", SLOTS, 1), p0, data, stream, SLOTS, steps, LR, WD)[-1]


@pytest.mark.mpi(min_size=2)
def test_adamw_gives_one_digest_on_every_rank_count_and_partition_mode_and_the_oracles_bits(world):
    from mpi4py import MPI

    steps = 6
    want = oracle_params(steps)
    alone = run(MPI.COMM_SELF, "none", steps)
    agree(world, np.array_equal(bits(alone.params), bits(want)), "COMM_SELF run vs the oracle")
    digest = alone.state_digest()
    comms = [world, *groups(world)]  # the whole world, then the first 2 and 4 ranks inside it
    for comm in comms:
        for mode in MODES:
            learner = run(comm, mode, steps)
            got = learner.state_digest()
            full = learner.final_params()
            ok = got == digest and np.array_equal(bits(full), bits(want))
            agree(world, ok, f"{comm.Get_size()} ranks, {mode}: {got[:12]} vs {digest[:12]}")
    for comm in comms[1:]:
        comm.Free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", ["none", "params"])
def test_a_resume_with_another_weight_decay_is_refused_on_every_rank_unless_adopted(world, mode):
    from alpha_mpi.checkpoint import open_checkpoint

    root = world.bcast(tempfile.mkdtemp(prefix="adamw_ck_") if world.Get_rank() == 0 else None)
    saved = run(world, mode, 3)
    saved.save(root)
    want = run(world, mode, 5).state_digest()  # the uninterrupted run
    other = run(world, "state", 0, wd=0.05)
    code, message = None, ""
    try:
        other.restore(root)
    except Refusal as e:
        code, message = e.code, e.message
    agree(world, code == "checkpoint-config-mismatch", f"refused as {code}")
    agree(world, "weight_decay: saved 0.1, now 0.05" in message and "adopt_weight_decay" in message, message)
    agree(world, other.step == 0, "nothing installed")
    # the same weight decay resumes to the uninterrupted bits, on another partition mode
    same = run(world, "grads", 0)
    same.restore(root)
    agree(world, run(world, "grads", 2, learner=same).state_digest() == want, "resumed digest")
    # adopted: resumed and recorded in the next checkpoint
    other.restore(root, adopt_weight_decay=True)
    run(world, "state", 1, learner=other)
    other.save(root)
    m = open_checkpoint(root).manifest
    entry = {"at_step": 3, "field": "weight_decay", "from": 0.1, "to": 0.05}
    agree(world, entry in m.get("resume_history", []), str(m.get("resume_history")))
    agree(world, m["scalars"]["optimizer_hyper"]["weight_decay"] == 0.05, "the new weight decay saved")
    world.Barrier()
    if world.Get_rank() == 0:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
