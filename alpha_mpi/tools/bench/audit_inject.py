"""`alpha-mpi bench audit --inject N`: N random bit flips against the audit, and whom it names.

Each trial restores one learner (the one `alpha-mpi train` builds, with --audit-slots K) to its
state at step 0, draws one fault from a seeded generator (the same draws on every rank) and runs
until the audit refuses a step or the fault had `W + 1` steps to be met (W: every slot audited
within W steps, AuditSchedule.met_within). A fault is:

    where     the slot payload as computed (any digested word: gradient, sample count, loss),
              one of the rank's own slots or every slot it computes (own, audited, refereed),
              or the audit's own words as the rank carries them into the combine
    which     any rank, any step in [0, --inject-steps), any bit of the word
    how long  transient (the first computation of that step only) or persistent (from that
              step on, a failing core)

and each outcome is one of: named (`sdc-detected` naming exactly the faulty rank), undetermined
(`sdc-undetermined`: refused, no rank named), non-finite (refused by the combine's finiteness
check: no rank named), FALSE ACCUSATION (a rank named that was not the faulty one), no effect
(never refused, and the run has the healthy run's bits: a flip the arithmetic absorbed), missed
(never refused, other bits: with K < S an unaudited slot), not fired (the rank never computed
that slot in the trial). Steps to detection: the refused step minus the fault's first step. A
payload changed after its digest and before the combine reads it is outside what the audit
covers (docs/audit.md) and is not drawn. Exit status 1 on any false accusation.
"""

from __future__ import annotations

import socket
from collections import Counter

import numpy as np

from ...learning.slicing import stream_batch
from ...learning.trainer import TrainConfig, build, digest
from ...refusals import Refusal

__all__ = ["inject"]

OUTCOMES = ("named", "undetermined", "non-finite", "FALSE ACCUSATION", "no effect", "missed", "not fired")


class _Injector:
    """The learner's fault hook for the whole campaign: the trial's fault, or none."""

    def __init__(self) -> None:
        self.fault = None

    def __call__(self, rank, step, slot, payload) -> None:
        if self.fault is not None:
            self.fault(rank, step, slot, payload)

    def carried(self, rank, step, words) -> None:
        if self.fault is not None and hasattr(self.fault, "carried"):
            self.fault.carried(rank, step, words)


def _draw(rng, size: int, n_words: int, audit_words: int, own: dict, steps: int):
    """One fault (the module docstring's where / which / how long) and its description."""
    from .faults import BitFlip, CarriedFlip

    rank, t0, bit = int(rng.integers(size)), int(rng.integers(steps)), int(rng.integers(64))
    persistent = bool(rng.integers(2))
    if rng.random() < 0.2:
        element = int(rng.integers(audit_words))
        fault = CarriedFlip(rank=rank, step=t0, element=element, bit=bit, persistent=persistent)
        return fault, ("audit word", rank, t0, element, bit, persistent)
    choices = [None, *own[rank]]
    slot = choices[int(rng.integers(len(choices)))]
    element = int(rng.integers(n_words))
    fault = BitFlip(rank, t0, element, bit, slot=slot, persistent=persistent, once=not persistent)
    return fault, ("payload", rank, t0, element, bit, persistent)


def _first_hit(comm, fault) -> int | None:
    """The step the fault first fired, on whichever rank it fired (every rank learns it)."""
    from mpi4py import MPI

    hits = [h if isinstance(h, int) else h[0] for h in fault.hits]
    mine, first = np.array([min(hits) if hits else 2**62], dtype=np.int64), np.zeros(1, dtype=np.int64)
    comm.Allreduce(mine, first, op=MPI.MIN)  # harness bookkeeping through a buffer, not data
    return None if first[0] == 2**62 else int(first[0])


