"""Ranks of different compute identities, over MPI at any size >= 2 (issue 32 item 2).

Each rank sets its BLAS thread count from its rank (1 on even ranks, 2 on odd ones, with
threadpoolctl, in-process, under any MPI): a real difference of compute identity, which changes
the bits of compute_models.BlasModel's slots (test_compute_identity.py shows it). Then:

- a model that calls BLAS is refused when the learner is built, on every rank, `compute-mismatch`
  naming the odd ranks and the field `blas.threads`, with and without audit_slots; the next
  learner on uniform threads trains (the next call works);
- a model that declares machine independence trains across the identities, to the bits of the
  same run alone;
- a caller's promise that does not hold is found by the audit: `compute-mismatch` on every rank,
  naming the promise, blaming no rank or host, nothing applied; the same promise on uniform
  threads audits clean;
- replica digests that differ only between identities are `compute-mismatch`, never
  `replica-diverged`; a rank that differs from its own identity's majority is still named;
- `alpha-mpi train --model`'s probe names the field, or the broken declaration.
"""

import numpy as np
import pytest
import threadpoolctl
from compute_models import BlasModel, FixedModel

from alpha_mpi.learning import DataParallelLearner, slice_batch
from alpha_mpi.learning.compute_check import ComputeCheck
from alpha_mpi.learning.replicas import ReplicaDigests
from alpha_mpi.learning.same_start import probe_model
from alpha_mpi.model.compute import MachineIndependent

from conftest import agree

rng = np.random.default_rng(9)
X, Y = rng.standard_normal((80, 6)), rng.integers(0, 3, 80)


def by_rank(world):
    """This rank's BLAS threads: 1 on even ranks, 2 on odd ones."""
    return threadpoolctl.threadpool_limits(1 + world.Get_rank() % 2, user_api="blas")


def odd(world):
    return [r for r in range(world.Get_size()) if r % 2]


def raised(world, build):
    """What `build()` raises on this rank (None: nothing)."""
    try:
        build()
    except Exception as e:
        return e
    return None


def train(lr, steps):
    for _ in range(steps):
        lr.train_step({s: slice_batch(X, Y, lr.slots, [s])[s] for s in lr.needed_slots})


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("audit", [0, 1])
def test_a_blas_model_on_ranks_of_different_identities_is_refused_at_start_on_every_rank(world, audit):
    size = world.Get_size()
    with by_rank(world):
        e = raised(world, lambda: DataParallelLearner(world, BlasModel(6, 3), slots=size, audit_slots=audit))
    code = getattr(e, "code", repr(e))
    agree(world, code == "compute-mismatch", f"refused with {code}")
    ctx = e.context
    agree(world, ctx.get("field") == "blas.threads" and list(ctx.get("ranks")) == odd(world), str(ctx))
    agree(world, "blas.threads" in e.message and "'1'" in e.message and "'2'" in e.message, e.message)
    lr = DataParallelLearner(world, BlasModel(6, 3), slots=size, audit_slots=audit)  # the next call works
    train(lr, 2)
    agree(world, lr.step == 2)


@pytest.mark.mpi(min_size=2)
def test_a_machine_independent_model_trains_across_identities_to_the_bits_of_one_rank(world):
    from mpi4py import MPI

    size = world.Get_size()
    with by_rank(world):
        lr = DataParallelLearner(world, FixedModel(6, 3), slots=size)
        train(lr, 3)
    alone = DataParallelLearner(MPI.COMM_SELF, FixedModel(6, 3), slots=size)
    train(alone, 3)
    agree(world, lr.contract.compute == MachineIndependent("model"))
    same = np.array_equal(lr.final_params().view(np.uint64), alone.final_params().view(np.uint64))
    agree(world, same, "other bits than the same run alone")


@pytest.mark.mpi(min_size=2)
def test_a_false_promise_is_named_by_the_audit_and_blames_no_rank(world):
    size = world.Get_size()
    with by_rank(world):
        lr = DataParallelLearner(world, BlasModel(6, 3), slots=size, machine_independent=True, audit_slots=1)
        before = lr.final_params().copy()
        e = raised(world, lambda: train(lr, 1))
    code = getattr(e, "code", repr(e))
    agree(world, code == "compute-mismatch", f"refused with {code}")
    ctx = e.context
    agree(world, ctx.get("promise") == "caller" and tuple(ctx.get("ranks")) == (0, 1), str(ctx))
    agree(world, "hosts" not in ctx and "no rank or host is blamed" in e.message, e.message)
    agree(world, "blas.threads: rank 0 '1', rank 1 '2'" in e.message, e.message)
    agree(world, lr.step == 0 and np.array_equal(lr.final_params(), before), "something was applied")
    # The same promise where every rank computes alike: the audit passes (the refusal was the environment).
    lr = DataParallelLearner(world, BlasModel(6, 3), slots=size, machine_independent=True, audit_slots=1)
    train(lr, size)
    agree(world, lr.step == size and lr.audit.checked == size)


@pytest.mark.mpi(min_size=2)
def test_replicas_that_differ_only_between_identities_are_an_environment_difference(world):
    size, rank = world.Get_size(), world.Get_rank()
    with by_rank(world):
        check = ComputeCheck.for_model(BlasModel(6, 3), machine_independent=True)
        check.agree(world, what="testing", timeout=60)
    agree(world, check.ranks.classes == tuple(r % 2 for r in range(size)), str(check.ranks.classes))
    digests = ReplicaDigests(world, 1, "none", timeout=60, contract="test-replicas", compute=check)
    e = raised(world, lambda: digests.check(1, [np.array([1.0 + rank % 2])]))
    agree(world, getattr(e, "code", None) == "compute-mismatch" and "hosts" not in e.context, repr(e))
    if size >= 5:  # rank 2 differs from ranks 0 and 4, which compute as it does: a fault, named alone
        values = [np.array([1.0 + rank % 2 + (rank == 2)])]
        e = raised(world, lambda: digests.check(2, values))
        code = getattr(e, "code", None)
        agree(world, code == "replica-diverged" and e.context["ranks"] == (2,), repr(e))
    digests.check(3, [np.array([1.0])])  # the next check works


@pytest.mark.mpi(min_size=2)
def test_the_model_probe_names_the_identity_not_the_rank(world):
    probe = (X[:8], Y[:8])
    with by_rank(world):
        e = raised(
            world,
            lambda: probe_model(
                world, BlasModel(6, 3), probe, compute=ComputeCheck.for_model(BlasModel(6, 3))
            ),
        )
        agree(
            world, getattr(e, "code", None) == "compute-mismatch" and e.context.get("field") == "blas.threads"
        )
        liar = BlasModel(6, 3, machine_independent=True)
        e = raised(world, lambda: probe_model(world, liar, probe, compute=ComputeCheck.for_model(liar)))
        agree(world, getattr(e, "code", None) == "compute-mismatch", repr(e))
        agree(world, e.context.get("promise") == "model" and "gradients" in e.message, e.message)
    probe_model(world, BlasModel(6, 3), probe, compute=ComputeCheck.for_model(BlasModel(6, 3)))
