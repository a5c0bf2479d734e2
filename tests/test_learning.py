"""The learner in one process (COMM_SELF): equal to the independent oracle bit for bit.

The oracle learner shares no code with the kernel or planner: it evaluates the declared tree over
the slots' (Σg, Σn, Σloss) payloads with Python floats, divides once, and applies the Adam / SGD
formula in Python floats. Per-slot gradients come from the same numpy model code (the combine
and the update are what is under test, not numpy's matmul).
"""

import numpy as np
import pytest

from alpha_mpi import oracle
from alpha_mpi.learning import MLP, DataParallelLearner, digest
from alpha_mpi.learning.data import SlotStream, slot_sizes, synthetic
from alpha_mpi.model import build
from alpha_mpi.refusals import Refusal

from conftest import bits


def self_comm():
    from mpi4py import MPI

    return MPI.COMM_SELF


def batches(data, stream, slots, step):
    return {s: (data.X[stream.indices(step, s)], data.y[stream.indices(step, s)]) for s in range(slots)}


def oracle_run(model, tree, p0, data, stream, slots, steps, optimizer, lr, momentum=0.9):
    n = model.n_params
    p = p0.tolist()
    m, v, buf = [0.0] * n, [0.0] * n, [0.0] * n
    b1, b2, eps = 0.9, 0.999, 1e-8
    b1t, b2t = b1, b2
    history = []
    for t in range(steps):
        payloads = {}
        params = np.array(p)
        for s, (X, y) in batches(data, stream, slots, t).items():
            g = np.zeros(n)
            loss = model.loss_and_grad_sum(params, X, y, g)
            payloads[s] = g.tolist() + [float(len(y)), loss]
        total = oracle.evaluate(tree, payloads)
        mass = total[n]
        grad = [x / mass for x in total[:n]]
        if optimizer == "adam":
            p, m, v = oracle.adam(p, m, v, grad, lr, b1, b2, eps, b1t, b2t)
            b1t, b2t = b1t * b1, b2t * b2
        else:
            p, buf = oracle.sgd(p, buf, grad, lr, momentum)
        history.append(np.array(p))
    return history


@pytest.mark.parametrize("optimizer,lr", [("adam", 1e-2), ("sgd", 0.1)])
@pytest.mark.parametrize("topology", ["star", "hierarchy:2", "hierarchy:3"])
def test_replicated_learner_equals_the_oracle(optimizer, lr, topology):
    data = synthetic(3, n=512, n_eval=16, inputs=6, classes=3)
    model = MLP(6, 5, 3)
    slots, batch = 5, 37  # 37 = 8+8+7+7+7: unequal slot sizes
    learner = DataParallelLearner(
        self_comm(), model, slots=slots, topology=topology, optimizer=optimizer, lr=lr, seed=4
    )
    stream = SlotStream(len(data.y), batch, slots, 4)
    p0 = learner.params.copy()
    want = oracle_run(model, build(topology, slots, 1), p0, data, stream, slots, 6, optimizer, lr)
    for t in range(6):
        learner.train_step(batches(data, stream, slots, t))
        assert np.array_equal(bits(learner.params), bits(want[t])), f"step {t}"


def test_unequal_slots_give_exactly_sum_g_over_sum_n():
    assert slot_sizes(37, 5) == [8, 8, 7, 7, 7]
    stream = SlotStream(100, 10, 3, 0, sizes=[1, 2, 7])
    assert [len(stream.indices(0, s)) for s in range(3)] == [1, 2, 7]
    data = synthetic(5, n=200, n_eval=8, inputs=4, classes=3)
    model = MLP(4, 3, 3)
    learner = DataParallelLearner(self_comm(), model, slots=3, optimizer="sgd", lr=0.5, momentum=0.0, seed=1)
    p0 = learner.params.copy()
    b = batches(data, stream, 3, 0)
    learner.train_step(b)
    # Oracle: Σ over slots of per-slot sums, divided once by Σ n (not a mean of slot means).
    n = model.n_params
    pay = {}
    for s, (X, y) in b.items():
        g = np.zeros(n)
        model.loss_and_grad_sum(p0, X, y, g)
        pay[s] = g.tolist() + [float(len(y)), 0.0]
    tot = oracle.evaluate(build("hierarchy:2", 3, 1), pay)
    assert tot[n] == 10.0
    want = [p - 0.5 * (x / tot[n]) for p, x in zip(p0.tolist(), tot[:n])]
    assert np.array_equal(bits(learner.params), bits(np.array(want)))
    mean_of_means = np.mean([np.array(pay[s][:n]) / pay[s][n] for s in pay], axis=0)
    assert not np.allclose(np.array(tot[:n]) / tot[n], mean_of_means), "slot sizes must matter in this data"


