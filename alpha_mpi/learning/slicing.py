"""Data slicing: a global batch (or a stream of sample indices) -> this rank's slots.

The combine tree is over logical slots, so rank-count independence needs one thing from the
data: slot s holds the same samples whatever the rank count. Every function here is a pure
function of (global batch, slot count) and returns only the slots a rank owns, so every rank can
read the same global batch (or the same index stream) and take its part:

    learner = DataParallelLearner(comm, model, slots=8)
    for X, y in global_batches:                                   # the same on every rank
        loss, _ = learner.train_step(slice_batch(X, y, 8, learner.my_slots))

Slot s of a batch of B samples is the contiguous window `slot_ranges(B, S)[s]`: B // S samples,
the first B % S slots one more (unequal slots are fine: the learner weighs each by its sample
count). X and y may be numpy arrays or torch tensors (anything sliceable along its first axis).
X may also be a mapping of such arrays (a Hugging Face-style batch: `{"input_ids": ...,
"labels": ...}`), every value cut alike, and y may be None (the targets are inside X).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from ..refusals import Refusal
from .data import SlotStream, slot_sizes

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = [
    "batch_length",
    "slot_ranges",
    "slice_batch",
    "slice_local",
    "slice_indices",
    "stream_batch",
    "SlotStream",
]


class Sliceable(Protocol):
    """What X and y may be: a numpy array, a torch tensor, anything with a length and indexed
    along its first axis (by a slice, or by an index array in `stream_batch`)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: Any, /) -> Any: ...


_X = TypeVar("_X", bound=Sliceable)
_Y = TypeVar("_Y", bound=Sliceable)


def batch_length(X: Any, y: Any = None) -> int:
    """The sample count of a batch: len(X), or for a mapping the common first-axis length of its
    values; y (None allowed) must hold as many (`data-invalid` otherwise)."""
    if isinstance(X, Mapping):
        lengths = {k: len(v) for k, v in X.items()}
        if not lengths or len(set(lengths.values())) != 1:
            raise Refusal(
                "data-invalid", f"a mapping batch needs values of one length along axis 0, got {lengths}"
            )
        n = next(iter(lengths.values()))
    else:
        n = len(X)
    if y is not None and len(y) != n:
        raise Refusal("data-invalid", f"X has {n} samples, y has {len(y)}")
    return n


def _take(v: Any, a: int, b: int) -> Any:
    """Samples [a, b) of v: a slice, every value of a mapping sliced alike, None kept."""
    if v is None:
        return None
    if isinstance(v, Mapping):
        return {k: x[a:b] for k, x in v.items()}
    return v[a:b]


def slot_ranges(batch: int, slots: int, sizes: Iterable[int] | None = None) -> list[tuple[int, int]]:
    """[(start, stop)] of each slot's window in a batch of `batch` samples (slot order).

    `sizes` (one count per slot, summing to `batch`) overrides the default cut (batch // slots,
    the first batch % slots slots one more). Every slot needs at least one sample.
    """
    if isinstance(slots, bool) or not isinstance(slots, (int, np.integer)) or slots < 1:
        raise Refusal("usage", f"slots must be an int >= 1, got {slots!r}")
    if batch < slots:
        raise Refusal(
            "options-conflict",
            f"a batch of {batch} samples cannot fill {slots} slots: every slot needs a sample",
        )
    sizes = slot_sizes(batch, slots) if sizes is None else [int(k) for k in sizes]
    if len(sizes) != slots or sum(sizes) != batch or min(sizes) < 1:
        raise Refusal(
            "usage", f"slot sizes {sizes} must be {slots} counts >= 1 adding up to the batch {batch}"
        )
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    return [(int(offsets[s]), int(offsets[s + 1])) for s in range(slots)]


def _owned(owned, slots):
    owned = list(owned)
    bad = [s for s in owned if not 0 <= s < slots]
    if bad:
        raise Refusal("slot-invalid", f"slots {bad} are not in 0..{slots - 1}")
    return owned


def slice_batch(
    X: _X, y: _Y, slots: int, owned: Iterable[int], sizes: Iterable[int] | None = None
) -> dict[int, tuple[_X, _Y]]:
    """{slot: (X[a:b], y[a:b])} for the `owned` slots of the global batch (X, y).

    `owned` is `learner.my_slots` (or `DataParallel.my_slots`). Slices are views, not copies.
    """
    ranges = slot_ranges(batch_length(X, y), slots, sizes)
    return {s: (_take(X, *ranges[s]), _take(y, *ranges[s])) for s in _owned(owned, slots)}


def slice_local(
    X: _X, y: _Y, slots: int, owned: Iterable[int], sizes: Iterable[int] | None = None
) -> dict[int, tuple[_X, _Y]]:
    """{slot: (X[a:b], y[a:b])} of a rank's batch that holds only its `owned` slots of one global
    batch, in slot order (what alpha_mpi.torch.SlotSampler yields).

    The owned slots' sizes follow from the batch's length under the even cut
    (alpha_mpi.learning.epochs.local_sizes); `sizes` (one count per slot of the global batch)
    gives them for another cut. Slices are views, not copies.
    """
    count = batch_length(X, y)
    owned = sorted(_owned(owned, slots))
    if sizes is None:
        from .epochs import local_sizes

        mine = local_sizes(count, slots, owned)
    else:
        cut = [int(k) for k in sizes]
        slot_ranges(sum(cut), slots, cut)  # refuses a cut that is not one count >= 1 per slot
        mine = [cut[s] for s in owned]
        if sum(mine) != count:
            raise Refusal(
                "data-invalid",
                f"the rank batch holds {count} samples; its slots {owned} hold {sum(mine)} in the cut {cut}",
            )
    out, a = {}, 0
    for s, k in zip(owned, mine):
        out[s] = (_take(X, a, a + k), _take(y, a, a + k))
        a += k
    return out


def slice_indices(
    indices: npt.ArrayLike, slots: int, owned: Iterable[int], sizes: Iterable[int] | None = None
) -> dict[int, np.ndarray]:
    """{slot: sample indices} for the `owned` slots of one step's global index list.

    For samplers that yield the indices of a global batch (the same list on every rank).
    """
    idx = np.asarray(indices)
    ranges = slot_ranges(len(idx), slots, sizes)
    return {s: idx[ranges[s][0] : ranges[s][1]] for s in _owned(owned, slots)}


def stream_batch(
    stream: SlotStream, step: int, owned: Iterable[int], X: _X, y: _Y
) -> dict[int, tuple[_X, _Y]]:
    """{slot: (X[idx], y[idx])} of step `step` of a seeded `SlotStream` (the CLI's data order).

    `SlotStream(n, batch, slots, seed)` walks seeded permutations of the n samples, one global
    batch per step; a resumed run continues at the same position because the position is a
    function of the step alone.
    """
    out = {}
    for s in _owned(owned, len(stream.sizes)):
        idx = stream.indices(step, s)
        out[s] = (X[idx], y[idx])
    return out
