"""Whether the ranks' slots of a step are the cut of one global batch: `Given`, `check_cut`.

Apart from data_parallel.py because it is a rule about the data, checked on the combined payload:
each slot writes its sample count into its own word of the payload's `sizes` component (every
other slot writes 0 there, so the combine's sums are exact), so after the combine every rank
holds the whole cut, the same on every rank. The global batch's length is one of the words the
ranks agree on (alpha_mpi.torch.step_agreement: `len(y)` for `step`, the SlotSampler's note or
`sum(sizes)` for `step_local`), so `step` and `step_local` then refuse, on every rank alike,
slots that are not that global batch's cut: a rank given the global batch where its share was
meant (or another rank's share) would otherwise train on other samples, silently. `Given`: how a
step's global batch came, what the ranks compare about it and the rule of its cut.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..learning.data import slot_sizes
from ..learning.slicing import batch_length
from ..refusals import Refusal
from .step_agreement import BatchNote, BatchNotes, content_digest

__all__ = ["Given", "given_whole", "given_share", "given_slots", "cut_rule", "check_cut", "check_batch"]

Rule = Callable[[float], list]


@dataclass(frozen=True)
class Given:
    """How a step's global batch was given on this rank: `source` (step_agreement.SOURCES), the
    caller's `sizes` (None: the even cut), the SlotSampler's `note` (None: none), the global
    batch's `length` (0: not known, step_slots), the `rule` its slot sizes must follow (None:
    the caller's cut is not checked) and `digest()`, what the ranks compare about its contents."""

    source: str
    sizes: list[int] | None
    note: BatchNote | None
    length: int
    rule: Rule | None
    digest: Callable[[], int]


def given_whole(X: Any, y: Any, sizes: list[int] | None, slots: int) -> Given:
    """`step`: the global batch itself on every rank; its contents are digested (CRC-32)."""
    return Given(
        "step", sizes, None, batch_length(X, y), cut_rule(sizes, slots), lambda: content_digest(X, y)
    )


def given_share(notes: BatchNotes, sizes: list[int] | None, slots: int) -> Given:
    """`step_local`: this rank's share; which global batch it belongs to comes from the
    SlotSampler's note (taken here, in order) or from `sizes` (its sum). Neither: refused, since
    nothing could then tell a share from a whole batch given to every rank (a DDP habit)."""
    note = notes.take()
    if note is None and sizes is None:
        raise Refusal(
            "slot-cut-mismatch",
            "step_local cannot tell which global batch this rank's samples belong to: no "
            "SlotSampler batch is pending and no sizes= was given (a whole batch on every rank, "
            "or a DistributedSampler's share, would train silently on other samples)",
        )
    if note is not None:
        return Given(
            "step_local (SlotSampler)", sizes, note, note.length, cut_rule(sizes, slots), lambda: note.digest
        )
    return Given("step_local (sizes=)", sizes, None, sum(sizes), cut_rule(sizes, slots), lambda: 0)


def local_cut(X: Any, y: Any, slots: int, my_slots: list[int], sizes: list[int] | None, audit) -> Mapping:
    """`step_local`'s {slot: data}: this rank's share cut into its own slots; refused with the
    audit (`audit`: not None), whose auditors also need other ranks' slots."""
    from ..learning.slicing import slice_local

    if audit is not None:
        raise Refusal(
            "options-conflict",
            "step_local takes this rank's own slots only; with audit_slots a rank also "
            "recomputes other ranks' slots: use step() with the global batch or step_slots()",
        )
    return slice_local(X, y, slots, my_slots, sizes)


def given_slots() -> Given:
    """`step_slots`: a batch already cut; its cut is the caller's."""
    return Given("step_slots", None, None, 0, None, lambda: 0)


def check_batch(batch: Mapping[int, object], needed: list[int]) -> Mapping[int, object]:
    """`batch` if it holds exactly the `needed` slots (`contribution-missing` otherwise)."""
    missing = [s for s in needed if s not in batch]
    if missing or len(batch) != len(needed):
        raise Refusal("contribution-missing", f"batch holds slots {sorted(batch)}, this rank needs {needed}")
    return batch


def cut_rule(sizes: list[int] | None, slots: int) -> Rule:
    """The slot sizes a global batch of `total` samples must have: `sizes` as the caller gave
    them, else the even cut (slot_sizes)."""
    if sizes is not None:
        given = [float(k) for k in sizes]
        return lambda total: given
    return lambda total: [float(k) for k in slot_sizes(int(total), slots)]


def check_cut(got: np.ndarray, length: int, rule: Rule | None) -> None:
    """Refuse (`slot-cut-mismatch`) unless the combined sizes `got` are `rule(length)`, the cut
    of the global batch of `length` samples every rank was given (agreed before this check)."""
    if rule is None:
        return
    want = rule(length) if length >= len(got) else None
    if want is None or got.tolist() != want:
        bad = [s for s in range(len(got)) if want is None or got[s] != want[s]][:6]
        wanted = "none (too few samples for the slots)" if want is None else [int(want[s]) for s in bad]
        raise Refusal(
            "slot-cut-mismatch",
            f"the ranks' slots hold {int(got.sum())} samples but slots {bad} hold "
            f"{[int(got[s]) for s in bad]} where the cut of the global batch of {length} gives {wanted}",
        )
