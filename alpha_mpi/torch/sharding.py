"""Where a DataParallel's training state lives on each rank: the shard layout and the partition
modes of `DataParallel(..., partition=...)`.

Every mode gives the bits of `none`: each coordinate goes through the same combine and the same
torch update; only where the optimizer state is held and updated changes.

    mode    parameters   .grad          optimizer state   after opt.step()
    none    whole        whole          whole             nothing to do
    state   whole        whole          own shard         shards assembled by selection (ZeRO-1)

`ShardLayout` (pure) cuts the flat parameter vector (the parameters end to end in
`DataParallel.params` order, as the payload lays them out) into one contiguous range per rank,
aligned to a fixed block grid (`GRID` elements): rank r holds the blocks [r·B/p, (r+1)·B/p) of
the B blocks. Where a shard begins never changes a bit (the allow-listed optimizers are
elementwise, measured: alpha_mpi.torch.shard_optimizer), so the grid is there for what is not
elementwise: a norm accumulated block by block (clipping) sees whole blocks on every rank.

The public keyword stays a string; `partition_mode(name)` reads it once (and refuses a name it
does not know, `torch-partition-unknown`). After construction nothing asks which mode runs: the
mode object builds the optimizer (`optimizer`) and says what it holds (`memory`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..refusals import Refusal

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["GRID", "Piece", "ShardLayout", "ShardContext", "PartitionMode", "partition_mode", "MODES"]

GRID = 512
"""Elements per block of the grid shards are aligned to (2 KiB of float32): small enough that a
small model still gives every rank of a few a shard, large enough that a rank's shard is a few
pieces per parameter. Fixed: a checkpoint or a norm over blocks names the same blocks on every
rank count."""

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
    """What a mode builds an optimizer from: the communicator, the peer bound, the contract's
    digest (frames name it), the module and its trainable `params` in order, the `layout`, and
    `bindings` (id(optimizer) -> its ShardedOptimizer: what checkpoints and memory() look up)."""

    comm: MPI.Comm
    timeout: float | None
    contract: str
    module: object
    params: list
    layout: ShardLayout
    bindings: dict


def _plain(ctx: ShardContext, cls, groups, kw):
    return cls(groups, **kw)


def _sharded(ctx: ShardContext, cls, groups, kw):
    from .shard_optimizer import ShardedOptimizer

    binding = ShardedOptimizer.build(ctx, cls, groups, kw)
    ctx.bindings[id(binding.optimizer)] = binding
    return binding.optimizer


@dataclass(frozen=True)
class PartitionMode:
    """One mode of the registry: its public name, whether the optimizer state is sharded, and
    how `DataParallel.optimizer` builds the optimizer (collective where it shards)."""

    name: str
    shards_state: bool
    build: Callable

    def optimizer(self, ctx: ShardContext, cls, groups, kw):
        """torch's optimizer `cls(groups, **kw)`: over the parameters (none), or over this rank's
        shard of them (alpha_mpi.torch.shard_optimizer)."""
        return self.build(ctx, cls, groups, kw)


_REGISTRY = {
    m.name: m
    for m in (
        PartitionMode("none", False, _plain),
        PartitionMode("state", True, _sharded),
    )
}

MODES = tuple(_REGISTRY)  # the public names, in the order the docs list them


def partition_mode(name: str) -> PartitionMode:
    """The mode named `name` ("none", "state"), or `torch-partition-unknown` naming the modes."""
    mode = _REGISTRY.get(name) if isinstance(name, str) else None
    if mode is None:
        raise Refusal(
            "torch-partition-unknown",
            f"DataParallel(partition={name!r}) is not a partition mode; use one of {', '.join(MODES)}",
        )
    return mode
