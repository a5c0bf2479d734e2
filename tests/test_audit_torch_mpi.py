"""alpha_mpi.torch.DataParallel with audit_slots= and audit_digests= (issue 24 item 4): a healthy
run keeps the bits of an unaudited one (dropout included); a flipped bit in one rank's slot
gradient is caught before `.grad` is written and the rank named (none at 2 ranks: no referee);
a flip in the audit's own words names the rank that carried them, never the healthy owner and
auditor (issue 45); a parameter changed on one rank is named by the replica digests. Holds at
any size >= 2; skips without torch."""

import pytest

torch = pytest.importorskip("torch")

from alpha_mpi.refusals import Refusal  # noqa: E402
from alpha_mpi.torch import DataParallel  # noqa: E402
from alpha_mpi_verify.faults import BitFlip, CarriedFlip  # noqa: E402

from conftest import agree  # noqa: E402

SUM = torch.nn.CrossEntropyLoss(reduction="sum")
SLOTS = 6
G = torch.Generator().manual_seed(1)
X, Y = torch.rand(60, 12, generator=G), torch.randint(0, 3, (60,), generator=G)


def run(comm, steps, *, k=0, every=0, hook=None, edit=None):
    """(digest, refusal or None, steps done); `edit(dp)` runs on every rank after step 2."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(12, 16), torch.nn.Dropout(0.2), torch.nn.ReLU(), torch.nn.Linear(16, 3)
    )
    dp = DataParallel(net, comm, slots=SLOTS, timeout=60, audit_slots=k, audit_digests=every, fault_hook=hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for t in range(steps):
        if t == 2 and edit is not None:
            edit(dp)
        try:
            dp.step(X, Y, SUM)
        except Refusal as e:
            return dp.digest(), e, t, all(p.grad is None for p in dp.params)
        opt.step()
    return dp.digest(), None, steps, True


@pytest.mark.mpi(min_size=2)
def test_torch_auditing_keeps_the_bits(world):
    from mpi4py import MPI

    want, *_ = run(MPI.COMM_SELF, 5)
    for k, every in ((0, 0), (1, 2), (SLOTS, 1)):
        d, e, _, _ = run(world, 5, k=k, every=every)
        agree(world, e is None and d == want, f"K={k} digests every {every}: {e}")


@pytest.mark.mpi(min_size=2)
def test_torch_audit_words_ride_in_the_combine(world):
    """A healthy audited run runs no verdict round on the communicator (its referees' table
    taken away too) and keeps the unaudited bits; every audit passed."""
    from mpi4py import MPI

    from alpha_mpi.execution import Endpoint

    class NoRound:
        def run(self, *args, **kwargs):
            raise AssertionError("a healthy audited step ran a verdict round of its own")

    want, *_ = run(MPI.COMM_SELF, 8)
    audits, rounds = [], []

    def edit(dp):
        dp.audit._referee = NoRound()
        audits.append(dp.audit)
        rounds.append(Endpoint.existing(world).rounds)

    d, e, _, _ = run(world, 8, k=1, edit=edit)  # from step 2 on: a round at a step m = p (<= 6)
    checked = sum(len(audits[0].schedule.audited(t)) for t in range(2, 8))
    agree(world, e is None and d == want, f"{e}")
    agree(world, Endpoint.existing(world).rounds == rounds[0], "the healthy steps ran verdict rounds")
    agree(world, audits[0].checked >= checked > 0, f"{audits[0].checked} audits passed")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("element,bit", [(0, 0), (40, 62)])
def test_torch_flipped_bit_caught_before_grad_and_named(world, element, bit):
    size = world.Get_size()
    _, e, t, no_grad = run(world, 5, k=SLOTS, hook=BitFlip(rank=size - 1, step=3, element=element, bit=bit))
    code = "sdc-detected" if size >= 3 else "sdc-undetermined"  # 2 ranks: no referee, none named
    agree(world, e is not None and e.code == code and t == 3 and no_grad, f"{e!r} at {t}")
    want = (size - 1,) if size >= 3 else ()
    agree(world, tuple(sorted(e.context["ranks"])) == want, str(e))


@pytest.mark.mpi(min_size=2)
def test_torch_a_flip_in_the_audits_own_words_names_the_rank_that_carried_them(world):
    """Every rank in turn carries a flipped digest word (bit 62: a zero becomes 2.0, a digest
    half changes): the refusal names that rank alone (before: the slot's owner and auditor)."""
    for bad in range(world.Get_size()):
        _, e, t, no_grad = run(world, 5, k=SLOTS, hook=CarriedFlip(rank=bad, step=3, element=0, bit=62))
        ok = e is not None and e.code == "sdc-detected" and t == 3 and no_grad
        agree(world, ok and e.context["ranks"] == (bad,), f"rank {bad}'s words: {e!r} at {t}")


@pytest.mark.mpi(min_size=2)
def test_torch_replica_digests_name_a_changed_parameter(world):
    size, rank = world.Get_size(), world.Get_rank()

    def edit(dp):
        if rank == size - 1:
            with torch.no_grad():
                dp.params[0].view(-1)[5] = torch.nextafter(dp.params[0].view(-1)[5], torch.tensor(2.0))

    _, e, t, _ = run(world, 5, every=2, edit=edit)
    agree(world, e is not None and e.code == "replica-diverged" and t == 2, f"{e!r} at {t}")
    want = (size - 1,) if size >= 3 else (0, 1)
    agree(world, e.context["ranks"] == want, str(e))


@pytest.mark.mpi(min_size=2)
def test_torch_step_local_with_audit_slots_is_options_conflict_and_step_works(world):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(12, 3))
    dp = DataParallel(net, world, slots=SLOTS, timeout=60, audit_slots=1)
    code = None
    try:
        dp.step_local(X[:10], Y[:10], SUM, sizes=[10] * SLOTS)
    except Refusal as e:
        code = e.code
    agree(world, code == "options-conflict", f"step_local with audit_slots: {code}")
    dp.step(X, Y, SUM)  # the next step works
    agree(world, all(p.grad is not None for p in dp.params), "the step after the refusal")
