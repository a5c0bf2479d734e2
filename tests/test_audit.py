"""The audit's pure parts (issue 24), without MPI: the digest sees every single flipped bit, the
rotation meets every slot within ceil(S/K) steps, the fault hook flips exactly what it says, and
the exit-98 report says how to resume without the node."""

import math

import numpy as np
import pytest
from audit_sim import audited_step

from alpha_mpi.checkpoint.locate import rewind_plan
from alpha_mpi.execution.frames import crc32c
from alpha_mpi.learning.audit import AuditSchedule, payload_digest, sdc_report
from alpha_mpi.learning.audit_recovery import KeptStates, clean_step
from alpha_mpi.learning.replicas import replicated_digest
from alpha_mpi.learning.verdicts import halves
from alpha_mpi.refusals import Refusal
from alpha_mpi_verify.faults import BitFlip


def test_every_single_bit_flip_changes_the_payload_digest():
    x = np.random.default_rng(1).standard_normal(67)
    d = payload_digest(x)
    seen = {d}
    for i in range(len(x)):
        for b in range(64):
            y = x.copy()
            y.view(np.uint64)[i] ^= np.uint64(1) << np.uint64(b)
            dy = payload_digest(y)
            assert dy != d, (i, b)
            seen.add(dy)
    assert len(seen) == 1 + 64 * len(x)  # and no two flips collide either


def test_replicated_digest_chains_arrays_in_order():
    a, b = np.arange(5.0), np.arange(7.0) / 3
    assert replicated_digest([a, b]) == replicated_digest([a, b.copy()])
    assert replicated_digest([a, b]) != replicated_digest([b, a])
    c = b.copy()
    c.view(np.uint64)[6] ^= np.uint64(1)
    assert replicated_digest([a, b]) != replicated_digest([a, c])


CASES = [
    (8, 2, 1),
    (8, 4, 1),
    (8, 5, 1),
    (8, 5, 3),
    (8, 3, 2),
    (8, 8, 8),
    (5, 2, 2),
    (16, 4, 1),
    (6, 6, 6),
    (7, 3, 7),
]


