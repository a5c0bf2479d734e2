"""The tag space of one endpoint: which MPI tags the frames of each executor use (layer 4).

Tags. Executors that share `lib` must never match each other's frames, also when they run at
the same time from two threads (torch's buckets run on a worker thread). So each executor owns
a block of tags, [base, base + size): message k from one rank to another in a run uses
base + 2k (its header) and base + 2k + 1 (its payload), and base + size - 1 is its run's flag
round; size = 2 * (the Program's largest message count per pair of ranks) + 1, agreed in the
build round (the maximum over the ranks of each rank's own count). Blocks are handed out in
build order from TAG_BASE upwards — a pure function of the agreed sequence of builds, so every
rank computes the same base — and wrap to TAG_BASE once the next would pass MPI_TAG_UB (read
from the communicator: 2^29 - 1 under MPICH, 2^31 - 1 under Open MPI, as low as 32767
elsewhere). A block is never handed out while an executor holding a tag in it is alive: the
round carries each rank's free run at the allocator's position and at TAG_BASE, and a block
that fits nowhere is `tag-space-exhausted` on every rank (free executors you no longer use).
Tags below TAG_BASE are the endpoint's own: VERDICT_TAG carries its verdict rounds. The
receiver of a frame knows its size and tag from the agreement, so a receive can be posted
before the frame arrives (no probe needed where user traffic cannot reach the channel).
"""

from __future__ import annotations

from .._record import Record
from ..refusals import Refusal

_set = object.__setattr__  # Records set their fields through it (frozen: _record.py)

__all__ = ["RESET_TAG", "TAG_BASE", "VERDICT_TAG", "TagBlock", "TagSpace", "block_size"]

TAG_BASE = 100
VERDICT_TAG = 1  # the endpoint's verdict rounds (verdict.py)
RESET_TAG = 2  # a reset's markers (recovery.py)


class TagBlock(Record):
    """Tags [base, base + size): message k of a run uses base + 2k (header) and base + 2k + 1
    (payload); `flag_tag`, the block's last, the run's flag round."""

    __slots__ = ("base", "size")

    def __init__(
        self,
        base: int,
        size: int,
    ) -> None:
        _set(self, "base", base)
        _set(self, "size", size)

    @property
    def flag_tag(self) -> int:
        return self.base + self.size - 1

    @property
    def messages(self) -> int:
        """Messages per pair of ranks the block holds."""
        return (self.size - 1) // 2

    def overlaps(self, base: int, size: int) -> bool:
        return self.base < base + size and base < self.base + self.size


def block_size(messages: int) -> int:
    """Tags a block for `messages` messages per pair of ranks takes (two each, and a flag tag)."""
    return 2 * messages + 1


class TagSpace:
    """The blocks handed out on one endpoint's duplicate: the allocator's position `next`, the
    `live` blocks (base -> (TagBlock, sequence of its holder)) and MPI_TAG_UB (`ub`). Local:
    the build round (Endpoint.open_seat) carries what `offer` says and every rank `place`s
    alike from the same table."""

    __slots__ = ("ub", "next", "live", "spoiled")

    def __init__(self, ub: int) -> None:
        self.ub, self.next = ub, TAG_BASE
        self.live: dict[int, tuple[TagBlock, int]] = {}
        # bases of live blocks whose executor broke: frames of a failed run may wait there
        self.spoiled: set[int] = set()

    def free_run(self, start: int) -> int:
        """Free tags from `start` on (to MPI_TAG_UB or the first live block)."""
        end = self.ub + 1
        for b, _ in self.live.values():
            if b.base + b.size > start:
                end = min(end, max(start, b.base))
        return max(0, end - start)

    def offer(self) -> tuple[int, int, int]:
        """What this rank says in a build round: (the allocator's position, the free run there,
        the free run at TAG_BASE)."""
        return self.next, self.free_run(self.next), self.free_run(TAG_BASE)

    def place(self, size: int, words, what: str) -> TagBlock:
        """The block every rank takes, from the build round's table (`words[r]`: rank r's key
        words, then its message count, then its `offer`'s free runs at columns 5 and 6): at the
        allocator's position if it fits on every rank, else at TAG_BASE (wrapped) if it fits
        there, else tag-space-exhausted on every rank."""
        base = int(words[0, 3])
        if size <= int(words[:, 5].min()):
            return TagBlock(base, size)
        if size <= int(words[:, 6].min()):
            return TagBlock(TAG_BASE, size)
        raise Refusal(
            "tag-space-exhausted",
            f"the {what} needs {size} MPI tags for its frames, and no run of {size} free tags is left below "
            f"MPI_TAG_UB = {self.ub} on every rank (executors alive on this communicator hold them); "
            "nothing was built",
            tags=size,
        )

    def hold(self, block: TagBlock, sequence: int) -> None:
        """`block` is executor `sequence`'s until released; the allocator moves past it."""
        self.live[block.base] = (block, sequence)
        self.next = block.base + block.size

    def release(self, base: int) -> None:
        self.live.pop(base, None)
        self.spoiled.discard(base)

    def spoil(self, base: int) -> None:
        """The executor holding the block at `base` broke: its run may have left frames there."""
        if base in self.live:
            self.spoiled.add(base)

    def running(self, tag: int) -> int | None:
        """The sequence of the live executor whose block holds `tag` when none of its runs
        failed (so a frame there belongs to a run in progress, never to a failed one), else
        None."""
        for base, (b, seq) in self.live.items():
            if base <= tag < base + b.size:
                return None if base in self.spoiled else seq
        return None

    def holder(self, tag: int) -> int | None:
        """The sequence of the live executor whose block holds `tag`, if any."""
        for base, (b, seq) in self.live.items():
            if base <= tag < base + b.size:
                return seq
        return None
