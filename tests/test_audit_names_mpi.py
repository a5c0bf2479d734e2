"""Whom the audit names under MPI (issue 45 item 5): never a rank that computed right.

Each case of the issue, through the real learner and combine: a flip in the audit's own words on
a third rank (owner and auditor, both healthy, were named, never the faulty rank), in the
owner's words (the healthy auditor was named beside it), two ranks wrong alike (the healthy
auditor alone was named), and p = 2. The faults that change the carried words wrap
`SlotAudit.contribute` (so the same test runs against an audit without a hook of its own).
The boundary docs/audit.md states: a payload changed after its digest is applied silently.
Written to hold at 2 and 5 ranks (and at any size the marks allow)."""

import numpy as np
import pytest
from test_audit_mpi import SLOTS, learner, state, step, train

from alpha_mpi.learning import digest
from alpha_mpi.refusals import Refusal
from alpha_mpi_verify.faults import BitFlip, CarriedFlip, Faults

from conftest import agree


def _first_round_roles(lr, t):
    """(slot j = 0, its owner, auditor, referees) of the round at step t."""
    s, (a, refs) = next(iter(lr.audit.schedule.round(t).items()))
    return s, lr.audit.owner_of[s], a, refs


def _flip_carried(lr, rank, element, bit, at):
    """After `contribute` wrote this rank's words (the digests' halves, zeros elsewhere), flip
    bit `bit` of word `element` on `rank` at step `at`: the words changed before the combine."""
    orig = lr.audit.contribute

    def contribute(t, payloads, compute, scratch, out, **kw):
        orig(t, payloads, compute, scratch, out, **kw)
        if lr.rank == rank and t == at:
            out.view(np.uint64)[element] ^= np.uint64(1) << np.uint64(bit)

    lr.audit.contribute = contribute


def _refused_step(lr):
    try:
        step(lr)
    except Refusal as e:
        return e
    return None


def _check_refused(world, lr, healthy, got, want_code, want_ranks, before):
    """Every rank refused alike naming `want_ranks`; nothing applied; after the fault, the retried
    step and the rest give the healthy bits."""
    ok = got is not None and got.code == want_code and tuple(got.context["ranks"]) == want_ranks
    agree(world, ok, f"rank {world.Get_rank()}: want {want_code} {want_ranks}, got {got!r}")
    agree(world, np.array_equal(before[0], state(lr)[0]), "a refused step applied something")
    lr.audit.contribute = type(lr.audit).contribute.__get__(lr.audit)
    lr.fault_hook = None
    train(lr, 4)
    agree(world, digest(lr.final_params()) == digest(healthy.final_params()), "the retried run differs")


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", ["none", "grads"])
@pytest.mark.parametrize("word", [0, 1])
def test_a_flip_in_a_third_ranks_audit_words_names_that_rank_not_the_owner_and_auditor(world, mode, word):
    """The issue's first case: rank x, neither owner nor auditor of audited slot j, carries zeros
    for it; one of them changed (2.0, bit 62: never absorbed by the sum). Before, owner and
    auditor (both healthy) were named and x never; now x alone, on every rank."""
    healthy = learner(world, mode, SLOTS)
    train(healthy, 4)
    lr = learner(world, mode, SLOTS)
    train(lr, 2)
    _, o, a, _ = _first_round_roles(lr, 2)
    third = next(r for r in range(world.Get_size()) if r not in (o, a))
    _flip_carried(lr, third, word, 62, at=2)
    before = state(lr)
    got = _refused_step(lr)
    agree(world, got is None or "carried other words" in str(got), str(got))
    _check_refused(world, lr, healthy, got, "sdc-detected", (third,), before)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("role", ["owner", "auditor"])