def blocks(slots, p):
    """Contiguous owner blocks, as the pairwise tree places slots (sizes differ by at most one)."""
    return [s * p // slots for s in range(slots)]


@pytest.mark.parametrize("slots,p,k", CASES)
def test_the_schedule_meets_every_slot_within_its_bound(slots, p, k):
    sch = AuditSchedule(k, blocks(slots, p), p)
    assert sch.every == max(1, math.ceil(p / k)) and sch.per_round == min(k * sch.every, slots)
    for start in range(2 * sch.met_within()):
        seen = set()
        for t in range(start, start + sch.met_within()):
            got = sch.audited(t)
            assert len(got) == len(set(got)) == (sch.per_round if t % sch.every == 0 else 0)
            seen.update(got)
        assert seen == set(range(slots)), (start, seen)
    # K slots per step on average (all S every m steps where K*m exceeds S)
    assert sch.per_round / sch.every >= min(k, slots / sch.every)


@pytest.mark.parametrize("slots,p,k", CASES)
def test_roles_are_other_ranks_and_the_work_is_spread(slots, p, k):
    owner = blocks(slots, p)
    own = [owner.count(r) for r in range(p)]
    sch = AuditSchedule(k, owner, p)
    for t in range(0, 3 * sch.met_within(), sch.every):
        extra = [0] * p
        for s, (a, refs) in sch.round(t).items():
            assert a != owner[s]
            # Two referees where there are ranks for them (four opinions against two faults).
            assert (
                len(refs) == min(2, p - 2) and not {owner[s], a} & set(refs) and len(set(refs)) == len(refs)
            )
            extra[a] += 1
        # The slowest rank of the round does at most ceil(A / p) recomputations more than the
        # busiest owner (the rotation by owner + 1 put all of one step's on one rank: K = 1 at
        # p = 4 cost a whole slot every step, where this costs one slot every fourth step).
        assert max(o + e for o, e in zip(own, extra)) <= max(own) + math.ceil(sch.per_round / p), (t, extra)


def test_the_schedule_is_the_same_on_every_rank_and_step_order():
    a, b = AuditSchedule(1, blocks(8, 4), 4), AuditSchedule(1, blocks(8, 4), 4)
    forward = [a.round(t) for t in range(16)]
    backward = [b.round(t) for t in reversed(range(16))][::-1]
    assert forward == backward


def test_bitflip_flips_exactly_its_bit_on_its_rank_step_and_slot():
    hook = BitFlip(rank=1, step=2, element=3, bit=51, slot=4)
    buf = np.ones(6)
    for rank, step, slot in [(0, 2, 4), (1, 1, 4), (1, 3, 4), (1, 2, 5)]:
        hook(rank, step, slot, buf)
    assert np.array_equal(buf, np.ones(6)) and hook.hits == []
    hook(1, 2, 4, buf)
    want = np.ones(6)
    want.view(np.uint64)[3] ^= np.uint64(1) << np.uint64(51)
    assert np.array_equal(buf.view(np.uint64), want.view(np.uint64)) and hook.hits == [(2, 4)]
    persistent = BitFlip(rank=0, step=2, element=0, bit=0, persistent=True)
    for t in range(5):
        persistent(0, t, 0, np.zeros(1))
    assert [t for t, _ in persistent.hits] == [2, 3, 4]


def test_sdc_report_says_how_to_resume_without_the_node():
    e = Refusal("sdc-detected", "step 3: ...", step=3, ranks=(2,), hosts=("node17",))
    text = sdc_report(e, "ck", 4)
    assert "[sdc-detected]" in text and "--exclude=node17" in text and "--checkpoint-dir ck --resume" in text
    assert "saved in ck" in text
    bare = sdc_report(e, None, 4)
    assert "node17" in bare and "--checkpoint-dir" in bare and "--exclude" not in bare
    rd = sdc_report(Refusal("replica-diverged", "after step 4: ...", step=4, ranks=(1,)), "ck", 3)
    assert "[replica-diverged]" in rd and "--resume-from" in rd


@pytest.mark.parametrize("slots,p,k", CASES)
def test_a_persistent_fault_is_met_within_the_window_so_clean_step_bounds_its_start(slots, p, k):
    """For every slot a fault that persists on one rank may touch (its own slots, or the ones
    it recomputes) and every step f it begins, the first step d at which that slot is audited
    satisfies clean_step(d, W) <= f: no state at or before clean_step(d) holds its work
    (issue 36 item 2)."""
    sch = AuditSchedule(k, blocks(slots, p), p)
    w = sch.met_within()
    assert clean_step(5, w) == max(0, 5 - w + 1) and clean_step(7, 1) == 7  # W = 1: the step itself
    for touched in range(slots):
        for f in range(3 * w):
            d = next(t for t in range(f, f + w) if touched in sch.audited(t))
            assert clean_step(d, w) <= f, (touched, f, d)


class FakeLearner:
    def __init__(self):
        self.step, self.taken = 0, []

    def checkpoint_snapshot(self):
        self.taken.append(self.step)
        return {"step": self.step}


@pytest.mark.parametrize("start", [0, 5])
def test_kept_states_hold_a_clean_state_for_any_detection_and_at_most_two_copies(start):
    w = 6
    kept, lr = KeptStates(w), FakeLearner()
    for lr.step in range(start, start + 40):
        kept.offer(lr)
        assert len(kept.states) <= 2, kept.states
        clean = clean_step(lr.step, w)
        got = kept.newest(clean)  # a detection at this step goes back to `got`
        if clean >= start:
            assert got is not None and got[0] <= clean and got[0] >= lr.step - 2 * kept.window + 2, got
            assert got[1] == {"step": got[0]}
        else:  # the resumed-from state is younger than what is known clean: nothing in memory
            assert got is None
    assert lr.taken[0] == start and all(t % 6 == 0 for t in lr.taken[1:])
    every = KeptStates(1)  # W = 1: the state at a detection is clean; nothing is copied
    every.offer(lr)
    assert every.states == [] and every.newest(3) is None


@pytest.mark.parametrize(
    "published,clean,held,want",
    [
        ([2, 4, 6, 8], 3, 0, (2, False, (4, 6, 8))),  # a published step beats an older copy
        ([], 9, 6, (6, True, ())),  # only the copy in memory: the caller saves it
        ([2, 4], 9, 6, (6, True, ())),
        ([4, 8, 12], 9, 6, (8, False, (12,))),
        ([4, 8], 3, None, (None, False, (4, 8))),  # nothing known clean: everything set aside
        ([3], 3, 3, (3, False, ())),  # K = S and the step already published
        ([], 3, 3, (3, True, ())),
        ([5], 3, 5, (None, False, (5,))),  # a held state younger than the clean step is not used
    ],
)
def test_rewind_plan_goes_back_to_the_newest_state_at_or_before_the_clean_step(published, clean, held, want):
    assert rewind_plan(published, clean, held) == want


def test_sdc_report_with_fewer_audited_slots_names_the_clean_step_and_what_was_set_aside():
    base = {"step": 8, "ranks": (2,), "hosts": ("node17",), "clean_step": 3}
    e = Refusal("sdc-detected", "step 8: ...", **base, saved_step=2, set_aside=(4, 6, 8), folder="ck/sdc-8")
    text = sdc_report(e, "ck", 3)
    assert "last state known clean is at step 3" in text and "step 2, is saved in ck" in text
    assert "(4, 6, 8) may hold the fault's work and are set aside in ck/sdc-8" in text
    assert "--checkpoint-dir ck --resume" in text and "every slot of every step audited" not in text
    none = Refusal("sdc-detected", "step 8: ...", **base, saved_step=None, set_aside=(4,), folder="ck/sdc-8")
    assert "no state at or before it was kept: a resume in ck starts at step 0" in sdc_report(none, "ck", 3)
    full = Refusal("sdc-detected", "step 3: ...", step=3, clean_step=3, saved_step=3, hosts=("n",))
    assert "the state at step 3 (every slot of every step audited" in sdc_report(full, "ck", 3)


def test_both_halves_of_the_digest_see_every_single_flipped_bit():
    """Each 32-bit half is a CRC32C (straight, and read from the middle): each alone detects a
    flipped bit, so a flip never leaves either half unchanged; one array's replicated digest
    is its payload digest."""
    x = np.random.default_rng(5).standard_normal(9)
    d = payload_digest(x)
    assert replicated_digest([x]) == d
    for i in range(len(x)):
        for b in range(64):
            y = x.copy()
            y.view(np.uint64)[i] ^= np.uint64(1) << np.uint64(b)
            e = payload_digest(y)
            assert (e & 0xFFFFFFFF) != (d & 0xFFFFFFFF) and (e >> 32) != (d >> 32), (i, b)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 8, 9, 104, 4099])
