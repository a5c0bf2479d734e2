"""Whom the audit names after a mismatch, from the referees' round (layer 5, pure).

The combine carried, for each audited slot, the owner's digest minus the auditor's; a pair that
is not 0 is judged here from what every rank reported again in the referees' round: its digest
of the slot (owner, auditor, and each referee's recomputation) and the words it carried for the
slot in the combine (read back from its payload buffers). The rule is that the audit never names
a rank that computed right:

    carried words   a rank is shown wrong when the words it carried are not what its own digests
                    make (the owner's digest, the auditor's negated, zeros elsewhere): the words
                    changed on that rank after the digest, before the combine read them
    same digest     owner and auditor report the same digest, and every rank carried the words
                    its digests make: the words changed on the way (inside the combine), which
                    no rank's report shows, so no rank is named and the step may be retried
    vote            owner and auditor disagree: each referee's recomputation is an opinion
                    beside theirs, and a rank is named only when MORE THAN HALF of the opinions
                    agree on another digest. At p >= 4 there are two referees, four opinions,
                    three needed: two ranks wrong alike (two faults) cannot outvote a healthy
                    one, and make the slot undetermined. At p = 3 there is one referee: two of
                    three decide, which two ranks wrong alike would mislead (no vote of three
                    can tell them from one wrong rank; said in docs/audit.md)
    no referee      p = 2, or no referee computes like the pair (compute identities): no
                    opinion beside the two, so no rank is named

A slot with no rank shown wrong is undetermined: the audit raises `sdc-undetermined` (nothing
applied, no host named, nothing for a job script to exclude) unless another slot of the step
named a rank.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

__all__ = ["SlotVerdict", "judge"]


@dataclass(frozen=True)
class SlotVerdict:
    """One differing slot's verdict: the ranks shown wrong (empty: undetermined) and why."""

    slot: int
    named: tuple[int, ...]
    note: str


def _ranks(xs) -> str:
    xs = list(xs)
    return ("rank " if len(xs) == 1 else "ranks ") + ", ".join(map(str, xs))


def judge(
    slot: int,
    owner: int,
    auditor: int,
    referees: tuple[int, ...],
    digests: np.ndarray,
    carried: np.ndarray,
    *,
    why_none: str = "with 2 ranks there is no referee",
) -> SlotVerdict:
    """The verdict on one differing slot (module docstring). `digests[r]` and `carried[r]`: rank
    r's two digest words for the slot (its digest as owner or auditor, its recomputation as a
    referee, zeros elsewhere) and the two words it carried in the combine; `referees`: those
    whose recomputation counts (computing like the pair); `why_none`: why there is none."""
    o, a = owner, auditor
    expected = np.zeros_like(carried)
    expected[o] += digests[o]
    expected[a] -= digests[a]
    # By value: a zero word whose sign flipped changes no sum (and -0.0 is an auditor's zero half).
    changed = tuple(r for r in range(len(carried)) if not np.array_equal(carried[r], expected[r]))
    carriers = (
        f"{_ranks(changed)} carried other words than {'its' if len(changed) == 1 else 'their'} digests make "
        "(changed after the digest, before the combine read them)"
    )
    head = f"slot {slot}: owner rank {o} and auditor rank {a}"
    if np.array_equal(digests[o], digests[a]):
        if changed:
            return SlotVerdict(slot, changed, f"{head} report the same digest; {carriers}")
        return SlotVerdict(
            slot,
            (),
            f"{head} report the same digest and every rank carried the words its digests make: the "
            "audit's words changed on the way, inside the combine, where no rank's report shows which",
        )
    if not referees:
        note = f"{head} disagree; {why_none} to say which is wrong"
        return SlotVerdict(slot, changed, note + (f"; {carriers}" if changed else ""))
    opinions = {r: digests[r].tobytes() for r in (o, a, *referees)}
    value, votes = Counter(opinions.values()).most_common(1)[0]
    if 2 * votes <= len(opinions):
        note = (
            f"{head} disagree and no digest is held by more than half of them and referee "
            f"{_ranks(referees)} (two faults at once?)"
        )
        return SlotVerdict(slot, changed, note + (f"; {carriers}" if changed else ""))
    wrong = tuple(r for r, d in opinions.items() if d != value)
    right = [r for r, d in opinions.items() if d == value]
    note = f"slot {slot}: {_role(wrong, o, a)} differs from {_role(right, o, a)} ({votes} of {len(opinions)})"
    named = wrong + tuple(r for r in changed if r not in wrong)
    return SlotVerdict(slot, named, note + (f"; {carriers}" if changed else ""))


def _role(ranks, o: int, a: int) -> str:
    """`owner rank 2`, `auditor rank 0 and referee ranks 1, 3`: who holds each rank's opinion."""
    parts = [f"owner rank {o}"] if o in ranks else []
    parts += [f"auditor rank {a}"] if a in ranks else []
    refs = [r for r in ranks if r not in (o, a)]
    parts += [f"referee {_ranks(refs)}"] if refs else []
    return " and ".join(parts)
