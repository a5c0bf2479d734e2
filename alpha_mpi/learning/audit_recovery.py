"""After an audit's detection: which state is known clean, and going back to it (layer 5).

What a detection proves about earlier steps: unless every slot is audited every step, the steps
before the detection may already hold a fault's unaudited work. Any W = m * ceil(S / A)
consecutive steps hold ceil(S / A) rounds, which audit every slot (`AuditSchedule.met_within`).
A fault that persists on one rank from its first step f on (every payload that rank computes, or
every payload of one of its slots) is therefore met within W steps of f, so a detection at step
d means f > d - W:

    clean_step(d)   max(0, d - W + 1): the newest step whose state no such fault can have reached

With W = 1 (K >= p and K = S: every slot, every step) that is d itself: nothing before the
refused step went unaudited. A fault that strikes one unaudited slot once is never met by the
audit (replay finds it offline). `KeptStates` keeps copies of the state at steps the trainer can
go back to (one at least W - 1 steps before any detection) and `rewind_after` saves the newest
state known clean after a detection.

Kept apart from audit.py (the schedule, the exchanges, the verdict) so that spreading or
changing the audit's rounds leaves this alone: it needs only the schedule's window W.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..refusals import Refusal

__all__ = ["clean_step", "KeptStates", "rewind_after"]


def clean_step(step: int, window: int) -> int:
    """After a detection at `step`: the newest step whose state no fault that persists on one
    rank can have reached undetected, max(0, step - W + 1) with W = `window`
    (AuditSchedule.met_within; `step` itself when every slot is audited every step)."""
    return max(0, step - window + 1)


class KeptStates:
    """Copies of a learner's state the trainer can go back to after a detection with K < S.

    `offer(learner)` before each step keeps a copy (`learner.checkpoint_snapshot()`) at the
    first step offered and at every multiple of W, and drops every copy older than the newest one
    at or before `clean_step(step)`: at most two remain (the state at W*floor(...) known clean,
    and one younger), so a detection at any step d finds one at or after d - 2W + 2 that no
    persistent fault reached. Memory: up to two copies of this rank's parameters and optimizer
    state. Nothing is copied when W = 1 (every slot audited every step): the state at a
    detection is itself clean.
    """

    def __init__(self, window: int) -> None:
        self.window = window  # W of the learner's audit schedule (SlotAudit.window)
        self.states: list[tuple[int, dict]] = []  # (step, snapshot), oldest first

    def offer(self, learner) -> None:
        """Keep a copy of the learner's state if its step is one to keep; drop what is not needed."""
        step = learner.step
        if self.window == 1:
            return
        frontier = clean_step(step, self.window)  # the clean step if `step` meets a fault
        known = [i for i, (t, _) in enumerate(self.states) if t <= frontier]
        if known:
            del self.states[: known[-1]]
        if not self.states or (step % self.window == 0 and self.states[-1][0] != step):
            self.states.append((step, learner.checkpoint_snapshot()))

    def newest(self, clean: int) -> tuple[int, dict] | None:
        """The newest kept (step, snapshot) at or before step `clean`, else None."""
        return next(((t, st) for t, st in reversed(self.states) if t <= clean), None)


def rewind_after(e: Refusal, learner, ckpt, kept: KeptStates | None) -> str:
    """After `sdc-detected` (every rank, collective): save the newest state known clean and make
    the checkpoint directory's `latest` name it, so that `--resume` continues from it.

    The state known clean is at `clean_step` (the refusal's context) or before: the learner's
    own when that is its step (K = S), else the newest of `kept` and the published steps at or
    before it. Published steps after it are set aside (Checkpointer.rewind) into
    `sdc-<step-NNNNNNNN of the detection>`; a state only in memory is installed in the learner
    and saved. Records `saved_step` (None: none was kept, a resume starts at step 0),
    `set_aside` and `folder` in `e.context`; returns the step directory or the checkpoint root."""
    from ..checkpoint.paths import step_name

    step, clean = learner.step, e.context.get("clean_step", learner.step)
    mem = (step, None) if clean >= step else (kept.newest(clean) if kept is not None else None)
    back = ckpt.rewind(clean, None if mem is None else mem[0], f"sdc-{step_name(step)}")
    if back.save:
        if mem[1] is not None:  # every rank kept the same step (the same rule on every rank)
            learner.checkpoint_apply(mem[1])
        where = ckpt.save()
    else:
        where = ckpt.root
    e.context.update(saved_step=back.step, set_aside=back.set_aside, folder=back.folder)
    return where
