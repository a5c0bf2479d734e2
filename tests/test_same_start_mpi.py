"""Every rank starts from the same state (learning/same_start.py), over MPI at any size >= 2.

The learner refuses, on every rank and in every partition mode, parameters that differ on one
rank by one ulp, naming that rank; a rank whose start fails locally makes every other rank refuse
`peer-refused` naming it, instead of waiting for it; the model probe refuses a rank-dependent
gradient the same way. After each refusal a healthy learner on the same communicator trains to
the bits of the same run alone on COMM_SELF (the next call works).
"""

import numpy as np
import pytest

from alpha_mpi.learning import MLP, DataParallelLearner, digest
from alpha_mpi.learning.data import SlotStream, synthetic
from alpha_mpi.learning.same_start import probe_model
from alpha_mpi.refusals import Refusal

from conftest import agree

MODES = ("none", "state", "grads", "params")
DATA = synthetic(5, n=200, n_eval=8, inputs=6, classes=3)


def odd_rank(world):
    """The rank that differs: the last one (rank 1 at size 2: a tie, broken towards rank 0)."""
    return world.Get_size() - 1


class OnOneRank(MLP):
    """The test's small MLP on rank `rank`, told which rank (`odd`) differs."""

    def __init__(self, odd, rank):
        super().__init__(6, 5, 3)
        self.odd, self.rank, self.calls = odd, rank, 0


class RankInit(OnOneRank):
    """init(seed) one ulp off on `odd` only: visible in the bits, invisible in any printout."""

    def init(self, seed):
        p = super().init(seed)
        if self.rank == self.odd:
            p[7] = np.nextafter(p[7], np.inf)
        return p


class RankGrad(OnOneRank):
    """The gradient one ulp off on `odd`: deterministic on each rank, different across ranks."""

    def loss_and_grad_sum(self, params, X, y, grad_out):
        loss = super().loss_and_grad_sum(params, X, y, grad_out)
        if self.rank == self.odd:
            grad_out[0] = np.nextafter(grad_out[0], np.inf)
        return loss


class NoisyOn(OnOneRank):
    """A gradient with other bits on every call, on `odd` only."""

    def loss_and_grad_sum(self, params, X, y, grad_out):
        loss = super().loss_and_grad_sum(params, X, y, grad_out)
        self.calls += 1
        if self.rank == self.odd:
            grad_out[0] += self.calls * 1e-9
        return loss


def refusal_on_every_rank(world, build):
    """The Refusal (or other exception) `build()` raises on this rank; fails on every rank when
    any rank raised nothing."""
    try:
        build()
    except Exception as e:
        agree(world, True)
        return e
    agree(world, False, "no refusal")


def healthy_run_matches_alone(world, mode="none", comm=None):
    """A learner on `comm` (default `world`) trains to the bits of the same run alone."""
    from mpi4py import MPI

    def run(comm):
        lr = DataParallelLearner(comm, MLP(6, 5, 3), slots=6, partition=mode, seed=2, lr=1e-2, timeout=30)
        stream = SlotStream(len(DATA.y), 30, 6, 2)
        for t in range(3):
            lr.train_step(
                {s: (DATA.X[stream.indices(t, s)], DATA.y[stream.indices(t, s)]) for s in lr.my_slots}
            )
        return digest(lr.final_params())

    alone, here = run(MPI.COMM_SELF), run(world if comm is None else comm)
    agree(world, alone == here, f"after the refusal: {here[:12]} vs alone {alone[:12]}")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", MODES)
def test_one_ulp_of_rank_dependent_init_is_refused_on_every_rank_naming_it(world, mode):
    odd = odd_rank(world)
    model = RankInit(odd, world.Get_rank())
    e = refusal_on_every_rank(
        world, lambda: DataParallelLearner(world, model, slots=world.Get_size(), partition=mode, timeout=30)
    )
    ok = isinstance(e, Refusal) and e.code == "initial-params-mismatch" and e.context["ranks"] == [odd]
    agree(world, ok and f"rank {odd} differ" in e.message, repr(e))
    healthy_run_matches_alone(world, mode)


@pytest.mark.mpi(min_size=2)
def test_init_params_differing_on_one_rank_are_refused_and_equal_ones_accepted(world):
    model, rank, odd = MLP(6, 5, 3), world.Get_rank(), odd_rank(world)
    same = model.init(4)
    other = same.copy()
    if rank == odd:
        other[-1] = -other[-1]
    e = refusal_on_every_rank(
        world,
        lambda: DataParallelLearner(world, model, slots=world.Get_size(), init_params=other, timeout=30),
    )
    agree(
        world, isinstance(e, Refusal) and e.code == "initial-params-mismatch" and e.context["ranks"] == [odd]
    )
    lr = DataParallelLearner(world, model, slots=world.Get_size(), init_params=same, timeout=30)
    agree(world, np.array_equal(lr.params.view(np.uint64), same.view(np.uint64)))


