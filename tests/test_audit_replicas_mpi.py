"""Replica digests (issue 24 item 2) under MPI: healthy runs pass every check with unchanged bits;
one rank's changed parameter or optimizer word is named as the minority (every rank named at
p = 2, said so); partition='params' is refused (nothing replicated). Holds at any size >= 2."""

import numpy as np
import pytest
from test_audit_mpi import SLOTS, learner, step, train

from alpha_mpi.learning import MLP, DataParallelLearner, digest
from alpha_mpi.refusals import Refusal

from conftest import agree


def with_digests(comm, mode, every):
    return DataParallelLearner(
        comm, MLP(6, 10, 3), slots=SLOTS, lr=1e-2, partition=mode, seed=4, timeout=60, audit_digests=every
    )


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", ["none", "state", "grads"])
def test_healthy_replicas_pass_every_check_and_keep_the_bits(world, mode):
    plain = learner(world, mode)
    train(plain, 6)
    for every in (1, 4):
        lr = with_digests(world, mode, every)
        refusals = train(lr, 6)
        agree(world, not refusals and lr.replicas.checked == 6 // every, f"{every}: {refusals}")
        agree(world, digest(lr.final_params()) == digest(plain.final_params()), f"every {every}")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode,what", [("none", "params"), ("none", "m"), ("none", "v")])
def test_one_rank_changed_state_is_named(world, mode, what):
    """Only `none` keeps replicas between steps: in state/grads the parameters are re-assembled
    from their owners every step, so one rank's changed copy heals (or spreads to all)."""
    size, rank = world.Get_size(), world.Get_rank()
    lr = with_digests(world, mode, 2)
    train(lr, 2)
    if rank == size - 1:
        arr = lr.params if what == "params" else lr.opt.state()["arrays"][what]
        arr.view(np.uint64)[3] ^= np.uint64(1) << np.uint64(30)  # a mantissa bit a step cannot round away
    step(lr)  # step 3: no check
    try:
        step(lr)
        got = None
    except Refusal as e:
        got = e
    agree(world, got is not None and got.code == "replica-diverged" and got.context["step"] == 4, repr(got))
    want = (size - 1,) if size >= 3 else (0, 1)
    agree(world, got.context["ranks"] == want, str(got))
    agree(world, ("no majority" in str(got)) == (size == 2), str(got))


def test_replica_digests_refuse_params_mode_and_bad_intervals():
    from mpi4py import MPI

    with pytest.raises(Refusal) as e:
        with_digests(MPI.COMM_SELF, "params", 1)
    assert e.value.code == "options-conflict" and "held by one rank only" in str(e.value)
    for every in (-1, 1.5):
        with pytest.raises(Refusal) as e:
            with_digests(MPI.COMM_SELF, "none", every)
        assert e.value.code == "usage" and "audit_digests" in str(e.value)
