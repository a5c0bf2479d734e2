"""Where a sharded DataParallel's state lives on each rank: the shard layout (pure) and the
sharding concern of a DataParallel (`ShardContext`); the modes themselves are partition_modes.py's.

`ShardLayout` (pure) cuts the flat parameter vector (the parameters end to end in
`DataParallel.params` order, as the payload lays them out) into one contiguous range per rank,
aligned to a fixed block grid (`GRID` elements): rank r holds the blocks [r·B/p, (r+1)·B/p) of
the B blocks. Where a shard begins never changes a bit (the allow-listed optimizers are
elementwise, measured: alpha_mpi.torch.shard_optimizer), so the grid is there for what is not
elementwise: clipping's norm is summed block by block on this same grid (clipping.BLOCK is
GRID), so a shard holds whole blocks of it on every rank count.

`ShardContext` is what a DataParallel delegates its sharding concern to: the mode (its name, the
refusal of a change), the optimizer it builds, clipping in that mode, `memory()`, and the
sharded optimizers' requests to free.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from ..refusals import Refusal
from . import clip_guard

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["GRID", "Piece", "ShardLayout", "ShardContext"]

GRID = 512
"""Elements per block of the one grid that shards and clipping's norm share (2 KiB of float32).
Clipping's bits must not depend on where shards begin, so shard boundaries must sit on
clipping's block grid: one constant for both (clipping.BLOCK = GRID). 512, not larger: a grid
of 2^16 would make the shards of a small model all-or-nothing (a model of under 2^16·p elements
leaves most ranks an empty shard), while clipping's pairwise combine over the blocks makes its
norm one fixed tree at any block size (a smaller block moves its bits against another size at
the ulp level only, and its tests compare with an independent oracle and torch's own clip).
Large enough that a rank's shard is a few pieces per parameter. Fixed: a checkpoint or a norm
over blocks names the same blocks on every rank count."""

Range = tuple[int, int]


@dataclass(frozen=True)
class Piece:
    """The part of parameter `index` in one rank's shard: its elements [lo, hi) (flattened), the
    flat vector's [start, start + hi - lo)."""

    index: int
    lo: int
    hi: int
    start: int

    @property
    def size(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True)
class ShardLayout:
    """The flat vector of `n` elements (parameters laid end to end at `offsets`) cut into one
    grid-aligned contiguous range per rank of `size` (`bounds[r]`, possibly empty)."""

    n: int
    size: int
    grid: int
    offsets: tuple[Range, ...]
    bounds: tuple[Range, ...]

    @classmethod
    def of(cls, offsets, size: int, grid: int = GRID) -> ShardLayout:
        offsets = tuple((int(a), int(b)) for a, b in offsets)
        n = offsets[-1][1] if offsets else 0
        blocks = -(-n // grid)
        bounds = tuple(
            (min(n, r * blocks // size * grid), min(n, (r + 1) * blocks // size * grid)) for r in range(size)
        )
        return cls(n, size, grid, offsets, bounds)

    def own(self, rank: int) -> Range:
        """Rank `rank`'s [a, b) of the flat vector."""
        return self.bounds[rank]

    def pieces(self, rank: int) -> tuple[Piece, ...]:
        """Every parameter's part of rank `rank`'s shard, in flat order."""
        a, b = self.bounds[rank]
        out = []
        for i, (s, e) in enumerate(self.offsets):
            lo, hi = max(s, a), min(e, b)
            if hi > lo:
                out.append(Piece(i, lo - s, hi - s, lo))
        return tuple(out)

    def ranges(self) -> list[tuple[int, int, int]]:
        """(rank, a, b) for every rank whose shard is not empty: an assembly plan's pieces."""
        return [(r, a, b) for r, (a, b) in enumerate(self.bounds) if b > a]

    def leader(self, index: int) -> int:
        """The rank holding parameter `index`'s first element (its scalar state is that rank's)."""
        s = self.offsets[index][0]
        return next(r for r, (a, b) in enumerate(self.bounds) if a <= s < b)

    def led(self, rank: int) -> Range:
        """The parameters [i, j) whose first element lies in rank `rank`'s shard."""
        a, b = self.bounds[rank]
        idx = [i for i, (s, e) in enumerate(self.offsets) if a <= s < b and e > s]
        return (idx[0], idx[-1] + 1) if idx else (0, 0)


@dataclass(frozen=True)
class ShardContext:
    """The sharding concern of one DataParallel: the communicator, the peer bound, the
    contract's digest (frames name it), the module and its trainable `params` in order, the
    `layout`, the partition `mode` (alpha_mpi.torch.partition_modes), `bindings`
    (id(optimizer) -> its ShardedOptimizer: what checkpoints and memory() look up) and the
    step's `.grad` writer `grads` (the mode's: where a shard's `.grad` comes from, what
    `zero_grad` clears).
    DataParallel's `partition`, `optimizer`, `clip_grad_norm_`, `memory` and `free` delegate
    here."""

    comm: MPI.Comm
    timeout: float | None
    contract: str
    module: object
    params: list
    layout: ShardLayout
    mode: object  # a partition_modes.PartitionMode (not imported: that module imports this one)
    bindings: dict
    grads: object = None  # gradients.GradientWriter, or shard_grads.ShardGradients (grads, params)
    gathers: object = None  # params mode: its GatherSchedule (alpha_mpi.torch.gather_schedule)

    def whole(self, writeback: bool = False):
        """Every parameter whole inside the block: params mode gathers them (collective) and
        releases them after (`writeback`: the shard takes the block's values first); in the
        other modes they are whole already."""
        if self.gathers is None:
            return contextlib.nullcontext()
        return self.gathers.shards.full_parameters(writeback)

    @classmethod
    def of(
        cls, comm, timeout, contract: str, module, params: list, mode, units, sp, layout, grads
    ) -> ShardContext:
        """Collective: the context of `params` laid out by `layout` (ShardLayout of the payload's
        offsets of the StepPlan `sp`) on `comm`'s ranks, with the mode's `.grad` writer `grads`
        and, in params mode, its shards and their gathers (`units`: the mode's plan of them; the
        combine's plan's slots per rank fix the gathers' turns)."""
        gathers = mode.gathers(units, comm, timeout, contract, module, params, layout, sp.plan)
        ctx = cls(comm, timeout, contract, module, params, layout, mode, {}, grads, gathers)
        if mode.shards_grads:
            clip_guard.hold(params, ctx)  # torch's own clipping would clip nothing here: refused by name
        return ctx

    @property
    def partition(self) -> str:
        """The mode's name; fixed for the life of the DataParallel."""
        return self.mode.name

    def refuse_change(self, value: object) -> NoReturn:
        """A mode change on a live DataParallel (`torch-partition-change`)."""
        raise Refusal(
            "torch-partition-change",
            f"partition is {self.mode.name!r} for the life of this DataParallel (asked {value!r}); "
            "save, build a new DataParallel with the other partition, and restore into it",
        )

    def optimizer(self, cls: type, groups, kw: dict):
        """DataParallel.optimizer: the mode builds it (collective where it shards)."""
        return self.mode.optimizer(self, cls, groups, kw)

    def clip_grad_norm_(self, max_norm: float):
        """DataParallel.clip_grad_norm_ in this mode (partition_modes: what `.grad` a rank holds
        decides how the norm is computed)."""
        return self.mode.clip(self, max_norm)

    def memory(self, grads, combine, accumulation, optimizer=None) -> dict:
        """DataParallel.memory (the mode's count, alpha_mpi.torch.memory's kinds), with the
        optimizer's binding if sharded."""
        binding = self.bindings.get(id(optimizer))
        if self.gathers is not None:  # the shard, not whole parameters; nothing assembled after
            base = self.mode.memory(self.params, self.module, grads, combine, accumulation, optimizer, None)
            return self.gathers.shards.memory(base)
        return self.mode.memory(self.params, self.module, grads, combine, accumulation, optimizer, binding)

    def free(self) -> None:
        """Free the sharded optimizers' (and the shard clipping's) requests and give their tags
        back (local)."""
        for binding in self.bindings.values():
            binding.free()
        if self.grads is not None:
            self.grads.free()
        if self.gathers is not None:
            self.gathers.remove()
            self.gathers.shards.free()
        if self.mode.shards_grads:
            clip_guard.release(self.params, self)
