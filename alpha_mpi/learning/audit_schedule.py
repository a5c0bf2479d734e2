"""Which slots an audit recomputes at which step, and on which ranks (layer 5, pure).

`AuditSchedule` is a pure function of (step, K, the owners, p): every rank builds the same one
and reads the same rounds from it, so the roles need no exchange (learning/audit.py says what
is done with them):

    rounds          every m = ceil(p / K) steps (every step when K >= p), at steps t with t mod m = 0,
                    A = min(K*m, S) slots are audited together. Why batch: one recomputation per
                    step lands on one rank and every other rank waits for it at the combine (K = 1
                    of 8 slots cost +20 % of the step at p = 2, +44 % at p = 4); A slots at once
                    give each rank about one, so the step costs about 1/S more on average
    slots           round i audits Q[(i*A + j) mod S], j < A, where Q interleaves the owners' slots
                    (the first slot of each owner, then the second, ...), so a round's slots are
                    spread over the owners and every slot is met within m * ceil(S / A) steps
    auditor(s)      the rank with the least work in the round (its own slots plus recomputations
                    given so far), not the owner; ties: a rank not yet in the round, then the
                    nearest after the owner
    referees(s)     the first two ranks after the owner that are neither owner nor auditor (one
                    at p = 3, none at p = 2): they recompute s only after a mismatch, to say
                    which of the two was wrong (learning/audit_verdict.py: a rank is named only
                    when more than half of the opinions agree on another digest; two referees
                    make four opinions, so two ranks wrong alike never outvote a healthy one)

Beside it, what a learner checks and sizes before its audit exists: the options (`check_options`,
`check_audit_slots`), the slots' owners (`slot_owners`) and the payload words the audit adds to
a step's combine (`audit_words`).
"""

from __future__ import annotations

import numpy as np

from ..refusals import Refusal

__all__ = ["AuditSchedule", "audit_words", "check_audit_slots", "check_options", "slot_owners"]


class AuditSchedule:
    """Which slots are audited at which step, and by whom (the module docstring says why).

    Pure: every rank builds the same schedule from (k, owner_of, size) and reads the same rounds
    from it, so the roles need no exchange. `owner_of[s]` is the rank of slot s."""

    def __init__(self, k: int, owner_of: list[int], size: int) -> None:
        slots = len(owner_of)
        self.k, self.size, self.owner_of = k, size, list(owner_of)
        self.every = max(1, -(-size // k))  # m: steps per round
        self.per_round = min(k * self.every, slots)  # A: slots audited in a round
        own: dict[int, list[int]] = {}
        for s, r in enumerate(owner_of):
            own.setdefault(r, []).append(s)
        self.order = [  # Q: the owners' first slots, then their second slots, ...
            lst[i] for i in range(max(map(len, own.values()))) for lst in own.values() if i < len(lst)
        ]
        self.load = [len(own.get(r, ())) for r in range(size)]  # a rank's own slots per step
        self._cache: tuple[int, dict] = (-1, {})

    def round(self, step: int) -> dict[int, tuple[int, tuple[int, ...]]]:
        """{slot: (auditor, referees)} of the slots audited at `step`, in audit order ({} between
        rounds); `referees`: up to two ranks, neither owner nor auditor (none at p = 2)."""
        if step % self.every:
            return {}
        i = step // self.every
        if self._cache[0] == i:
            return self._cache[1]
        p, slots = self.size, len(self.order)
        load, busy, roles = list(self.load), set(), {}
        for j in range(self.per_round):
            s = self.order[(i * self.per_round + j) % slots]
            o = self.owner_of[s]
            busy.add(o)
            others = [(o + d) % p for d in range(1, p)]
            a = min(others, key=lambda r: (load[r], r in busy, others.index(r)))
            load[a] += 1
            busy.add(a)
            roles[s] = (a, tuple(r for r in others if r != a)[:2])
        self._cache = (i, roles)
        return roles

    def audited(self, step: int) -> list[int]:
        """The slots audited at `step` (empty between rounds)."""
        return list(self.round(step))

    def met_within(self) -> int:
        """Steps within which every slot is audited, from any step: m * ceil(S / A)."""
        return self.every * -(-len(self.order) // self.per_round)


def check_audit_slots(k: object, slots: int, size: int) -> None:
    """`usage` unless `k` (audit_slots) is an int in 1..slots and there are >= 2 ranks (local)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 < k <= slots:
        raise Refusal("usage", f"audit_slots must be an int in 1..{slots} (the slot count), got {k!r}")
    if size < 2:
        raise Refusal(
            "options-conflict",
            "audit_slots needs at least 2 ranks: a slot is recomputed by another rank "
            f"than its owner, and this communicator has {size}",
        )


def check_options(options: tuple[int, int, str], slots: int, size: int) -> None:
    """Refuse bad (audit_slots, audit_digests, partition) by name, locally, before anything is
    built: a learner runs it among its constructor's local checks, whose outcome travels in its
    first agreement round (so a rank that refuses them is named on every rank at once)."""
    audit_slots, audit_digests, partition = options
    if audit_slots:
        check_audit_slots(audit_slots, slots, size)
    if audit_digests:
        from .replicas import check_audit_digests

        check_audit_digests(audit_digests, partition)


def slot_owners(plan, size: int) -> list[int]:
    """`owner_of`: the rank of each slot of a combine `plan` over `size` ranks."""
    owner_of = {s: r for r in range(size) for s in plan.slots_of(r)}
    return [owner_of[s] for s in range(len(owner_of))]


def audit_words(k: int, owner_of: list[int], size: int) -> int:
    """The words a step's combine carries for the audit (2 per slot of a round; 0 without it):
    what a learner sizes its payload by before its SlotAudit exists (pure)."""
    return 2 * AuditSchedule(k, owner_of, size).per_round if k else 0
