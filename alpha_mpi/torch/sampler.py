"""`SlotSampler`: a DataLoader batch sampler that reads only this rank's share of each global batch.

    sampler = SlotSampler(dataset, dp, batch_size=128, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=2)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for X, y in loader:                       # this rank's slots of one global batch
            dp.step_local(X, y, loss_fn)
            opt.step(); opt.zero_grad()

Each epoch orders the data set by one permutation of (seed, epoch) (or in order without
`shuffle`); its consecutive windows of `batch_size` are the global batches, the same on every
rank and every rank count. Each global batch is cut into `dp.slots` slots by the even cut of
`dp.step` (alpha_mpi.learning.slot_ranges); a rank's batch holds the samples of the slots it owns
(`dp.my_slots`), in slot order, so it reads 1/p of the data set per epoch where `dp.step` on a
global batch would read all of it on every rank (DDP's DistributedSampler reads 1/p too, but its
result changes with p). `dp.step_local(X, y, loss_fn)` then gives the bits `dp.step` gives on
the global batch, on any rank count. The index arithmetic is alpha_mpi.learning.epochs.

The sampler is iterated in the main process (the DataLoader hands index lists to its workers),
so `num_workers`, `pin_memory` and `persistent_workers` work as with any batch sampler.

It also tells the step which global batch each share belongs to: for every batch it yields it
leaves a note with `dp` (the data set length, the global batch's length, the epoch, the batch's
place in the epoch and a CRC-32 of its sample indices), and `dp.step_local` takes the notes in
order (the DataLoader returns batches in the order the sampler yields them) and carries them in
the step's payload (alpha_mpi.torch.step_agreement): a rank whose sampler walks another epoch,
another start, another data set or batch size is refused by name, not trained on. A new
iteration drops the notes an epoch left early left behind.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sized
from typing import TYPE_CHECKING

from ..learning.epochs import check_epoch, epoch_order, epoch_windows, share
from ..refusals import Refusal
from ._env import require_torch
from .step_agreement import BatchNote, indices_digest

if TYPE_CHECKING:
    import torch

    from .data_parallel import DataParallel
else:
    torch = require_torch()

__all__ = ["SlotSampler", "RepeatedEpochWarning"]


class RepeatedEpochWarning(UserWarning):
    """A SlotSampler walked the same (epoch, start) twice with no `set_epoch` between."""


def _count(x: object, what: str, least: int) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < least:
        raise Refusal("usage", f"{what} must be an int >= {least}, got {x!r}")
    return x


class SlotSampler(torch.utils.data.Sampler):
    """Batches of this rank's slots: `DataLoader(dataset, batch_sampler=SlotSampler(...))`.

    Arguments:
        dataset: the data set (anything with a length); the sampler yields its indices.
        dp: the `alpha_mpi.torch.DataParallel` that trains on the batches (its `slots` and
            `my_slots` decide the cut and this rank's share).
        batch_size: the global batch, >= dp.slots (every slot needs a sample).
        shuffle: a new seeded permutation each epoch (default True); False: in data set order.
        seed: the permutation's seed (an int >= 0; the same on every rank).
        drop_last: drop the short last batch of an epoch (default True). False keeps it; its
            len(dataset) % batch_size samples must still fill dp.slots slots.

    `len(sampler)` is the number of steps of an epoch (the same on every rank);
    `set_epoch(e)` selects the epoch the next iteration walks (DistributedSampler's name);
    `set_epoch(e, start)` from its batch `start` on, to resume mid-epoch after `dp.restore`.
    Walking the same (epoch, start) again with no `set_epoch` between warns
    (`RepeatedEpochWarning`, naming set_epoch): a forgotten `set_epoch` on every rank alike
    repeats the epoch's order, which no comparison between ranks can see.
    """

    def __init__(
        self,
        dataset: Sized,
        dp: DataParallel,
        *,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
    ) -> None:
        self.n = len(dataset)
        self.slots, self.owned = dp.slots, list(dp.my_slots)
        self.notes = dp.notes  # what each yielded batch belongs to, for dp.step_local
        self.batch_size = _count(batch_size, "batch_size", 1)
        self.seed = _count(seed, "seed", 0)
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self.epoch, self.start = 0, 0
        self._walked: tuple[int, int] | None = None  # (epoch, start) last walked since set_epoch
        if self.batch_size < self.slots:
            raise Refusal(
                "options-conflict",
                f"batch_size {batch_size} cannot fill {self.slots} slots: every slot needs a sample; "
                f"use batch_size >= {self.slots}",
            )
        self.windows = epoch_windows(self.n, self.batch_size, self.drop_last)
        if not self.windows:
            raise Refusal(
                "data-invalid",
                f"a data set of {self.n} samples holds no batch of {self.batch_size}"
                + (" (drop_last=True drops the short one)" if self.n else ""),
            )
        last = self.windows[-1][1] - self.windows[-1][0]
        if last < self.slots:
            raise Refusal(
                "options-conflict",
                f"with drop_last=False the last batch of each epoch holds {last} samples, fewer "
                f"than the {self.slots} slots; use drop_last=True or a batch_size that leaves "
                f"0 or at least {self.slots} samples over",
            )

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """The epoch the next iteration walks (its permutation), from its batch `start` on (a
        resume mid-epoch: `set_epoch(*divmod(dp.steps, sampler.steps_per_epoch))`)."""
        self.epoch = check_epoch(epoch)
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start < len(self.windows):
            raise Refusal(
                "usage", f"start must be a batch of the epoch, 0..{len(self.windows) - 1}; got {start!r}"
            )
        self.start, self._walked = start, None

    @property
    def steps_per_epoch(self) -> int:
        """Global batches per epoch (the same on every rank)."""
        return len(self.windows)

    def __len__(self) -> int:
        """The batches the next iteration yields: the epoch's, less those before `start`."""
        return len(self.windows) - self.start

    def __iter__(self) -> Iterator[list[int]]:
        walk = (self.epoch, self.start)
        if self._walked == walk:  # every rank forgot alike: no step can tell, so say it here
            warnings.warn(
                f"SlotSampler walks epoch {self.epoch} from batch {self.start} again with no "
                "set_epoch() since: the same order as the last walk; call "
                "sampler.set_epoch(epoch) before each epoch (DistributedSampler's habit)",
                RepeatedEpochWarning,
                stacklevel=2,
            )
        self._walked = walk
        order = epoch_order(self.n, self.seed, self.epoch, self.shuffle)
        self.notes.restart()
        for i in range(self.start, len(self.windows)):
            a, b = self.windows[i]
            self.notes.push(BatchNote(self.n, b - a, self.epoch, i, indices_digest(order[a:b])))
            yield share(order, (a, b), self.slots, self.owned)

    def global_batches(self, epoch: int | None = None) -> Iterator[list[int]]:
        """The whole global batches of an epoch (default: the current one), for checking that
        `step_local` on this rank's share gives what `step` gives on the global batch."""
        order = epoch_order(self.n, self.seed, self.epoch if epoch is None else epoch, self.shuffle)
        for a, b in self.windows[self.start if epoch is None else 0 :]:
            yield order[a:b].tolist()
