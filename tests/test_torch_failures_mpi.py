"""One rank's failure inside a DataParallel's step or a sharded optimizer's step (issue 43):
every rank refuses it by name within that call, never at the peer bound, and the run goes on to
the digest of a run that never failed.

- a forward that raises on the last rank only (every partition mode);
- a loss that is NaN on the last rank only (a non-finite refusal on every rank);
- an audited slot whose recomputation raises on the first rank auditing one (before: it left
  the step while every other rank waited in the combine until the bound, `peer-timeout`, and
  the combine was broken for good);
- a sharded optimizer (`partition` "state", "grads", "params") whose torch update raises on the last rank after it
  has changed part of its shard (the step count of a piece); and a step hook of the caller's
  that raises on a rank holding an empty shard (a model smaller than one block). Before: every
  other rank waited in the assembly until the bound. Now every rank puts its shard back, so the
  state digest right after the refusal is the one before the step, and `opt.step()` again
  gives the uninterrupted run's digest.

The failing rank raises its own exception, its `__cause__` the refusal (`torch-slot-failed`,
`torch-optimizer-failed`); every other rank `peer-refused` naming it. Holds at any size >= 2.
"""

import pytest

torch = pytest.importorskip("torch")

from alpha_mpi.refusals import Refusal  # noqa: E402
from alpha_mpi.torch import DataParallel  # noqa: E402

from conftest import agree  # noqa: E402
from lm_common import batch, lm, token_pair  # noqa: E402

SLOTS = 8
STEPS = 3
FAIL_AT = 1  # from this update on, the step (or optimizer step) fails once
BOUND = 120  # the peer bound: a refusal must come from the flag, not from this


