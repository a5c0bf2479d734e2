"""The state digest covers the whole learner state (issue 32 item 6): parameters, every optimizer
array, the step, the optimizer's carried scalars and the seed. A run whose Adam moments were
corrupted does not print the clean run's digest (its parameters' digest is the same), in-process
and through `alpha-mpi train --resume` of a checkpoint whose moments were changed."""

import json

import numpy as np
import pytest
from ckpt_tools import comm_self

from alpha_mpi.checkpoint import Checkpointer, open_checkpoint
from alpha_mpi.learning import MLP, DataParallelLearner, digest
from alpha_mpi.learning.data import SlotStream, synthetic

from conftest import ROOT, alpha_command, printed_digest

DATA = synthetic(4, n=120, n_eval=8, inputs=5, classes=3)


def trained(steps=3, optimizer="adam", seed=0):
    lr = DataParallelLearner(comm_self(), MLP(5, 4, 3), slots=4, optimizer=optimizer, lr=1e-2, seed=seed)
    stream = SlotStream(len(DATA.y), 24, 4, 0)
    for t in range(steps):
        lr.train_step({s: (DATA.X[stream.indices(t, s)], DATA.y[stream.indices(t, s)]) for s in lr.my_slots})
    return lr


def ulp(a, i=0):
    a[i] = np.nextafter(a[i], np.inf)


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda lr: ulp(lr.opt.m),  # Adam's first moment, one ulp
        lambda lr: ulp(lr.opt.v, 5),  # its second moment
        lambda lr: setattr(lr.opt, "b1t", np.nextafter(lr.opt.b1t, 1.0)),  # a carried bias power
        lambda lr: setattr(lr, "step", lr.step + 1),
        lambda lr: setattr(lr, "seed", 1),  # the slots' random numbers and the data order
    ],
    ids=["m", "v", "b1t", "step", "seed"],
)
def test_a_corrupted_state_does_not_give_the_clean_state_digest(corrupt):
    clean, other = trained(), trained()
    assert clean.state_digest() == other.state_digest()
    corrupt(other)
    assert digest(other.final_params()) == digest(clean.final_params())  # the parameters alone: blind
    assert other.state_digest() != clean.state_digest()


def test_sgd_momentum_is_in_the_state_digest():
    clean, other = trained(optimizer="sgd"), trained(optimizer="sgd")
    ulp(other.opt.buf)
    assert other.state_digest() != clean.state_digest()


def test_a_run_resumed_from_corrupted_adam_moments_prints_another_state_digest(tmp_path):
    base = ["train", "--hidden", "8", "--batch", "64", "--log-every", "0"]
    clean, bad = str(tmp_path / "clean"), str(tmp_path / "bad")
    r = alpha_command(*base, "--steps", "4", "--checkpoint-dir", clean, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    straight = printed_digest(r.stdout)
    assert "state digest (params, optimizer, step, rng):" in r.stdout
    # The checkpoint's Adam moments changed by one ulp, written as a learner would write them.
    cfg = open_checkpoint(clean).manifest["config"]
    lr = DataParallelLearner(comm_self(), MLP(128, 8, 10), slots=8, lr=2e-3)
    with Checkpointer(comm_self(), clean, lr, cfg) as ck:
        ck.restore_latest()
    ulp(lr.opt.m, 17)
    with Checkpointer(comm_self(), bad, lr, cfg) as ck:
        ck.save()
    runs = {}
    for name, ck in (("clean", clean), ("bad", bad)):
        out = str(tmp_path / f"{name}.json")
        r = alpha_command(*base, "--steps", "4", "--checkpoint-dir", ck, "--resume", "--json", out, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        runs[name] = (printed_digest(r.stdout), json.load(open(out)))
    assert runs["clean"][0] == straight and runs["clean"][1]["digest"] == straight
    assert runs["bad"][0] != straight  # the corrupted moments are named by the digest
    assert runs["bad"][1]["params_digest"] == runs["clean"][1]["params_digest"]  # the parameters alone: blind
