"""N-d blocks (tiles) of a C-order global array, as pure functions: their rows, the runs of
global indices they hold, the coverage verdict and the size of the exchange's frames.

A rank's tile is the box `offset[d] <= i_d < offset[d] + extent[d]` of the global array of
`shape` (C order, n = prod(shape)). Flattened, element i has the global index
sum_d i_d * G_d, G_d = prod(shape[d + 1:]), and the reductions are the 1-D ones over that
vector (alpha_mpi.arrays.pairwise): the bits depend on the data and the shape only, never on the
tiling. A tile is not one range of [0, n) but one *run* per row segment: trailing dimensions
the tile covers whole join a run (a tile of whole rows is one run), the first dimension it cuts
(`segment_dim`) ends it, and runs of one tile never meet.

Frames. A tile's summary has at least one record per run (exactly one where a run is a
complete aligned subtree, as each half-row of a 512 x 512 array split in two columns), and runs
of different tiles join only when the exchange brings them together. So the summary capacity
of an exchange is not a constant as for 1-D blocks: each rank reports its summary's record
count in its row, and `capacity_needed` bounds every state the exchange sends (the sum over
the window of ranks it covers). Ranks agree on the capacity without a collective: each call's
frames use the capacity that every rank derived from the same earlier tables (`Capacity`);
when the rows of a call show that it needs more, every rank sees that alike and runs the
exchange again with frames that fit (one more exchange, once per change of tiling).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..planning.array_program import rounds as exchange_rounds
from ..refusals import Refusal
from . import pairwise

__all__ = [
    "MAX_NDIM",
    "ROW_WORDS",
    "FLOOR",
    "Tile",
    "segment_dim",
    "runs",
    "check_tiles",
    "capacity_needed",
    "window_need",
    "bucket",
    "Capacity",
]

MAX_NDIM = 4  # csrc/kernel/pairwise.h AP_MAX_NDIM (checked when the exchange module loads)
# A row: status, records, room, ndim, then shape, offset and extent, MAX_NDIM words each.
ROW_WORDS = 4 + 3 * MAX_NDIM
# The smallest frames, in records (Capacity, for 1-D blocks and tiles alike): a solver's blocks
# or tiles of a few runs need about the final merge's prefix bound (window_need: 16 records for
# 18,432 elements). pairwise.CAPACITY's 132 records made every call's frame 3.2 KB where its
# summary filled 100 bytes, and a message of 3.2 KB took 0.9 us longer than one of 64 B between
# two ranks on shared memory (MPICH, 2-core guest): half of a 2-D tile dot's latency over
# np.dot + MPI_Allreduce.
FLOOR = 16


def _strides(shape) -> list:
    """G_d = prod(shape[d + 1:]): the global index step of dimension d."""
    g, out = 1, []
    for s in reversed(shape):
        out.append(g)
        g *= s
    return out[::-1]


@dataclass(frozen=True)
class Tile:
    """What one rank declared: its tile (offset, extent) of the global `shape`, the record count
    of its summary and the room its kernel pass needs (records held at once: a block is
    written before it joins its left sibling), and a status (pairwise.STATUS_*; a refused rank's
    row has ndim 0)."""

    rank: int
    status: int
    records: int
    room: int
    shape: tuple
    offset: tuple
    extent: tuple

    @property
    def n(self) -> int:
        return int(np.prod(self.shape, dtype=object)) if self.shape else 0

    @property
    def size(self) -> int:
        """Elements in the tile."""
        return int(np.prod(self.extent, dtype=object)) if self.extent else 0

    def words(self) -> list:
        """The row as ROW_WORDS int64 words."""
        d = len(self.shape)
        pad = [0] * (MAX_NDIM - d)
        return [
            self.status,
            self.records,
            self.room,
            d,
            *self.shape,
            *pad,
            *self.offset,
            *pad,
            *self.extent,
            *pad,
        ]

    @classmethod
    def from_words(cls, rank: int, w) -> Tile:
        d = int(w[3])
        if not 0 <= d <= MAX_NDIM:  # cannot come from alpha_mpi (frames are checked); named anyway
            d = 0
        m = MAX_NDIM
        return cls(
            rank,
            int(w[0]),
            int(w[1]),
            int(w[2]),
            tuple(int(v) for v in w[4 : 4 + d]),
            tuple(int(v) for v in w[4 + m : 4 + m + d]),
            tuple(int(v) for v in w[4 + 2 * m : 4 + 2 * m + d]),
        )

    @classmethod
    def refused(cls, rank: int, status: int) -> Tile:
        return cls(rank, status, 0, 0, (), (), ())


def segment_dim(shape: Sequence[int], extent: Sequence[int]) -> int:
    """The dimension whose cut ends a run: every later dimension is covered whole."""
    c = len(shape) - 1
    while c > 0 and extent[c] == shape[c]:
        c -= 1
    return c


def runs(shape: Sequence[int], offset: Sequence[int], extent: Sequence[int]) -> tuple:
    """(starts, length): the tile's runs of global indices, [start, start + length) for each
    start, ascending (an int64 array; empty for an empty tile)."""
    if not shape or 0 in extent:
        return np.zeros(0, dtype=np.int64), 0
    g = _strides(shape)
    c = segment_dim(shape, extent)
    starts = np.array([offset[c] * g[c]], dtype=np.int64)
    for d in range(c - 1, -1, -1):  # outer dimensions, innermost first, so C order comes out
        along = (offset[d] + np.arange(extent[d], dtype=np.int64)) * g[d]
        starts = (along[:, None] + starts[None, :]).ravel()
    return starts, extent[c] * g[c]


def _at(i: int, shape) -> str:
    """'global index i = (i0, i1)' of `shape`."""
    idx = np.unravel_index(i, shape) if shape else ()
    return f"global index {i} = {tuple(int(v) for v in idx)}"


def check_tiles(tiles, what: str) -> None:
    """Refuse, by name, anything that stops the tiles from describing one reduction (the N-d
    check_rows): a refused rank (peer-refused), ranks that disagree on the shape
    (array-length-mismatch), the first global index (C order) that no tile holds
    (array-coverage-hole) or that two tiles hold (array-coverage-overlap), NaN/Inf inputs
    (non-finite-contribution). Every rank calls this on the same tiles (in rank order)."""
    pairwise.check_refused(tiles, what)
    shapes = sorted({t.shape for t in tiles})
    if len(shapes) > 1:
        says = "; ".join(f"{s} on ranks {[t.rank for t in tiles if t.shape == s]}" for s in shapes)
        raise Refusal(
            "array-length-mismatch",
            f"{what}: the ranks disagree on the global shape ({says})",
            shapes=shapes,
        )
    shape = shapes[0]
    n = tiles[0].n
    parts = [(runs(t.shape, t.offset, t.extent), t.rank) for t in tiles if t.size]
    if parts:
        starts = np.concatenate([s for (s, _), _ in parts])
        ends = np.concatenate([s + ln for (s, ln), _ in parts])
        owner = np.concatenate([np.full(s.size, r) for (s, _), r in parts])
        order = np.lexsort((owner, starts))
        starts, ends, owner = starts[order], ends[order], owner[order]
        # held[i]: where the runs before run i end (they tile [0, held[i]) if nothing is wrong)
        held = np.concatenate([[0], np.maximum.accumulate(ends)[:-1]])
        bad = np.flatnonzero(starts != held)
        if bad.size:
            i = int(bad[0])
            s, h = int(starts[i]), int(held[i])
            if s > h:
                raise Refusal(
                    "array-coverage-hole",
                    f"{what}: no rank holds {_at(h, shape)} of shape {shape} (the first such index in C "
                    f"order; the next tile's run, rank {int(owner[i])}'s, starts at {s})",
                    hole=h,
                )
            raise Refusal(
                "array-coverage-overlap",
                f"{what}: ranks {int(owner[i - 1])} and {int(owner[i])} both hold {_at(s, shape)} "
                f"of shape {shape} (the first such index in C order)",
                ranks=(int(owner[i - 1]), int(owner[i])),
                overlap=s,
            )
        end = int(ends.max())
    else:
        end = 0
    if end < n:
        raise Refusal(
            "array-coverage-hole",
            f"{what}: no rank holds {_at(end, shape)} of shape {shape} (the first such index in C order)",
            hole=end,
        )
    pairwise.check_finite(tiles, what)


def capacity_needed(tiles: Sequence[Tile], size: int) -> int:
    """Records the largest state of the tile exchange (rank order) can hold, from every rank's
    row (window_need)."""
    p = len(tiles)
    if p != size or p == 0:
        raise ValueError("one tile per rank")
    return window_need([t.records for t in tiles], [t.room for t in tiles], max(t.n for t in tiles))


def window_need(records: Sequence[int], rooms: Sequence[int], n: int) -> int:
    """Records the largest state of an exchange can hold, from each exchange position's summary
    record count and room (in exchange order) and the global length n: a position's own summary
    needs its room; a state sent in round i covers 2^i consecutive positions (mod p,
    planning.array_program.schedule), holds at most the sum of their summaries' records (each
    node of the union holds one of theirs at least) and a merge never holds more than its two
    inputs, so the largest window of 2^(R-1) positions bounds every frame (R rounds). The final
    merge of blocks that cover the array holds the root, and on the way the nodes of a prefix
    [0, x) that wait for their right sibling: at most one a level, n.bit_length() + 1 in all
    (frames of FLOOR records are sized by that bound, not by the 2 * 64 + 1 of
    pairwise.CAPACITY)."""
    p = len(records)
    rounds = exchange_rounds(p)
    window = 1 if rounds == 0 else 1 << (rounds - 1)
    twice = list(records) * 2
    s = sum(twice[:window])
    best = s
    for v in range(1, p):
        s += twice[v + window - 1] - twice[v - 1]
        best = max(best, s)
    final = n.bit_length() + 1 if rounds else 0
    return max(best, final, max(rooms, default=0))


def bucket(need: int) -> int:
    """The capacity that serves `need` records: at least FLOOR, rounded up to 1/16 of its power
    of two (frames at most ~6 % larger than needed, and few distinct exchanges)."""
    if need <= FLOOR:
        return FLOOR
    step = 1 << max(0, need.bit_length() - 5)
    return -(-need // step) * step


class Capacity:
    """The frame capacity of one channel's exchanges of one row kind (its 1-D blocks' or its
    N-d tiles'), the same on every rank because it changes only with tables every rank holds
    (after a call's rows passed check_rows or check_tiles):

    - a call that needs more (`grow`) raises it at once to bucket(need): that call's rows were
      exchanged in frames too small, so every rank runs the exchange again (`current` after it);
    - calls that need at most half of it lower it, after SHRINK_AFTER such calls in a row, to
      the largest of their needs: a solver alternating between a big and a small tiling (two
      multigrid levels) keeps the big frames instead of exchanging twice per big call.

    It starts at pairwise.CAPACITY, what 1-D blocks in exchange order never exceed (so a first
    call of 1-D blocks or of a contiguous tile is one exchange), and a solver's steady calls
    then shrink it, to FLOOR for most: frames sized by the largest need, not by the bound of
    every block.
    """

    SHRINK_AFTER = 16

    __slots__ = ("current", "_low", "_low_calls", "steady")

    def __init__(self) -> None:
        self.current = pairwise.CAPACITY
        self._low, self._low_calls = 0, 0
        # the need whose settle changes nothing (a solver's every call): its callers skip it
        self.steady = -1

    def refused(self) -> None:
        """A call of this kind refused on this rank. A refusal may come on some ranks only (a
        header spoiled in a last receive, payload check off: docs/allreduce.md), and then the
        calls that move the others' capacity did not move this one's. Settled (`steady`: no
        change pending), it keeps its frames, so the next call works where every rank was;
        otherwise it starts over at pairwise.CAPACITY with no count: a rank whose frames then
        differ meets a frame refusal and starts over too, so the ranks meet again within two
        calls instead of refusing every later call."""
        if self.steady == -1:
            self.current = pairwise.CAPACITY
        self._low, self._low_calls, self.steady = 0, 0, -1

    def settle(self, need: int) -> bool:
        """Account for one call that needed `need` records; True if its frames were too small
        (then `current` now fits it and the exchange is run again). A call whose need is
        `steady` changes nothing here."""
        want = bucket(need)
        self.steady = -1
        if want > self.current:
            self.current, self._low, self._low_calls = want, 0, 0
            return True
        if 2 * want <= self.current:
            self._low, self._low_calls = max(self._low, want), self._low_calls + 1
            if self._low_calls >= self.SHRINK_AFTER:
                self.current, self._low, self._low_calls = self._low, 0, 0
        else:
            self._low, self._low_calls = 0, 0
            self.steady = need  # the same need again: this branch again, with nothing to reset
        return False