def decay_groups(model):
    named = list(model.named_parameters())
    return [
        {"params": [p for _, p in named if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0},
    ]


class Failure:
    """One failure, armed for one call: `loss(dp)` the step's loss (it may raise or give NaN on
    one rank), `arm_optimizer(opt)` / `disarm_optimizer(opt)` a failing torch update."""

    def __init__(self, comm, case):
        self.comm, self.case, self.armed = comm, case, False
        self.last = comm.Get_size() - 1
        self.failing = None if case == "audit" else self.last
        self.calls = 0

    def loss(self, dp):
        if not self.armed or self.case not in ("forward", "nan", "audit"):
            return token_pair
        self.calls = 0
        here = self.comm.Get_rank()
        if self.case == "audit":  # the first rank that recomputes a slot in this step fails
            auditing = self.comm.allgather(len(dp.needed_slots) > len(dp.my_slots))
            self.failing = auditing.index(True) if any(auditing) else None

        def failing(out, y):
            self.calls += 1
            if self.case == "forward" and here == self.last:
                raise RuntimeError("the last rank's forward broke")
            # calls beyond its own slots: this rank recomputes an audited slot
            if self.case == "audit" and here == self.failing and self.calls > len(dp.my_slots):
                raise RuntimeError("the auditor's recomputation broke")
            loss, mass = token_pair(out, y)
            if self.case == "nan" and here == self.last:
                loss = loss * float("nan")
            return loss, mass

        return failing

    def arm_optimizer(self, opt):
        self.saved = None
        if self.armed and self.case == "optimizer" and self.comm.Get_rank() == self.last:
            # the last group this rank holds pieces of: torch counts a piece's step, then
            # `1 - lr * weight_decay` raises, so the failing rank's shard is changed in part
            group = [g for g in opt.param_groups if g["params"]][-1]
            self.saved = (group, group["weight_decay"])
            group["weight_decay"] = "not a number"

    def disarm_optimizer(self):
        if self.saved is not None:
            group, value = self.saved
            group["weight_decay"] = value
        self.saved = None


def train(comm, partition, case=None, audit=0):
    """STEPS updates; with `case`, the step (or the optimizer's step) of update FAIL_AT fails
    once on one rank and is called again. Returns the final state digest and, with `case`,
    what this rank raised, and whether the state digest right after the optimizer's failure
    was the one before its step."""
    torch.set_num_threads(1)
    model = lm()
    dp = DataParallel(model, comm, slots=SLOTS, seed=5, timeout=BOUND, partition=partition, audit_slots=audit)
    opt = dp.optimizer(torch.optim.AdamW, decay_groups(model), lr=3e-3)
    fail = Failure(comm, case)
    raised, kept = None, None
    while dp.updates < STEPS:
        first = 0 if case == "audit" else FAIL_AT  # step 0 is audited on any rank count
        fail.armed = case is not None and dp.updates >= first and raised is None  # until it fires
        X, y = batch(dp.steps * 16, 16)
        try:
            dp.step(X, y, fail.loss(dp))
        except Exception as e:
            raised = e
            continue  # nothing was applied: the same batch again, unarmed
        before = dp.state_digest(opt) if fail.armed and case == "optimizer" else None
        fail.arm_optimizer(opt)
        try:
            opt.step()
        except Exception as e:
            raised = e
            fail.disarm_optimizer()
            kept = dp.state_digest(opt) == before
            opt.step()  # the cause gone: the same update again
        opt.zero_grad()
    out = dp.state_digest(opt), raised, kept, fail.failing
    dp.free()
    return out


def check_raised(world, raised, failing, code, own=RuntimeError):
    """The failing rank raised its own exception (the refusal its cause), every other rank
    `peer-refused` naming it and the code."""
    rank = world.Get_rank()
    if rank == failing:
        ok = isinstance(raised, own) and getattr(raised.__cause__, "code", None) == code
    else:
        ok = (
            isinstance(raised, Refusal)
            and raised.code == "peer-refused"
            and raised.context.get("peer") == failing
            and raised.context.get("peer_code") == code
        )
    agree(world, ok, f"rank {rank}: {raised!r} (cause {getattr(raised, '__cause__', None)!r})")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("partition", ["none", "state", "grads", "params"])
def test_a_forward_raising_on_one_rank_is_refused_on_every_rank_and_the_run_goes_on(world, partition):
    clean, _, _, _ = train(world, partition)
    d, raised, _, failing = train(world, partition, "forward")
    check_raised(world, raised, failing, "torch-slot-failed")
    agree(world, d == clean, f"{partition}: {d[:12]} after the failure vs {clean[:12]}")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("partition", ["none", "state", "grads", "params"])
def test_a_nan_loss_on_one_rank_is_refused_on_every_rank_and_the_run_goes_on(world, partition):
    clean, _, _, _ = train(world, partition)
    d, raised, _, failing = train(world, partition, "nan")
    ok = isinstance(raised, Refusal) and raised.code.startswith(("non-finite", "peer-refused"))
    agree(world, ok, f"rank {world.Get_rank()}: {raised!r}")
    agree(world, d == clean, f"{partition}: {d[:12]} after the NaN vs {clean[:12]}")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("partition", ["none", "state"])
def test_an_audited_recomputation_raising_on_one_rank_is_refused_on_every_rank(world, partition):
    clean, _, _, _ = train(world, partition, audit=1)
    d, raised, _, failing = train(world, partition, "audit", audit=1)
    agree(world, failing is not None, "a rank recomputed an audited slot")
    check_raised(world, raised, failing, "torch-slot-failed")
    agree(world, d == clean, f"{partition}: {d[:12]} after the failure vs {clean[:12]}")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("partition", ["state", "grads", "params"])
def test_a_sharded_update_raising_on_one_rank_is_refused_on_every_rank_and_put_back(world, partition):
    clean, _, _, _ = train(world, partition)
    d, raised, kept, failing = train(world, partition, "optimizer")
    check_raised(world, raised, failing, "torch-optimizer-failed", own=TypeError)
    agree(world, kept, "the state digest right after the refused update is the one before it")
    agree(world, d == clean, f"{d[:12]} after the refused update vs {clean[:12]}")
    short, _, _, _ = train(world, "none")
    agree(world, clean == short, f"{partition} and none agree")  # the runs above are the replicated run's


@pytest.mark.mpi(min_size=2)
def test_a_step_hook_raising_on_a_rank_with_an_empty_shard_is_refused_on_every_rank(world):
    """A module smaller than one block: only rank 0 holds a shard, so the last rank sends no
    frame in the assembly; its failure travels in a verdict round before it."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    dp = DataParallel(net, world, slots=SLOTS, timeout=BOUND, partition="state")
    opt = dp.optimizer(torch.optim.AdamW, list(net.parameters()), lr=1e-2)
    last = world.Get_size() - 1
    X = torch.linspace(-1, 1, 48).reshape(16, 3)
    Y = torch.linspace(1, -1, 32).reshape(16, 2)
    sse = torch.nn.MSELoss(reduction="sum")
    digests = []
    for k in range(3):
        dp.step(X, Y, sse)
        before = dp.state_digest(opt)
        handle = None
        if k == 1 and world.Get_rank() == last:

            def hook(o, args, kwargs):
                raise ValueError("the caller's hook broke on this rank")

            handle = opt.register_step_pre_hook(hook)
        try:
            opt.step()
            raised = None
        except Exception as e:
            raised = e
            if handle is not None:
                handle.remove()
            agree(world, dp.state_digest(opt) == before, "the state after the refusal is the one before")
            opt.step()
        if k == 1:
            check_raised(world, raised, last, "torch-optimizer-failed", own=ValueError)
        opt.zero_grad()
        digests.append(dp.state_digest(opt))
    dp.free()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    dp = DataParallel(net, world, slots=SLOTS, timeout=BOUND, partition="state")
    opt = dp.optimizer(torch.optim.AdamW, list(net.parameters()), lr=1e-2)
    for _ in range(3):
        dp.step(X, Y, sse)
        opt.step()
        opt.zero_grad()
    agree(world, dp.state_digest(opt) == digests[-1], "the uninterrupted run's digest")
    agree(world, len(set(digests)) == 3, "every update changed the state")
    dp.free()
