"""Whether the ranks' slots of a step are the cut of one global batch: `cut_rule`, `check_cut`.

Apart from data_parallel.py because it is a rule about the data, checked on the combined payload:
each slot writes its sample count into its own word of the payload's `sizes` component (every
other slot writes 0 there, so the combine's sums are exact), so after the combine every rank
holds the whole cut and the global sample count, the same on every rank. `step` and
`step_local` then refuse, on every rank alike, slots that no one global batch's cut gives: a
rank given the global batch where its share was meant (or another rank's share, or a batch of
another length than the others') would otherwise train on other samples, silently.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from ..learning.data import slot_sizes
from ..refusals import Refusal

__all__ = ["cut_rule", "check_cut", "check_batch"]

Rule = Callable[[float], list]


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


def check_cut(got: np.ndarray, total: float, rule: Rule | None) -> None:
    """Refuse (`slot-cut-mismatch`) unless the combined sizes `got` are `rule(total)`."""
    if rule is None:
        return
    want = rule(total)
    if got.tolist() != want:
        bad = [s for s in range(len(got)) if got[s] != want[s]][:6]
        raise Refusal(
            "slot-cut-mismatch",
            f"the ranks' slots hold {int(total)} samples but slots {bad} hold "
            f"{[int(got[s]) for s in bad]} where one global batch's cut gives "
            f"{[int(want[s]) for s in bad]}",
        )
