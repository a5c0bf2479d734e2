"""Validation of a rank's contributions, shared by every realization (tree, scatter).

Refusals here happen before any request starts, so the channel stays clean and the executor
stays usable (only this rank's peers will wait for it, up to their timeout).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Union

import numpy as np

from ..refusals import Refusal

#: One rank's contributions: slot -> float64 payload, or a tuple of parts (numerator, mass).
#: Pass a dict (anything else is refused, `contributions-not-mapping`); the alias says Mapping because a
#: dict is invariant in its values: `{s: np.zeros(n)}` held in a variable would not be a
#: dict[int, ndarray | tuple] to a type checker.
Contributions = Mapping[int, Union[np.ndarray, tuple[np.ndarray, ...]]]


def require_mapping(contributions) -> None:
    """Refuse anything but a dict slot -> payload by name; a bare array (the MPI habit of passing
    the buffer itself) is told what belongs there (`contributions-not-mapping`)."""
    if isinstance(contributions, dict):
        return
    if isinstance(contributions, (np.ndarray, list, tuple, float, int)):
        raise Refusal(
            "contributions-not-mapping",
            f"contributions is a bare {type(contributions).__name__} where a {{slot: array}} mapping belongs: "
            "pass {slot: x} for each slot this rank owns, or call alpha_mpi.allreduce(comm, x) with no tree "
            "(one contribution per rank, slot = rank)",
        )
    raise Refusal(
        "contributions-not-mapping",
        f"contributions must be a dict mapping slot -> payload, got {type(contributions).__name__}",
    )


def check_contributions(contributions, slots, rank: int, count: int, layout_key: str) -> dict:
    """slot -> flat contiguous float64 payload of `count` elements, for exactly this rank's `slots`.

    A payload is a float64 array, or a tuple of parts (e.g. numerator, mass) concatenated in order.
    """
    require_mapping(contributions)
    if len(contributions) != len(slots) or any(s not in contributions for s in slots):
        extra = sorted(set(contributions) - set(slots))
        if extra:
            raise Refusal(
                "contribution-unexpected",
                f"rank {rank} passed slot(s) {extra[:8]} it does not own in the tree (it owns {list(slots)[:8]})",
            )
        missing = [s for s in slots if s not in contributions]
        raise Refusal(
            "contribution-missing", f"rank {rank} owns slot(s) {missing[:8]} but passed no payload for them"
        )
    out = {}
    for slot, value in contributions.items():
        if isinstance(value, tuple):
            # Parts are checked like a bare payload: a float32 / int / complex part converted
            # here would be a silent conversion site the contract does not name.
            for i, part in enumerate(value):
                if not isinstance(part, np.ndarray) or part.dtype != np.float64:
                    raise Refusal(
                        "dtype-invalid",
                        f"slot {slot}: part {i} of the tuple must be a float64 array, got "
                        f"{getattr(part, 'dtype', type(part).__name__)}",
                    )
            parts = [np.ravel(p) for p in value]
            arr = np.concatenate(parts) if len(parts) > 1 else parts[0]
        else:
            arr = value
        if not isinstance(arr, np.ndarray) or arr.dtype != np.float64:
            raise Refusal(
                "dtype-invalid",
                f"slot {slot}: payload must be a float64 array, got {getattr(arr, 'dtype', type(arr))}",
            )
        if arr.size != count:
            raise Refusal(
                "contribution-shape",
                f"slot {slot}: {arr.size} elements, the layout {layout_key} needs {count}",
            )
        # C reads a payload through `double *`: a non-contiguous or misaligned one is copied
        # (np.array allocates aligned memory), never read in place
        flags = arr.flags
        out[slot] = (
            arr.reshape(-1) if flags.c_contiguous and flags.aligned else np.array(arr, order="C").reshape(-1)
        )
    return out


def refuse_nonfinite(leaves: dict, step: int, result=None) -> None:
    """Name the refusal for a non-finite combine: this rank's own contribution if one holds a
    NaN/Inf, else the combined value (another rank's contribution, or overflow). Always raises.
    A contribution that shares memory with `result` (evaluated in place) is skipped."""
    from .. import kernel
    from ..refusals import KernelRefusal

    for slot, arr in leaves.items():
        if result is not None and np.shares_memory(arr, result):
            continue  # in place: the contribution now holds the result
        i = kernel.first_nonfinite(arr)
        if i >= 0:
            raise KernelRefusal(
                "non-finite-contribution",
                f"slot {slot} holds {arr[i]!r} at element {i} (step {step}); nothing was applied",
                slot=slot,
                index=i,
            )
    raise KernelRefusal(
        "non-finite-combined",
        f"the combined value at step {step} is not finite (a contribution on another rank, or overflow)",
    )