# One rank's mistake in the constructor's own checks, each with the code that rank raises.
MISTAKES = {
    "slots": ({"slots": 1}, "placement-invalid"),
    "topology": ({"topology": "no-such-topology"}, "topology-invalid"),
    "partition": ({"partition": "rows"}, "usage"),
    "optimizer": ({"optimizer": "adagrad"}, "usage"),
    "audit_slots": ({"audit_slots": 99}, "usage"),
    "audit_digests": ({"audit_digests": -2}, "usage"),
    "machine_independent": ({"machine_independent": "yes"}, "usage"),
}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("channel", ["first object", "after a call"])
@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_one_ranks_constructor_check_is_refused_on_every_rank_in_the_first_round(world, mistake, channel):
    """Issue 36 item 1: the learner is the first alpha_mpi object on a fresh communicator (its
    endpoint is made in the learner's first round), or a convenience call came first. One rank
    refuses in its own checks; every rank refuses at once by name (no rank builds a learner
    that waits for it, none blocks in the duplicate), and the next learner on the same
    communicator pairs correctly: it trains to the bits of the run alone. Before the fix the
    peers built their learner from that rank's next one (the audit's options: they returned a
    learner), or timed out."""
    from alpha_mpi import star
    from alpha_mpi.execution import allreduce

    rank, odd = world.Get_rank(), odd_rank(world)
    comm = world.Dup()
    if channel == "after a call":
        allreduce(comm, star(range(comm.Get_size()), comm.Get_size()), {rank: np.ones(3)}, timeout=30)
    kw, code = MISTAKES[mistake]
    args = {"slots": 2 * world.Get_size(), "timeout": 30, **(kw if rank == odd else {})}
    e = refusal_on_every_rank(world, lambda: DataParallelLearner(comm, MLP(6, 5, 3), **args))
    if rank == odd:
        ok = isinstance(e, Refusal) and e.code == code
    else:
        ok = (
            isinstance(e, Refusal)
            and e.code == "peer-refused"
            and e.context == {"peer": odd, "peer_code": code}
        )
    agree(world, ok, f"rank {rank}: {e!r}")
    healthy_run_matches_alone(world, comm=comm)
    comm.Free()


@pytest.mark.mpi(min_size=2)
def test_a_local_failure_at_the_start_travels_to_every_rank_by_name(world):
    model, rank, odd = MLP(6, 5, 3), world.Get_rank(), odd_rank(world)
    bad = model.init(0)[: -1 if rank == odd else None]  # one value short on `odd`
    e = refusal_on_every_rank(
        world, lambda: DataParallelLearner(world, model, slots=world.Get_size(), init_params=bad, timeout=30)
    )
    if rank == odd:
        ok = isinstance(e, Refusal) and e.code == "usage" and "init_params" in e.message
    else:
        ok = (
            isinstance(e, Refusal)
            and e.code == "peer-refused"
            and e.context == {"peer": odd, "peer_code": "usage"}
        )
    agree(world, ok, repr(e))

    class Raises(MLP):
        def init(self, seed):
            if rank == odd:
                raise ValueError("a bug in the user's init")
            return super().init(seed)

    e = refusal_on_every_rank(
        world, lambda: DataParallelLearner(world, Raises(6, 5, 3), slots=world.Get_size())
    )
    if rank == odd:
        ok = isinstance(e, ValueError)  # the user's own exception, not hidden
    else:
        ok = isinstance(e, Refusal) and e.code == "peer-refused" and e.context["peer"] == odd
    agree(world, ok, repr(e))
    healthy_run_matches_alone(world)


@pytest.mark.mpi(min_size=2)
def test_the_probe_refuses_a_rank_dependent_gradient_on_every_rank(world):
    rank, odd = world.Get_rank(), odd_rank(world)
    probe = (DATA.X[:8], DATA.y[:8])
    e = refusal_on_every_rank(world, lambda: probe_model(world, RankGrad(odd, rank), probe, timeout=30))
    ok = isinstance(e, Refusal) and e.code == "model-rank-dependent" and e.context["ranks"] == [odd]
    agree(world, ok and "gradients" in e.message, repr(e))
    # nondeterministic on one rank: that rank names it, every other rank names that rank
    e = refusal_on_every_rank(world, lambda: probe_model(world, NoisyOn(odd, rank), probe, timeout=30))
    want = ("model-nondeterministic", {}) if rank == odd else ("peer-refused", {"peer": odd})
    ok = isinstance(e, Refusal) and e.code == want[0] and all(e.context[k] == v for k, v in want[1].items())
    agree(world, ok, repr(e))
    probe_model(world, MLP(6, 5, 3), probe, timeout=30)  # a healthy model passes on every rank
    healthy_run_matches_alone(world, "params")