def test_the_one_pass_digest_is_the_two_pass_digest(n):
    """payload_digest reads the buffer once and derives both CRCs by the register's shift over
    zero bytes; the values are those of reading it straight and from its middle (as
    replicated_digest, which reads twice, does), at even, odd and empty lengths."""
    x = np.random.default_rng(n).standard_normal(n)
    assert payload_digest(x) == replicated_digest([x])
    m = memoryview(x).cast("B")
    h = (m.nbytes // 16) * 8
    assert payload_digest(x) == crc32c(m) | (crc32c(m[:h], crc32c(m[h:])) << 32)


# -- the audit's words in the combine: owner +digest, auditor -digest, summed by the tree --------


def test_digest_halves_sum_to_zero_exactly_iff_equal_in_any_order():
    """A digest's halves are integers below 2^32: the owner's added, the auditor's subtracted
    and any number of zeros sum exactly in binary64 in every order and association, so the
    combined word is 0 exactly when the two halves agree (a difference of one in the top bit or
    the bottom bit included)."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        d = int(rng.integers(0, 2**63)) | (int(rng.integers(0, 2)) << 63)
        for other in (d, d ^ 1, d ^ (1 << 31), d ^ (1 << 32), d ^ (1 << 63)):
            for w in range(2):
                terms = [halves(d)[w], -halves(other)[w]] + [0.0] * int(rng.integers(0, 6))
                rng.shuffle(terms)
                while len(terms) > 1:  # a random association of the shuffled terms
                    i = int(rng.integers(0, len(terms) - 1))
                    terms[i : i + 2] = [terms[i] + terms[i + 1]]
                assert terms[0] == halves(d)[w] - halves(other)[w]
                assert (terms[0] == 0.0) == (halves(d)[w] == halves(other)[w])


@pytest.mark.parametrize("p,k,slots", [(2, 1, 8), (3, 1, 6), (4, 2, 8), (5, 5, 5)])
def test_a_healthy_audited_step_runs_no_round_of_its_own(p, k, slots):
    for step in range(2 * p):
        count, got, audit = audited_step(p, k, slots, step)
        assert count == 0 and got == [None] * p, (step, got)
        assert audit.checked == len(audit.schedule.audited(step))


@pytest.mark.parametrize("p,k,slots", [(2, 1, 8), (3, 1, 6), (4, 2, 8), (5, 5, 5)])
@pytest.mark.parametrize("element,bit", [(0, 0), (3, 63), (6, 31)])
def test_a_flipped_bit_makes_the_combined_words_nonzero_and_every_rank_names_the_rank(
    p, k, slots, element, bit
):
    """One rank's computations carry a flipped bit (its own slots and those it recomputes): at
    a round where it owns or audits a slot, every rank runs the referees' round once and raises
    `sdc-detected` naming that rank (p >= 3), or `sdc-undetermined` naming none (p = 2: no
    referee to say which of the two is wrong); a flip in the stop word is not digested, so
    nothing is refused."""
    bad = p - 1
    count, got, audit = audited_step(p, k, slots, 0, fault=(bad, element, bit))
    roles = audit.schedule.round(0)
    touched = any(audit.owner_of[s] == bad or a == bad for s, (a, _) in roles.items())
    if not touched:
        assert count == 0 and got == [None] * p
        return
    code = "sdc-detected" if p >= 3 else "sdc-undetermined"
    assert count == 1 and all(e is not None and e.code == code for e in got), got
    want = (bad,) if p >= 3 else ()
    assert all(e.context["ranks"] == want for e in got), [e.context["ranks"] for e in got]
    if p == 2:
        assert all("with 2 ranks there is no referee" in str(e) and not e.context["hosts"] for e in got)
    count, got, _ = audited_step(p, k, slots, 0, fault=(bad, 7, bit))  # the stop word (n + 2)
    assert count == 0 and got == [None] * p
