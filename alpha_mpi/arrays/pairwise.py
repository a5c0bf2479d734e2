"""The pairwise tree over global indices, the summary exchange's frames and its verdicts (pure).

Nothing here needs MPI, numpy or the kernel. The exchange's schedule and Program are
planning's (planning/array_program.py: every rank computes them from the communicator size
alone), and `simulate` runs that Program in planning's one simulator (planning/check.py).

The tree (written down once, in csrc/kernel/pairwise.h): node [lo, hi) splits at
lo + 2^floor(log2(hi - lo - 1)); the root is [0, n). A rank's block [offset, offset + len)
becomes a *summary*: the maximal nodes inside the block, each with its value. Summaries of
adjacent blocks merge by joining sibling nodes, so any way of cutting [0, n) into blocks ends
in the same root value, bit for bit.

The exchange is a dissemination allgather over ranks (Bruck's index rotation): in round i
(d = 2^i) rank r sends its merged state to r - d and receives from r + d (mod p). After round i
rank r holds the coverage rows of ranks r .. r + min(2^(i+1), p) - 1 and the merged summary of
their blocks; after ceil(log2 p) rounds every rank holds every row and the root. Any p, one
send and one receive per round. Where p is not a power of two the last round brings some
blocks twice; merging a node with itself keeps it once, so that is harmless. A frame carries
a fixed number of rows (the new ones only) and a fixed summary capacity, so every receive has
one exact size that depends on p, the round and the batch size only, never on the data.

Capacity: the blocks of ranks r .. r + g - 1 (mod p) form at most two runs of [0, n) when the
non-empty blocks are in rank order, and two runs have at most 2 * 64 + 1 maximal nodes. When
they are not in rank order, the coverage rows (which every rank has after the first exchange)
say so on every rank alike, and every rank then runs a second exchange over the ranks sorted
by offset (`sorted_order`), which again has at most two runs per window.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ..planning.array_program import HEAD_WORDS, exchange_order, lower_summary_exchange, rows_in_round
from ..planning.check import check
from ..refusals import PlanRefusal, Refusal

__all__ = [
    "CAPACITY",
    "MAX_BATCH",
    "Row",
    "split",
    "is_node",
    "blocks",
    "merge_ranges",
    "summary_ranges",
    "frame_words",
    "exchange_program",
    "simulate",
    "check_rows",
    "check_refused",
    "check_finite",
    "check_naming",
    "check_result",
    "refused_status",
    "batch_refusal",
    "in_rank_order",
    "sorted_order",
]

CAPACITY = 132  # records per summary; csrc/kernel/pairwise.h AP_CAPACITY (checked when the kernel loads)
ROW_WORDS = 4  # a coverage row: offset, len, n, status (int64 each)
MAX_BATCH = 4096  # csrc/kernel/pairwise.h AP_MAX_K

# Row status. A rank that refuses its own inputs still takes part in the exchange with a
# refused row, so that no peer waits for it and every rank can name it.
STATUS_OK = 0
STATUS_NONFINITE = 1  # a NaN or Inf among this rank's inputs
STATUS_REFUSED = 16  # + index in LOCAL_CODES: the rank refused its inputs with that code
LOCAL_CODES = ("dtype-invalid", "array-block-invalid", "array-batch-invalid", "kernel-bad-argument", "usage")

# Payload flags word (OR-ed along the exchange).
FLAG_OVERFLOW = 1  # a merge had more nodes than CAPACITY (possible only out of rank order)
FLAG_INVALID = 2  # a merge met partially overlapping nodes (overlapping blocks, another n)


# ----------------------------------------------------------------------------- the tree


def split(lo: int, hi: int) -> int:
    """Where the node [lo, hi) (hi - lo >= 2) splits: lo + the largest power of two < size."""
    return lo + (1 << ((hi - lo - 1).bit_length() - 1))


def is_node(lo: int, hi: int, n: int) -> bool:
    """[lo, hi) is a node of the tree over [0, n)."""
    if not 0 <= lo < hi <= n:
        return False
    size = hi - lo
    p = 1 << (size - 1).bit_length()  # the smallest power of two >= size
    return lo % p == 0 and (size == p or hi == n)


def blocks(offset: int, length: int, n: int) -> list:
    """The maximal complete aligned blocks inside [offset, offset + length), left to right
    (what the C kernel evaluates before merging siblings)."""
    out, pos, end = [], offset, offset + length
    while pos < end:
        size = (pos & -pos) if pos else 1 << (end.bit_length() - 1)
        while size > end - pos:
            size >>= 1
        out.append((pos, pos + size))
        pos += size
    return out


def merge_ranges(ranges, n: int) -> list:
    """Node ranges after joining adjacent siblings (the shape of ap_merge's result)."""
    out: list = []
    for lo, hi in sorted(ranges, key=lambda r: (r[0], -r[1])):
        if out and lo < out[-1][1]:
            if hi <= out[-1][1]:
                continue
            raise PlanRefusal("plan-simulation-failed", f"nodes {out[-1]} and {(lo, hi)} overlap partially")
        out.append((lo, hi))
        while (
            len(out) >= 2
            and out[-2][1] == out[-1][0]
            and is_node(out[-2][0], out[-1][1], n)
            and split(out[-2][0], out[-1][1]) == out[-2][1]
        ):
            out[-2:] = [(out[-2][0], out[-1][1])]
    return out


def summary_ranges(offset: int, length: int, n: int) -> list:
    """The node ranges of a block's summary (each one a node; at most 2 * 63 + 1)."""
    return merge_ranges(blocks(offset, length, n), n)


# ----------------------------------------------------------------------------- the exchange
# Its schedule (rounds, rows per round, who sends to whom) and its Program are planning's
# (planning/array_program.py); planning.check simulates it like every program.


def frame_words(size: int, index: int, k: int) -> int:
    """Payload length (8-byte words) of a round-`index` frame for batches of k values."""
    return HEAD_WORDS + ROW_WORDS * rows_in_round(size, index) + CAPACITY * (2 + k)


def exchange_program(size: int, order: Iterable[int] | None = None, k: int = 1):
    """The Program of one sum's summary exchange (batch size k) on `size` ranks in exchange
    `order` (default rank order), as alpha_mpi.arrays runs it (named for a dry run)."""
    return lower_summary_exchange(
        size,
        order,
        k=k,
        capacity=CAPACITY,
        row_words=ROW_WORDS,
        topology="pairwise-array",
        tree_order_id=f"pairwise-array:sum:k={k}",
        identity=f"alpha_mpi.arrays:dry-run:k={k}:p={size}",
    )


def simulate(size: int, order: Iterable[int] | None = None) -> list[list[int]]:
    """Run the exchange's Program on every rank symbolically (planning.check, the one simulator:
    every send meets its receive, no rank waits forever, every rank ends with every rank's row
    exactly once and the merge of every rank's block). Returns, per rank, the ranks its rows
    came from in row order (row j = order[v + j]). Raises plan-simulation-failed otherwise,
    rank-order-invalid for an order that is not a permutation of the ranks."""
    order = exchange_order(size, order)
    check(exchange_program(size, order))
    return [[order[(order.index(r) + j) % size] for j in range(size)] for r in range(size)]


# ----------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class Row:
    """What one rank declared: its block [offset, offset + length) of [0, n), and a status."""

    rank: int
    offset: int
    length: int
    n: int
    status: int

    @classmethod
    def from_words(cls, rank: int, w) -> Row:
        """The row of ROW_WORDS int64 words (offset, length, n, status)."""
        return cls(rank, int(w[0]), int(w[1]), int(w[2]), int(w[3]))


def refused_status(code: str) -> int:
    """The row status of a rank that refused its own inputs with `code`."""
    return STATUS_REFUSED + (LOCAL_CODES.index(code) if code in LOCAL_CODES else len(LOCAL_CODES))


def batch_refusal(pairs) -> Refusal:
    """array-batch-invalid for what dots() was given instead of 1..MAX_BATCH pairs."""
    return Refusal(
        "array-batch-invalid",
        f"dots: expected a list of 1..{MAX_BATCH} (x, y) pairs, got {type(pairs).__name__} {pairs!r:.60}",
    )


def check_result(values, what: str) -> None:
    """non-finite-combined when a value of the root is NaN or Inf (every input was finite, or
    check_finite would have refused: a product or a partial sum overflowed)."""
    for v in values:
        if not math.isfinite(v):
            raise Refusal(
                "non-finite-combined",
                f"{what}: the result is {v} although every input is finite "
                "(a product or a partial sum overflowed); nothing was reduced",
            )


def status_code(status: int) -> str:
    i = status - STATUS_REFUSED
    return LOCAL_CODES[i] if 0 <= i < len(LOCAL_CODES) else "unknown-code"


def check_refused(rows, what: str) -> None:
    """peer-refused naming every rank whose row says it refused its inputs (rows: anything with
    .rank and .status, tree.Row or tiles.Tile)."""
    refused = [r for r in rows if r.status >= STATUS_REFUSED]
    if refused:  # the engine's flags name a refusing rank first; this is the rows' own account
        names = ", ".join(f"rank {r.rank} [{status_code(r.status)}]" for r in refused)
        raise Refusal(
            "peer-refused",
            f"{what}: {names} refused its inputs, so nothing was reduced",
            peer=refused[0].rank,
            peer_code=status_code(refused[0].status),
            ranks=[r.rank for r in refused],
        )


def check_naming(check, rows, what: str, rank: int, detail: str) -> None:
    """check(rows, what) (check_rows or tiles.check_tiles); a non-finite-contribution refusal
    names, on the rank that holds it, the first NaN/Inf (`detail`)."""
    try:
        check(rows, what)
    except Refusal as e:
        if e.code == "non-finite-contribution" and detail:
            raise Refusal(
                e.code, f"{what}: this rank ({rank}) holds {detail}; {e.message}", **e.context
            ) from None
        raise


def check_finite(rows, what: str) -> None:
    """non-finite-contribution naming the ranks whose rows say they hold NaN or Inf."""
    bad = [r.rank for r in rows if r.status == STATUS_NONFINITE]
    if bad:
        raise Refusal(
            "non-finite-contribution",
            f"{what}: the blocks of ranks {bad} hold NaN or Inf; nothing was reduced (FiniteOrRefuse)",
            ranks=bad,
        )


def check_rows(rows, what: str) -> None:
    """Refuse, by name, anything that stops the rows from describing one reduction: a rank that
    refused its inputs (peer-refused), ranks that disagree on n (array-length-mismatch), holes and overlaps (array-coverage-hole,
    array-coverage-overlap), NaN/Inf inputs (non-finite-contribution). Every rank calls this
    on the same rows, so every rank raises the same refusal. `rows` are in rank order."""
    check_refused(rows, what)
    ns = sorted({r.n for r in rows})
    if len(ns) > 1:
        says = "; ".join(f"n = {v} on ranks {[r.rank for r in rows if r.n == v]}" for v in ns)
        raise Refusal(
            "array-length-mismatch", f"{what}: the ranks disagree on the global length ({says})", lengths=ns
        )
    n = ns[0] if ns else 0
    pos, owner = 0, None
    for r in sorted((r for r in rows if r.length), key=lambda r: (r.offset, r.rank)):
        if r.offset > pos:
            raise Refusal(
                "array-coverage-hole",
                f"{what}: no rank holds [{pos}, {r.offset}) of [0, {n}) "
                f"(expected a block starting at {pos}; the next one, rank {r.rank}'s, starts at {r.offset})",
                hole=(pos, r.offset),
            )
        if r.offset < pos:
            raise Refusal(
                "array-coverage-overlap",
                f"{what}: ranks {owner} and {r.rank} both hold "
                f"[{r.offset}, {min(pos, r.offset + r.length)}) of [0, {n})",
                ranks=(owner, r.rank),
                overlap=(r.offset, min(pos, r.offset + r.length)),
            )
        pos, owner = r.offset + r.length, r.rank
    if pos < n:
        raise Refusal("array-coverage-hole", f"{what}: no rank holds [{pos}, {n}) of [0, {n})", hole=(pos, n))
    check_finite(rows, what)


def in_rank_order(rows) -> bool:
    """The non-empty blocks come in rank order (one exchange suffices)."""
    offsets = [r.offset for r in rows if r.length]
    return all(a < b for a, b in zip(offsets, offsets[1:]))


def sorted_order(rows) -> tuple:
    """An exchange order with the non-empty blocks in index order (empty blocks last)."""
    return tuple(r.rank for r in sorted(rows, key=lambda r: (r.length == 0, r.offset, r.rank)))