def inject(comm, a, say) -> int:
    """Run the campaign (every rank; `a`: the parsed options, `say`: rank 0's print)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    k = a.audit_slots or a.slots
    cfg = TrainConfig(
        slots=a.slots, batch=a.batch, hidden=a.hidden, partition=a.partition, seed=0, audit_slots=k
    )
    hook = _Injector()
    data, model, lr, stream = build(comm, cfg, hook)
    window = lr.audit.window
    horizon = a.inject_steps + window + 1
    start = lr.checkpoint_snapshot()
    healthy = []  # the healthy run's digest after each step
    for _ in range(horizon):
        lr.train_step(stream_batch(stream, lr.step, lr.needed_slots, data.X, data.y))
        healthy.append(digest(lr.final_params()))
    lr.checkpoint_apply(start)  # a restored learner must replay the healthy bits, or no trial means anything
    for t in range(horizon):
        lr.train_step(stream_batch(stream, lr.step, lr.needed_slots, data.X, data.y))
        if digest(lr.final_params()) != healthy[t]:
            say(
                f"# BITS MISMATCH: the learner restored to step 0 differs from the healthy run at step {t + 1}"
            )
            return 1
    own = {r: list(lr.full_plan.slots_of(r)) for r in range(size)}
    n_words, audit_words = model.n_params + 2, lr.audit.words
    rng = np.random.default_rng(a.inject_seed)
    tally: Counter = Counter()
    by_kind: Counter = Counter()
    delays: list[int] = []
    accusations = []
    for trial in range(a.inject):
        fault, what = _draw(rng, size, n_words, audit_words, own, a.inject_steps)
        kind, bad, t0 = what[0], what[1], what[2]
        lr.checkpoint_apply(start)
        hook.fault = fault
        got = None
        end = t0 + window + 1
        while lr.step < end and got is None:
            try:
                lr.train_step(stream_batch(stream, lr.step, lr.needed_slots, data.X, data.y))
            except Refusal as e:
                got = e
        hook.fault = None
        first = _first_hit(comm, fault)
        if got is not None and got.code == "sdc-detected":
            named = tuple(got.context["ranks"])
            outcome = "named" if named == (bad,) else "FALSE ACCUSATION"
            if outcome != "named":
                accusations.append((trial, what, named))
        elif got is not None and got.code == "sdc-undetermined":
            outcome = "undetermined"
        elif got is not None and (got.code.startswith("non-finite") or got.code == "peer-refused"):
            outcome = "non-finite"
        elif got is not None:
            raise got
        elif first is None:
            outcome = "not fired"
        else:
            outcome = "no effect" if digest(lr.final_params()) == healthy[lr.step - 1] else "missed"
        if got is not None and first is not None:
            delays.append(lr.step - first)
        tally[outcome] += 1
        by_kind[(kind if kind != "payload" else ("persistent" if what[5] else "transient"), outcome)] += 1
    if rank == 0:
        _report(say, a, size, k, model.n_params, window, tally, by_kind, delays, accusations)
    return 1 if accusations else 0


def _report(say, a, size, k, n_params, window, tally, by_kind, delays, accusations) -> None:
    say(
        f"# alpha-mpi bench audit --inject {a.inject} on {socket.gethostname()}: {size} ranks, {n_params} "
        f"parameters, {a.slots} slots, K = {k} (every slot audited within {window} steps), partition "
        f"{a.partition}, faults at steps 0..{a.inject_steps - 1}, seed {a.inject_seed}"
    )
    say("# outcome            payload: transient  persistent   audit word   total")
    for o in OUTCOMES:
        say(
            f"  {o:18s} {by_kind[('transient', o)]:19d} {by_kind[('persistent', o)]:11d} "
            f"{by_kind[('audit word', o)]:12d} {tally[o]:7d}"
        )
    fired = a.inject - tally["not fired"]
    refused = tally["named"] + tally["undetermined"] + tally["non-finite"] + tally["FALSE ACCUSATION"]
    say(
        f"# fired {fired}, refused {refused}, right rank named {tally['named']}, false accusations {len(accusations)}"
    )
    if delays:
        d = Counter(delays)
        say("# steps to detection: " + ", ".join(f"{s}: {d[s]}" for s in sorted(d)))
    for trial, what, named in accusations:
        say(f"# FALSE ACCUSATION in trial {trial}: fault {what}, named {named}")
