"""Audited slots: catch silent data corruption by recomputing slots on another rank (layer 5).

A slot's payload (Σ gradients, Σ samples, Σ loss) is a pure function of (params, data, slot
seed), so it has the same bits on whichever rank computes it. K slots per step, on average, are
computed a second time by another rank, and the digests of the two payloads are compared in the
step's combine, BEFORE the optimizer applies anything, so a mismatch applies nothing. Which
slots, which rank recomputes each and at which steps: `AuditSchedule` (learning/audit_schedule.py,
pure); what `alpha-mpi train` prints after a detection: `sdc_report` (learning/audit_report.py).

Exchange: the step's own combine, no round of the audit's own. A slot payload has 2A more words
after its stop word (`audit_words`): at word pair j each rank's first payload carries the digest
of audited slot j as it computed it, its two 32-bit halves (each an exact float64) added where
the rank owns slot j and subtracted where it audits it, zeros elsewhere (`SlotAudit.contribute`).
The halves are integers below 2^32 and each word has at most two non-zero terms, so the combine's
tree sums them exactly in any order and association: the combined pair j is 0 exactly when the
owner's and the auditor's digests agree. Every rank reads the same combined words (in `grads` and
`params`, where a rank receives only its chunk of the payload, they come with the mass, loss and
stop words, learning/partition.py) and decides alike, after the combine and before the
optimizer applies anything (`SlotAudit.settle`). After a mismatch, and only then, one verdict
round (p rows of 4A + 16 words, learning/verdicts.py WordTable) carries each rank's digests again
(the combine carried only differences), the referees', the words each rank carried and its host
name, and every rank raises `sdc-detected` naming the rank(s) shown wrong and their host(s), or
`sdc-undetermined` naming none (learning/audit_verdict.py: the audit never names a rank that
computed right). Nothing else is changed: the words
are payload words of their own, each coordinate is combined by the same tree, so a healthy run
has the bits of a run without auditing; the learners' contracts name the payload without them.
The combine's finiteness check comes first: a fault that makes a payload non-finite is refused
as `non-finite-*` / `peer-refused` (nothing applied) and names no rank.

Compute identities before bits: a slot has the same bits on every rank only where the ranks
compute alike. Ranks of different compute identities train together only under a contract that
says machine-independent (learning/compute_check.py); when an owner and its auditor of different
identities disagree, that declaration does not hold, which is an environment difference, not a
fault: every rank raises `compute-mismatch` naming the identities' fields and blames no rank or
host. A referee whose identity differs from the owner's and the auditor's breaks no tie (its
bits would differ anyway): with no referee left, no rank is named, as with 2 ranks.

After a detection the steps before may hold a fault's unaudited work unless every slot is
audited every step: `clean_step` (learning/audit_recovery.py) says which state is known clean.

Digest: `payload_digest`, two CRC32Cs (the kernel's, over the buffer without a copy: straight and
read from its middle, both from one pass) of the payload's words before the stop word (which
only the owner sets; the audit's words and, in torch, the agreement words follow it). CRC32C
always detects one flipped bit or a burst of up to 32; it runs at memory speed here, which
matters because every audited slot is digested twice per round.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..execution.frames import crc32c
from ..refusals import Refusal
from .audit_recovery import clean_step
from .audit_report import sdc_report
from .audit_schedule import AuditSchedule, audit_words, check_audit_slots, check_options, slot_owners
from .audit_verdict import judge
from .verdicts import WordTable, halves

if TYPE_CHECKING:
    from mpi4py import MPI

    from .compute_check import ComputeCheck

__all__ = [
    "SlotAudit",
    "audit_words",
    "slot_owners",
    "check_audit_slots",
    "check_options",
    "FaultHook",
    "payload_digest",
    "AuditSchedule",
    "sdc_report",
    "build_checks",
    "needed_slots",
]


class FaultHook(Protocol):
    """What a learner's `fault_hook=` is (alpha_mpi_verify.faults implements it): called after
    each slot payload a rank computes, before anything reads it; it may change `payload` in place."""

    def __call__(self, rank: int, step: int, slot: int, payload: np.ndarray) -> None:
        """Inject this rank's fault (if any) into slot `slot`'s payload at `step`."""
        ...


_HOST_WORDS = 16  # 64 bytes of host name, 4 bytes per word


def payload_digest(words: np.ndarray) -> int:
    """A 64-bit digest of a float64 array's bits: in the low half the CRC32C of the buffer, in
    the high half the CRC32C of the buffer read from its middle (second half, then first). CRC32C
    always detects a single flipped bit and any burst of up to 32 bits, which is the fault a
    mercurial core makes; the rotated read makes another error polynomial, so other changes
    escape both halves together only by chance. The kernel's CRC32C (the CPU's instruction on
    x86-64 and AArch64, a table elsewhere, the same value) is ~10x faster than zlib's CRC-32 and
    Adler-32 together, which matters because the audit's digests are most of its cost beyond the
    recomputation.

    One pass over the buffer, not two: the kernel reads each half once (A, then B, each from a
    zero register), and both digests follow from the two values because a CRC is linear in its
    register: crc(A || B) = crc(B) ^ shift_|B|(crc(A)) and crc(B || A) = crc(A) ^ shift_|A|(crc(B)),
    where shift_L is the register's advance over L zero bytes (`_shift`, tables made once per length).
    The values are those of reading the buffer twice (tests/test_audit.py holds them equal)."""
    m = memoryview(np.ascontiguousarray(words)).cast("B")
    h = (m.nbytes // 16) * 8  # the middle, on a word boundary
    ca, cb = crc32c(m[:h]), crc32c(m[h:])
    straight = cb ^ _shift(m.nbytes - h)(ca)
    rotated = ca ^ _shift(h)(cb)
    return straight | (rotated << 32)


@functools.lru_cache(maxsize=64)  # a learner digests one payload length over and over
def _shift(length: int) -> Callable[[int], int]:
    """The CRC32C register's advance over `length` zero bytes: a linear map on 32 bits, applied
    by four byte tables. Built from the kernel itself: crc(c, d) ^ crc(0, d) is the advance of c
    over len(d) bytes, so the 32 basis images cost 33 kernel passes over zeros, once per length."""
    zeros = bytes(length)
    base = crc32c(zeros)
    image = [crc32c(zeros, 1 << i) ^ base for i in range(32)]
    t0, t1, t2, t3 = tables = [[0] * 256 for _ in range(4)]
    for k, t in enumerate(tables):
        for b in range(1, 256):
            low = b & -b
            t[b] = t[b ^ low] ^ image[8 * k + low.bit_length() - 1]
    return lambda c: t0[c & 0xFF] ^ t1[(c >> 8) & 0xFF] ^ t2[(c >> 16) & 0xFF] ^ t3[c >> 24]


def _host_words(name: str) -> np.ndarray:
    raw = name.encode("utf-8", "replace")[: 4 * _HOST_WORDS].ljust(4 * _HOST_WORDS, b"\0")
    return np.frombuffer(raw, dtype="<u4").astype(np.float64)


def _host_name(words: np.ndarray) -> str:
    return words.astype("<u4").tobytes().rstrip(b"\0").decode("utf-8", "replace")


class SlotAudit:
    """The audit of one learner: rotation, roles, the digests and the verdict.

    Build it on every rank (making it is local; its referees' table is a verdict round, run only
    after a mismatch). `owner_of[s]` is the rank of slot s. A step uses it in two halves around
    its combine (the module docstring's Exchange): `contribute` before (this rank's digests, and
    the signed words its payload carries), `settle` after, on the combined words, before
    anything is applied.
    """

    def __init__(
        self,
        comm: MPI.Comm,
        k: int,
        owner_of: list[int],
        *,
        timeout: float | None,
        contract: str,
        compute: ComputeCheck | None = None,
    ) -> None:
        self.size, self.rank = comm.Get_size(), comm.Get_rank()
        slots = len(owner_of)
        check_audit_slots(k, slots, self.size)
        self.k, self.slots, self.owner_of = int(k), slots, list(owner_of)
        self.schedule = AuditSchedule(self.k, self.owner_of, self.size)
        self.compute = compute  # which ranks compute alike (None: all do)
        self.window = self.schedule.met_within()  # W: every slot is audited in any W steps
        self.host = socket.gethostname()
        self.words = w = 2 * self.schedule.per_round  # what the combine carries (audit_words)
        self._referee = WordTable(
            comm, 2 * w + _HOST_WORDS, timeout=timeout, contract=contract, what="refereeing audited slots"
        )
        self._mine = np.zeros(w)  # this rank's digests of the round's slots (owner or auditor)
        self._mine_ref = np.zeros(2 * w + _HOST_WORDS)
        self._given: tuple = (-1, {}, None, None)  # (step, payloads, out, at) of the last contribute
        self.checked = 0  # slot audits that passed (for reports)

    def data_slots(self, step: int) -> list[int]:
        """Slots other than its own whose data this rank may need at `step` (as auditor or referee)."""
        return [
            s for s, (a, refs) in self.schedule.round(step).items() if self.rank == a or self.rank in refs
        ]

    def contribute(
        self,
        step: int,
        payloads: dict,
        compute,
        scratch: np.ndarray,
        out: np.ndarray,
        *,
        words: int,
        at: int | None = None,
        tamper: Callable[[int, int, np.ndarray], None] | None = None,
    ) -> None:
        """Before the combine: digest this rank's audited slots (`payloads`: its own, computed;
        `compute(s, out)` recomputes slot s into `scratch`; `words`: the payload words digested,
        the stop word and what follows excluded) and write into `out` (`self.words` words of one
        of its own payloads, zero in the others) the owner's digests, the auditor's digests
        negated, zeros elsewhere: summed by the combine, word pair j is 0 exactly when slot j's
        two digests agree (halves are integers below 2^32, and each word has at most two
        non-zero terms, so the sum is exact in any order). Zeros between rounds. This rank's
        digests are kept (`_mine`) for the referees' round, should the combined words differ, and
        so are `payloads` and `at` (where the audit's words start in each payload; None: `out`
        alone), to read back the words carried. `tamper`: verification only
        (alpha_mpi_verify.faults), called as tamper(rank, step, out) once `out` is written."""
        self._given = (step, payloads, out, at)
        mine = self._mine
        mine[:] = 0.0
        out[:] = 0.0
        for j, (s, (auditor, _)) in enumerate(self.schedule.round(step).items()):
            if self.owner_of[s] == self.rank:
                mine[2 * j : 2 * j + 2] = halves(payload_digest(payloads[s][:words]))
                out[2 * j : 2 * j + 2] = mine[2 * j : 2 * j + 2]
            elif auditor == self.rank:
                compute(s, scratch)
                mine[2 * j : 2 * j + 2] = halves(payload_digest(scratch[:words]))
                out[2 * j : 2 * j + 2] = -mine[2 * j : 2 * j + 2]
        if tamper is not None:
            tamper(self.rank, step, out)

    def settle(self, step: int, combined: np.ndarray, compute, scratch: np.ndarray, *, words: int) -> None:
        """After the combine, before anything is applied: `combined` is the combine's sum of
        every rank's `contribute` words, the same on every rank, so every rank decides alike.
        All zero: the round passed. Else every rank raises `compute-mismatch` or, after the
        referees' round, `sdc-detected` (naming the rank(s) and host(s)); nothing was applied.
        `compute` and `words` as for `contribute` (a referee recomputes)."""
        roles = self.schedule.round(step)
        if not roles:
            return
        bad = [j for j in range(len(roles)) if combined[2 * j] != 0.0 or combined[2 * j + 1] != 0.0]
        if not bad:
            self.checked += len(roles)
            return
        self._environment(step, roles, bad)
        self._refuse(step, roles, bad, compute, scratch, words)

    def _alike(self, a: int, b: int) -> bool:
        return self.compute is None or self.compute.ranks.same(a, b)

    def _environment(self, step: int, roles: dict, bad: list[int]) -> None:
        """Raise `compute-mismatch` (on every rank alike, blaming none) when an owner and its
        auditor that disagree compute under different identities."""
        audited = list(roles)
        pairs = [(audited[j], self.owner_of[audited[j]], roles[audited[j]][0]) for j in bad]
        env = [(s, o, a) for s, o, a in pairs if not self._alike(o, a)]
        if env and self.compute is not None:
            s, o, a = env[0]
            raise self.compute.broken_promise(
                [o, a],
                f"step {step}: slot {s}'s payloads as owner rank {o} and auditor rank {a} computed them",
                "; nothing was applied",
                step=step,
                slots=(s,),
            )

    def _refuse(self, step, roles, bad, compute, scratch, n2) -> None:
        """The referees' round (every rank, after a mismatch): each rank's row again (the owners'
        and auditors' digests, which the combine carried only as differences), the referees'
        recomputations of the slots that differ, the words each rank carried in the combine and
        its host name; then `sdc-detected` naming the ranks shown wrong, or `sdc-undetermined`
        naming none (learning/audit_verdict.py: who is shown wrong)."""
        audited = list(roles)
        w = self.words
        mine = self._mine_ref
        mine[:w] = self._mine
        mine[w : 2 * w] = self._carried(step)
        mine[2 * w :] = _host_words(self.host)
        for j in bad:
            s = audited[j]
            if self.rank in roles[s][1]:
                compute(s, scratch)
                mine[2 * j : 2 * j + 2] = halves(payload_digest(scratch[:n2]))
        ref = self._referee.run(mine)
        hosts = [_host_name(ref[r, 2 * w :]) for r in range(self.size)]
        verdicts = []
        for j in bad:
            s = audited[j]
            o, (a, refs) = self.owner_of[s], roles[s]
            alike = tuple(r for r in refs if self._alike(r, o))
            why = (
                "with 2 ranks there is no referee"
                if not refs
                else f"referee {', '.join(map(str, refs))} computes under another compute identity and is no referee"
            )
            cols = slice(2 * j, 2 * j + 2)
            verdicts.append(judge(s, o, a, alike, ref[:, cols], ref[:, w:][:, cols], why_none=why))
        faulty: list[int] = []
        for v in verdicts:
            faulty += [x for x in v.named if x not in faulty]
        notes = "; ".join(v.note for v in verdicts)
        clean = clean_step(step, self.window)
        before = (
            ""
            if clean == step
            else f"; the steps before were audited in part (every slot once in {self.window} steps: "
            f"{self.k} of {self.slots} a step on average), so the last state known clean is at step {clean}"
        )
        context = {"step": step, "slots": tuple(audited[j] for j in bad), "clean_step": clean}
        if not faulty:
            raise Refusal(
                "sdc-undetermined",
                f"step {step}: the audit's words differ but no rank is shown wrong ({notes}); no rank is "
                f"named; nothing was applied, so the step may be retried{before}",
                ranks=(),
                hosts=(),
                **context,
            )
        who = ", ".join(f"rank {x} on host {hosts[x]}" for x in faulty)
        raise Refusal(
            "sdc-detected",
            f"step {step}: recomputed slot payloads differ ({notes}); suspected: {who}; "
            f"nothing was applied{before}",
            ranks=tuple(faulty),
            hosts=tuple(hosts[x] for x in faulty),
            **context,
        )

    def _carried(self, step: int) -> np.ndarray:
        """The audit's words this rank's payloads carried into the combine at `step`, read back
        from its buffers (the combine does not write its inputs): what `contribute` wrote, unless
        they changed before the combine read them. Summed over the payloads (the others carry
        zeros); without `at` (a front end that does not say where the words are), the
        carrier's words only."""
        if self._given[0] != step:
            return np.zeros(self.words)
        _, payloads, out, at = self._given
        if at is None:
            return np.array(out, dtype=np.float64)
        total = np.zeros(self.words)
        for buf in payloads.values():
            total += buf[at : at + self.words]
        return total


def build_checks(
    comm: MPI.Comm,
    plan,
    options: tuple[int, int, str],
    *,
    timeout,
    contract: str,
    compute: ComputeCheck | None = None,
) -> tuple[SlotAudit | None, object | None]:
    """A learner's (SlotAudit or None, ReplicaDigests or None) from its options (audit_slots,
    audit_digests, partition); collective when either is asked for. `plan`: the learner's
    combine plan (its `slots_of(rank)` places the slots); `compute`: its ComputeCheck after the
    first agreement (which ranks compute alike), so neither calls an environment difference a
    fault."""
    audit_slots, audit_digests, partition = options
    audit = replicas = None
    if audit_slots:
        audit = SlotAudit(
            comm,
            audit_slots,
            slot_owners(plan, comm.Get_size()),
            timeout=timeout,
            contract=contract,
            compute=compute,
        )
    if audit_digests:
        from .replicas import ReplicaDigests

        replicas = ReplicaDigests(
            comm, audit_digests, partition, timeout=timeout, contract=contract, compute=compute
        )
    return audit, replicas


def needed_slots(audit: SlotAudit | None, my_slots, step: int) -> list[int]:
    """`my_slots`, then the slots `audit` has this rank recompute at `step` (auditor or referee)."""
    extra = [] if audit is None else audit.data_slots(step)
    return list(my_slots) + [s for s in extra if s not in my_slots]
