"""Learners over MPI: every partition mode and every rank count end with the same bits.

Each rank also trains the same run alone on COMM_SELF (all slots on one rank): the MPI run must
match it bit for bit, so rank-count independence is checked inside every mpiexec run.
"""

import numpy as np
import pytest

from alpha_mpi.learning import MLP, DataParallelLearner, digest
from alpha_mpi.learning.data import SlotStream, synthetic
from alpha_mpi.refusals import Refusal

from conftest import agree, bits

SLOTS = 10


def run(comm, mode, optimizer, steps, topology="hierarchy:2", data=None, model=None, slots=SLOTS):
    data = data or synthetic(7, n=600, n_eval=16, inputs=12, classes=4)
    model = model or MLP(12, 24, 4)
    lr = 1e-2 if optimizer == "adam" else 0.05
    learner = DataParallelLearner(
        comm,
        model,
        slots=slots,
        topology=topology,
        optimizer=optimizer,
        lr=lr,
        partition=mode,
        seed=9,
        timeout=20,
    )
    stream = SlotStream(len(data.y), 53, slots, 9)  # 53 samples over the slots: unequal slots
    for t in range(steps):
        batch = {s: (data.X[stream.indices(t, s)], data.y[stream.indices(t, s)]) for s in learner.my_slots}
        learner.train_step(batch)
    return learner


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_pairwise_over_eight_slots_gives_one_digest_in_every_mode(world, optimizer):
    """8 slots: on 2 and 4 ranks each rank's block is one subtree, so butterfly / halving run;
    on other rank counts replicate / scatter do. The bits are the same everywhere."""
    from mpi4py import MPI

    alone = digest(run(MPI.COMM_SELF, "none", optimizer, 12, "pairwise", slots=8).final_params())
    for mode in ("none", "state", "grads", "params"):
        learner = run(world, mode, optimizer, 12, "pairwise", slots=8)
        d = digest(learner.final_params())
        agree(world, d == alone, f"pairwise {mode} ({learner.realization}) {d[:12]} vs alone {alone[:12]}")
        size = world.Get_size()
        if size in (2, 4, 8):
            agree(
                world,
                learner.realization.split()[0] in ("butterfly", "halving"),
                f"{mode}: {learner.realization}",
            )


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
@pytest.mark.parametrize("topology", ["hierarchy:2", "star", "pairwise"])
def test_all_partition_modes_and_rank_counts_end_with_one_digest(world, optimizer, topology):
    from mpi4py import MPI

    alone = digest(run(MPI.COMM_SELF, "none", optimizer, 20, topology).final_params())
    for mode in ("none", "state", "grads", "params"):
        d = digest(run(world, mode, optimizer, 20, topology).final_params())
        agree(world, d == alone, f"{mode} {optimizer} {topology}: {d[:12]} vs alone {alone[:12]}")


@pytest.mark.mpi(min_size=2)
def test_partitioned_state_lives_only_in_the_owners_range(world):
    size = world.Get_size()
    full = run(world, "none", "adam", 3)
    part = run(world, "state", "adam", 3)
    a, b = part.own
    agree(
        world,
        part.opt.m.size == b - a and abs(part.opt.m.size - full.opt.m.size / size) <= 3,
        "state sharded",
    )
    agree(world, np.array_equal(bits(part.opt.m), bits(full.opt.m[a:b])), "sharded m = replicated m[a:b]")
    agree(world, np.array_equal(bits(part.opt.v), bits(full.opt.v[a:b])), "sharded v = replicated v[a:b]")
    params = run(world, "params", "adam", 3)
    agree(world, params.params.size == b - a, "params sharded")
    agree(world, part.memory()["optimizer"] < full.memory()["optimizer"], "less optimizer memory")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", ["state", "grads", "params"])
def test_an_update_refused_on_one_rank_only_is_named_by_code_on_every_rank(world, mode):
    """Partitioned modes: each rank proposes the update of its own range, so a refusal of the
    last rank's update is seen there only. It rides on that rank's assembly frames (the engine's
    refusal flag, rank and code): that rank raises its own refusal, every other rank
    `peer-refused` naming it and its code, no rank applies the step, and the next step works."""
    from alpha_mpi.refusals import KernelRefusal

    data = synthetic(7, n=600, n_eval=16, inputs=12, classes=4)
    learner = run(world, mode, "adam", 2, data=data)
    before = bits(learner.final_params()).copy()
    last = world.Get_size() - 1
    stream = SlotStream(len(data.y), 53, SLOTS, 9)
    batch = {s: (data.X[stream.indices(2, s)], data.y[stream.indices(2, s)]) for s in learner.my_slots}
    propose = learner.opt.propose
    if world.rank == last and learner.own[1] > learner.own[0]:

        def refuse(*args):
            raise KernelRefusal("non-finite-output", "the update overflowed (injected on this rank)")

        learner.opt.propose = refuse
    try:
        learner.train_step(batch)
        code = named = None
    except Refusal as e:
        code, named = e.code, e.context.get("peer_code")
    learner.opt.propose = propose
    owns = world.allgather(learner.own[1] > learner.own[0])[last]
    want = ("non-finite-output", None) if world.rank == last else ("peer-refused", "non-finite-output")
    agree(world, not owns or (code, named) == want, f"{mode}: {code} naming {named}")
    agree(world, np.array_equal(bits(learner.final_params()), before), "params unchanged everywhere")
    learner.train_step(batch)  # the next step works on every rank
    agree(world, not np.array_equal(bits(learner.final_params()), before), "the next step applied")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", ["none", "grads"])
def test_nan_on_one_rank_refuses_the_step_on_every_rank(world, mode):
    data = synthetic(7, n=600, n_eval=16, inputs=12, classes=4)
    learner = run(world, mode, "adam", 2, data=data)
    before = learner.final_params().copy()
    stream = SlotStream(len(data.y), 53, SLOTS, 9)
    batch = {}
    for s in learner.my_slots:
        X, y = data.X[stream.indices(2, s)].copy(), data.y[stream.indices(2, s)]
        if s == SLOTS - 1:
            X[0, 0] = np.nan
        batch[s] = (X, y)
    try:
        learner.train_step(batch)
        code = None
    except Refusal as e:
        code = e.code
    agree(
        world, code in ("non-finite-contribution", "non-finite-combined", "peer-refused"), f"{mode}: {code}"
    )
    agree(world, np.array_equal(bits(learner.final_params()), bits(before)), "params unchanged everywhere")
