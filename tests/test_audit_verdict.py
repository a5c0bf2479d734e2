"""Whom the audit names (issue 45 item 5), without MPI: p simulated ranks of one audited step
(tests/audit_sim.py) and the pure verdict (learning/audit_verdict.py). The audit never names a
rank that computed right: the words a rank carried changed are that rank's own verdict, words
changed on the way name no rank, two faults name only ranks more than half of the opinions show
wrong (else none), and the exit-98 report offers no healthy node for exclusion."""

import itertools

import numpy as np
import pytest
from audit_sim import audited_step

from alpha_mpi.learning.audit import AuditSchedule, sdc_report
from alpha_mpi.learning.audit_verdict import judge
from alpha_mpi.refusals import Refusal

rng = np.random.default_rng(45)


def _owners(p, slots):
    return [s * p // slots for s in range(slots)]


def _codes(got):
    return {e.code if e is not None else None for e in got}


def _named(got):
    names = {e.context["ranks"] for e in got if e is not None}
    assert len(names) <= 1, names  # every rank decides alike
    return names.pop() if names else None


@pytest.mark.parametrize("p", [3, 4, 5])
@pytest.mark.parametrize("bit", [0, 52, 62, 63])
def test_a_flip_in_the_words_a_third_rank_carries_names_that_rank_only(p, bit):
    """The issue's first case: a rank that neither owns nor audits slot j carries zeros for it;
    one of them flipped made owner and auditor (both healthy) the named ones before. Now the
    rank whose words are not what its digests make is named, and only it. Bit 62 makes the zero
    2.0, never absorbed; a denormal or 2^-1022 is absorbed by the digest halves (< 2^32) when
    the tree adds it to one of them first, and -0.0 changes no sum: then nothing is refused
    (the audit's words feed only its verdict, so nothing else changed) or, when the tree met
    the pair's difference first, the same rank is named."""
    slots = p
    sch = AuditSchedule(slots, _owners(p, slots), p)
    for j, (s, (a, _)) in enumerate(sch.round(0).items()):
        o = sch.owner_of[s]
        third = next(r for r in range(p) if r not in (o, a))
        for word in (2 * j, 2 * j + 1):
            count, got, _ = audited_step(p, slots, slots, 0, carried=(third, word, bit))
            if bit == 62:
                assert count == 1 and _codes(got) == {"sdc-detected"}, got
            assert _named(got) in (None, (third,)), (s, o, a, third, got[0])
            if got[0] is not None:
                assert f"rank {third} carried other words than its digests make" in str(got[0])


@pytest.mark.parametrize("p", [2, 3, 5])
@pytest.mark.parametrize("bit", [0, 31, 62])
def test_a_flip_in_the_owners_or_auditors_carried_words_names_that_rank_not_the_other(p, bit):
    """The owner's (or the auditor's) digest words changed after the digest: the healthy partner
    was named beside it before; now only the rank that carried them, at p = 2 too (its own
    buffer shows it, no referee needed)."""
    slots = 2 * p
    sch = AuditSchedule(slots, _owners(p, slots), p)
    for j, (s, (a, _)) in enumerate(sch.round(0).items()):
        for carrier in (sch.owner_of[s], a):
            count, got, _ = audited_step(p, slots, slots, 0, carried=(carrier, 2 * j + bit % 2, bit))
            assert count == 1 and _codes(got) == {"sdc-detected"}, got
            assert _named(got) == (carrier,), (s, carrier, got[0])


def test_a_flip_in_the_zeros_of_another_payload_names_its_rank():
    """A rank with two slots carries the audit's words in its first payload and zeros in the
    second: a flip there is read back too (the words are summed over every payload)."""
    p, slots = 3, 6
    count, got, _ = audited_step(p, slots, slots, 0, carried=(1, 2 * slots + 3, 62))
    assert count == 1 and _codes(got) == {"sdc-detected"} and _named(got) == (1,), got


@pytest.mark.parametrize("p", [2, 3, 5])
@pytest.mark.parametrize("element,bit", [(0, 0), (1, 40), (3, 62)])
def test_words_changed_on_the_way_name_no_rank(p, element, bit):
    """Every rank carried the words its digests make and owner and auditor report the same
    digest: the words changed inside the combine, which no rank's report shows. No rank, no
    host; the refusal says the step may be retried."""
    count, got, _ = audited_step(p, p, p, 0, on_the_way=(element, bit))
    assert count == 1 and _codes(got) == {"sdc-undetermined"}, got
    assert _named(got) == () and all(e.context["hosts"] == () for e in got)
    assert "changed on the way" in str(got[0]) and "may be retried" in str(got[0])


@pytest.mark.parametrize("p", [4, 5])
@pytest.mark.parametrize("k,slots", [(None, 8), (1, 8)])
def test_two_ranks_wrong_alike_never_get_a_healthy_rank_named(p, k, slots):
    """The issue's two-fault case: two ranks compute the same wrong bits (the same flip), the
    owner and a referee say. With two referees (p >= 4) a healthy rank is never outvoted: for
    every pair of faulty ranks and every step of a window, no rank outside the pair is named."""
    k = k or slots
    sch = AuditSchedule(k, _owners(p, slots), p)
    for bad in itertools.combinations(range(p), 2):
        for step in range(sch.met_within()):
            count, got, _ = audited_step(p, k, slots, step, faults={r: (2, 7) for r in bad})
            named = _named(got)
            assert named is None or set(named) <= set(bad), (bad, step, got[0])


@pytest.mark.parametrize("p", [3, 4, 5])
def test_two_ranks_wrong_differently_never_get_a_healthy_rank_named(p):
    """Two faults with other bits each (no value held by two faulty ranks): a healthy rank is
    never named, at p = 3 too (three different digests: undetermined)."""
    slots = p
    for bad in itertools.combinations(range(p), 2):
        faults = {bad[0]: (1, 3), bad[1]: (4, 9)}
        count, got, _ = audited_step(p, slots, slots, 0, faults=faults)
        named = _named(got)
        assert count == 1 and named is not None and set(named) <= set(bad), (bad, got[0])


def test_one_faulty_rank_is_always_named_alone():
    """One fault: every rank count >= 3, every faulty rank and position: that rank, alone."""
    for p in (3, 4, 5):
        for bad in range(p):
            count, got, _ = audited_step(p, p, p, 0, fault=(bad, 2, 11))
            assert _codes(got) == {"sdc-detected"} and _named(got) == (bad,), (p, bad, got[0])


def _case(p, truth, wrong, carriers=()):
    """digests (p x 2) where every rank of `wrong` has its own digest (a dict rank -> digest) and
    the others hold `truth`; carried words as the digests make them, except `carriers`'."""
    digests = np.zeros((p, 2))
    for r in range(p):
        digests[r] = wrong.get(r, truth)
    return digests


def test_judge_names_only_ranks_more_than_half_of_the_opinions_show_wrong():
    """The pure verdict, over random roles and faults of at most two ranks: with two referees a
    named rank always holds a wrong digest or carried changed words; with one referee, so do
    one fault and two faults that differ; an undetermined slot says why."""
    for _ in range(3000):
        p = int(rng.integers(2, 7))
        o, a, *rest = (int(x) for x in rng.permutation(p))
        refs = tuple(rest[: int(rng.integers(0, min(2, len(rest)) + 1))])
        truth = (float(rng.integers(0, 2**32)), float(rng.integers(0, 2**32)))
        holders = [o, a, *refs]
        nbad = int(rng.integers(1, 3))
        bad = [int(x) for x in rng.choice(holders, size=nbad, replace=False)]
        alike = bool(rng.integers(0, 2))
        wrong = {}
        for i, r in enumerate(bad):
            wrong[r] = (truth[0] + 1 + (0 if alike else i), truth[1])
        digests = np.zeros((p, 2))
        for r in holders:
            digests[r] = wrong.get(r, truth)
        carried = np.zeros((p, 2))
        carried[o] += digests[o]
        carried[a] -= digests[a]
        carrier = None
        if rng.integers(0, 4) == 0:  # a changed carried word on some rank
            carrier = int(rng.integers(0, p))
            carried[carrier, int(rng.integers(0, 2))] += 0.5
        if np.array_equal(digests[o], digests[a]) and carrier is None:
            continue  # the combine would give 0: no verdict asked
        v = judge(7, o, a, refs, digests, carried)
        shown = set(bad) | ({carrier} if carrier is not None else set())
        if len(refs) == 2 or nbad == 1 or not alike:
            assert set(v.named) <= shown, (p, o, a, refs, bad, alike, carrier, v)
        if nbad == 1 and refs and carrier is None:
            assert v.named == tuple(bad), (o, a, refs, bad, v)
        if not v.named:
            assert "no referee" in v.note or "more than half" in v.note or "on the way" in v.note, v.note


def test_judge_at_two_ranks_and_with_referees_of_another_identity_names_none():
    digests = np.array([[1.0, 2.0], [1.0, 3.0]])
    carried = np.array([[1.0, 2.0], [-1.0, -3.0]])
    v = judge(0, 0, 1, (), digests, carried)
    assert v.named == () and "with 2 ranks there is no referee to say which is wrong" in v.note
    v = judge(0, 0, 1, (), digests, carried, why_none="referee 2 computes under another compute identity")
    assert v.named == () and "another compute identity" in v.note


def test_the_report_of_an_undetermined_step_offers_no_node_for_exclusion():
    """The exit-98 report lists for exclusion only ranks shown wrong: after sdc-undetermined,
    none, so jobs/train.sbatch (which excludes what `--exclude=` names) excludes no node."""
    e = Refusal("sdc-undetermined", "step 3: ...", step=3, ranks=(), hosts=(), clean_step=3)
    for ck in ("ck", None):
        text = sdc_report(e, ck, 2)
        assert "[sdc-undetermined]" in text and "--exclude" not in text and "no node is named" in text
        assert "3 or more ranks" in text
    assert "saved in ck" in sdc_report(e, "ck", 2)
    named = sdc_report(Refusal("sdc-detected", "step 3: ...", step=3, ranks=(2,), hosts=("n7",)), "ck", 4)
    assert "--exclude=n7" in named
