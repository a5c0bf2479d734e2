"""Where a sharded DataParallel's state lives on each rank: the shard layout (pure) and what a
partition mode builds from (`ShardContext`); the modes themselves are partition_modes.py's.

`ShardLayout` (pure) cuts the flat parameter vector (the parameters end to end in
`DataParallel.params` order, as the payload lays them out) into one contiguous range per rank,
aligned to a fixed block grid (`GRID` elements): rank r holds the blocks [r·B/p, (r+1)·B/p) of
the B blocks. Where a shard begins never changes a bit (the allow-listed optimizers are
elementwise, measured: alpha_mpi.torch.shard_optimizer), so the grid is there for what is not
elementwise: a norm accumulated block by block (clipping) sees whole blocks on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["GRID", "Piece", "ShardLayout", "ShardContext"]

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
