"""Epochs of a data set cut into global batches and slots, and a rank's share of each batch.

What `alpha_mpi.torch.SlotSampler` yields, as pure functions (no torch, no MPI), so that a rank
reads only the samples of the slots it owns and the result is still the global batch's:

- `epoch_order(n, seed, epoch, shuffle)`: the order of the n samples in an epoch, one seeded
  permutation (the same on every rank: a function of seed and epoch alone).
- `epoch_windows(n, batch, drop_last)`: the global batches of an epoch, consecutive windows of
  that order; with `drop_last=False` the last one holds the n % batch samples left over.
- `share(order, window, slots, owned)`: a rank's batch: the samples of the `owned` slots of one
  window, in slot order, each slot its window of `slot_ranges(len(window), slots)`.
- `local_sizes(count, slots, owned)`: the inverse on the receiving side: from the length of a
  rank's batch alone, the size of each owned slot (what `DataParallel.step_local` cuts by).

Why the length is enough: under the even cut (slot_sizes: batch // slots each, the first
batch % slots one more) every slot's size is non-decreasing in the batch size, so two batch
sizes whose owned slots add up to the same count give every owned slot the same size.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from ..refusals import Refusal
from .data import slot_sizes

__all__ = ["epoch_order", "epoch_windows", "share", "local_sizes", "check_epoch"]

_ORDER_TAG = 0x5A3B  # keeps this stream apart from SlotStream's (0xDA7A) for the same seed


def check_epoch(epoch: object) -> int:
    """An epoch number is an int >= 0 (`usage` otherwise)."""
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
        raise Refusal("usage", f"the epoch must be an int >= 0, got {epoch!r}")
    return int(epoch)


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The sample indices of epoch `epoch` in order (int64): a seeded permutation, or 0..n-1."""
    epoch = check_epoch(epoch)
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    return np.random.default_rng([int(seed), _ORDER_TAG, epoch]).permutation(n).astype(np.int64)


def epoch_windows(n: int, batch: int, drop_last: bool = True) -> list[tuple[int, int]]:
    """[(start, stop)] of each global batch of an epoch of n samples."""
    full, rest = divmod(n, batch)
    out = [(k * batch, (k + 1) * batch) for k in range(full)]
    if rest and not drop_last:
        out.append((full * batch, n))
    return out


def share(order: np.ndarray, window: tuple[int, int], slots: int, owned: Iterable[int]) -> list[int]:
    """The sample indices of the `owned` slots of global batch `order[window]`, in slot order."""
    a, b = window
    sizes = slot_sizes(b - a, slots)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    out: list[int] = []
    for s in sorted(owned):
        out.extend(order[a + starts[s] : a + starts[s + 1]].tolist())
    return out


def local_sizes(count: int, slots: int, owned: Sequence[int]) -> list[int]:
    """Sizes of the `owned` slots (in slot order) of a rank batch of `count` samples cut evenly
    from a global batch of `slots` or more; `data-invalid` when no global batch gives `count`."""
    owned = sorted(owned)
    k = len(owned)
    # A global batch of q*slots + r samples gives owned slot s the size q + (s < r): the count
    # is k*q + |{s in owned: s < r}|, so q is count // k or one less (when every owned slot
    # takes an extra sample).
    for q in (count // k, count // k - 1):
        if q < 1:  # every slot of a global batch holds a sample
            continue
        for r in range(slots):
            extra = [1 if s < r else 0 for s in owned]
            if k * q + sum(extra) == count:
                return [q + e for e in extra]
    raise Refusal(
        "data-invalid",
        f"a rank batch of {count} samples is no even cut of the {k} slots this rank owns "
        f"({owned[:8]}{'...' if k > 8 else ''}) out of {slots}: it must hold exactly those slots "
        "of one global batch (alpha_mpi.torch.SlotSampler yields such batches)",
    )