@pytest.mark.parametrize("bit", [0, 40])
def test_a_flip_in_the_owners_or_auditors_own_words_names_it_alone(world, role, bit):
    """The owner's (or auditor's) digest halves changed after its digest: the healthy partner was
    named beside it; now only the rank whose words are not its digests, at p = 2 too (its own
    buffer shows it: no referee needed). CarriedFlip, the learners' hook, does the same."""
    healthy = learner(world, "none", SLOTS)
    train(healthy, 4)
    for how in ("wrap", "hook"):
        lr = learner(world, "none", SLOTS)
        train(lr, 2)
        _, o, a, _ = _first_round_roles(lr, 2)
        bad = o if role == "owner" else a
        if how == "wrap":
            _flip_carried(lr, bad, 1, bit, at=2)
        else:
            lr.fault_hook = CarriedFlip(rank=bad, step=2, element=1, bit=bit)
        before = state(lr)
        got = _refused_step(lr)
        _check_refused(world, lr, healthy, got, "sdc-detected", (bad,), before)


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("element,bit", [(3, 2), (0, 51)])
def test_two_ranks_wrong_alike_get_no_healthy_rank_named(world, element, bit):
    """The issue's two-fault case: the owner of audited slot j and its first referee compute the
    same wrong bits (the same flip, at one step). Before, the healthy auditor alone was named;
    now no rank outside the two is named (two referees at p >= 4: the auditor and the second
    referee hold the other half of the opinions, so the slot is undetermined)."""
    healthy = learner(world, "none", SLOTS)
    train(healthy, 4)
    lr = learner(world, "none", SLOTS)
    train(lr, 2)
    _, o, a, refs = _first_round_roles(lr, 2)
    flips = [BitFlip(rank=r, step=2, element=element, bit=bit) for r in (o, refs[0])]
    lr.fault_hook = lambda *args: [f(*args) for f in flips]  # two faults (as Faults(*flips))
    before = state(lr)
    got = _refused_step(lr)
    refused = got is not None and got.code in ("sdc-detected", "sdc-undetermined")
    agree(world, refused, f"two faults: {got!r}")
    named = set(got.context["ranks"]) if refused else set()
    agree(world, named <= {o, refs[0]}, f"named {sorted(named)}, the faulty ranks are {o}, {refs[0]}: {got}")
    agree(world, a not in named, f"the healthy auditor {a} is named: {got}")
    agree(world, np.array_equal(before[0], state(lr)[0]), "a refused step applied something")
    lr.fault_hook = Faults()  # no fault left: the retried run has the healthy bits
    train(lr, 4)
    agree(world, digest(lr.final_params()) == digest(healthy.final_params()), "the retried run differs")


@pytest.mark.mpi(min_size=2)
def test_at_two_ranks_a_payload_flip_is_undetermined_and_names_no_host(world):
    """p = 2 (the first two ranks of the job): no referee. The two digests differ and nothing
    says which is right: both ranks raise sdc-undetermined naming no rank and no host; nothing
    was applied; the retry works. (Before, both were named, one of them healthy.)"""
    pair = world.Split(0 if world.Get_rank() < 2 else 1, world.Get_rank())
    ok, what = True, ""
    if world.Get_rank() < 2:
        healthy = learner(pair, "none", SLOTS)
        train(healthy, 4)
        lr = learner(pair, "none", SLOTS, BitFlip(rank=1, step=2, element=5, bit=3))
        train(lr, 2)
        before = state(lr)
        got = _refused_step(lr)
        ok = got is not None and got.code == "sdc-undetermined" and got.context["ranks"] == ()
        ok = ok and got.context["hosts"] == () and "no referee" in str(got)
        ok = ok and np.array_equal(before[0], state(lr)[0])
        lr.fault_hook = None
        train(lr, 4)
        ok = ok and digest(lr.final_params()) == digest(healthy.final_params())
        what = repr(got)
    pair.Free()
    agree(world, ok, what)


@pytest.mark.mpi(min_size=2)
def test_a_payload_changed_after_its_digest_is_applied_unseen(world):
    """The boundary docs/audit.md states: the audit compares the payloads as digested. A word of
    an owned audited payload changed after the owner's digest (before the combine read it) is
    not seen: no refusal, and the run ends at other bits than the healthy one. A change before
    the digest (a BitFlip of the slot as computed) is refused in its step."""
    healthy = learner(world, "none", SLOTS)
    train(healthy, 4)
    lr = learner(world, "none", SLOTS)
    train(lr, 2)
    s, o, _, _ = _first_round_roles(lr, 2)
    orig = lr.audit.contribute

    def contribute(t, payloads, compute, scratch, out, **kw):
        orig(t, payloads, compute, scratch, out, **kw)
        if t == 2 and s in payloads:
            payloads[s].view(np.uint64)[3] ^= np.uint64(1) << np.uint64(30)

    lr.audit.contribute = contribute
    refusals = train(lr, 4, retry=False)
    agree(world, refusals == [], f"{refusals}")
    agree(world, digest(lr.final_params()) != digest(healthy.final_params()), "the change had no effect")
    before = learner(world, "none", SLOTS, BitFlip(rank=o, step=2, element=3, bit=30, slot=s))
    refusals = train(before, 4, retry=False)
    agree(world, [t for t, _ in refusals] == [2], f"{refusals}")