def test_one_rank_all_modes_same_digest():
    data = synthetic(1, n=256, n_eval=8, inputs=8, classes=4)
    model = MLP(8, 16, 4)
    digests = set()
    for mode in ("none", "state", "grads", "params"):
        lr_ = DataParallelLearner(self_comm(), model, slots=4, partition=mode, seed=2, lr=1e-2)
        stream = SlotStream(256, 32, 4, 2)
        for t in range(5):
            lr_.train_step(batches(data, stream, 4, t))
        digests.add(digest(lr_.final_params()))
    assert len(digests) == 1


def test_nan_in_a_slot_refuses_the_step_and_keeps_state():
    data = synthetic(1, n=64, n_eval=8, inputs=4, classes=3)
    model = MLP(4, 3, 3)
    learner = DataParallelLearner(self_comm(), model, slots=2, seed=0, lr=1e-2)
    stream = SlotStream(64, 8, 2, 0)
    learner.train_step(batches(data, stream, 2, 0))
    before = (
        learner.params.copy(),
        learner.opt.m.copy(),
        learner.opt.v.copy(),
        learner.opt.b1t,
        learner.step,
    )
    b = batches(data, stream, 2, 1)
    X, y = b[1]
    X = X.copy()
    X[0, 0] = np.nan
    b[1] = (X, y)
    with pytest.raises(Refusal) as e:
        learner.train_step(b)
    assert e.value.code == "non-finite-contribution"
    after = (learner.params, learner.opt.m, learner.opt.v)
    assert all(np.array_equal(bits(x), bits(y)) for x, y in zip(before[:3], after))
    assert learner.opt.b1t == before[3] and learner.step == before[4]
    learner.train_step(batches(data, stream, 2, 1))  # and it goes on


def test_overflowing_update_is_refused_with_state_intact():
    data = synthetic(1, n=64, n_eval=8, inputs=4, classes=3)
    model = MLP(4, 3, 3)
    learner = DataParallelLearner(
        self_comm(), model, slots=2, optimizer="sgd", lr=1e308, momentum=0.0, seed=0
    )
    learner.params[:] = 1e308
    before = learner.params.copy()
    with pytest.raises(Refusal) as e:
        learner.train_step(batches(data, SlotStream(64, 8, 2, 0), 2, 0))
    assert e.value.code in ("non-finite-output", "non-finite-combined", "non-finite-contribution")
    assert np.array_equal(bits(learner.params), bits(before))


def test_refusals():
    model = MLP(4, 3, 3)
    with pytest.raises(Refusal) as e:
        DataParallelLearner(self_comm(), model, slots=2, partition="zero3")
    assert e.value.code == "usage"
    with pytest.raises(Refusal) as e:
        SlotStream(10, 2, 3, 0)
    assert e.value.code == "options-conflict"  # a batch of 2 cannot fill 3 slots


def test_learner_refuses_to_start_with_flush_to_zero_on():
    from alpha_mpi import kernel
    from alpha_mpi_verify.fpenv import ftz_daz

    with ftz_daz(ftz=True, daz=False), pytest.raises(Refusal) as e:
        DataParallelLearner(self_comm(), MLP(4, 3, 3), slots=2)
    assert e.value.code == "fp-environment-off-profile"
    kernel.fpenv_check()
