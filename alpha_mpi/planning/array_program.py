"""The array reductions' summary exchange: its schedule, lowered to the one program format (pure).

The exchange is a dissemination allgather over ranks (Bruck's index rotation): in round i
(d = 2^i) the rank at position v of the exchange order sends its merged state to position
v - d and receives from v + d (mod p); after ceil(log2 p) rounds every rank holds every rank's
coverage row and the merged summary of every block (alpha_mpi.arrays.pairwise says why the
merge makes that the pairwise tree's root). `schedule(size, rank, order)` is one rank's rounds;
`lower_summary_exchange` makes the whole schedule a Program the one engine runs, so the arrays
have the engine's frames, tags, bounded waits and failure path, and planning/check.py
simulates it like every other program. Buffers of every rank (int64 words; the engine's
buffers are 8-byte words whatever they hold):

    w0        the coverage table: one row (offset, len, n, status) per rank, row j = the rank
              j places after this one in exchange order; row 0 is written by the caller
    w1        the final state: head (record count, flags) + `capacity` records
    w2        one word: the global length n (written per call, read by the merges)
    w3 + 2i   round i's outgoing frame: head, the rows the receiver lacks, the state
    w4 + 2i   round i's incoming frame (same layout)
    w3 + 2R   the root check's words (R rounds): verdict, the summary's record count and
              non-finite flag, the root's k values, then the table that passed (a usable
              word, then p rows)
    X<j> Y<j> the caller's blocks (bound per run; no Y for a sum)
    G         the caller's geometry words (bound per run; csrc/round/native.h an_summary)

First the summary (A) of the caller's blocks into round 0's frame (w1 when p = 1), this
rank's row and the length word; with no geometry bound the caller wrote them itself. Round i:
copy the first `rows` table rows into the outgoing frame (C), send it (S), wait for the
incoming one (W), copy its rows into the table at row 2^i (C), and merge its state with ours
into the next round's outgoing frame, or into w1 after the last round (M). Last the root check
(R): the root's values, or a verdict that the caller must look at the table and the state.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..model.layout import Layout
from ..refusals import PlanRefusal
from .builder import RankBuilder
from .program import Merge, Message, Op, Program, RankProgram, Region, Root, Summary

TABLE, FINAL, LENGTH = "w0", "w1", "w2"
GEOMETRY = "G"
HEAD_WORDS = 2  # a state starts with: record count, flags
VERDICT, SUMMARY_RESULT, VALUES = 0, 1, 3  # word offsets in the root check's buffer


def rounds(size: int) -> int:
    """ceil(log2 size): the number of exchange rounds for `size` ranks."""
    return (size - 1).bit_length()


def rows_in_round(size: int, index: int) -> int:
    """Coverage rows a frame of round `index` carries: the ones the receiver lacks."""
    d = 1 << index
    return min(d, size - d)


@dataclass(frozen=True)
class Round:
    """One round of one rank: send the state to `send_to`, receive `rows` rows and a summary
    from `recv_from`. String form: ``R1 >3 <0 g2`` (round 1, to rank 3, from rank 0, 2 rows)."""

    index: int
    send_to: int
    recv_from: int
    rows: int

    def __str__(self) -> str:
        return f"R{self.index} >{self.send_to} <{self.recv_from} g{self.rows}"

    @staticmethod
    def parse(text: str) -> Round:
        try:
            r, s, v, g = text.split()
            if r[0] != "R" or s[0] != ">" or v[0] != "<" or g[0] != "g":
                raise ValueError
            return Round(int(r[1:]), int(s[1:]), int(v[1:]), int(g[1:]))
        except (ValueError, IndexError):
            raise PlanRefusal(
                "step-parse-error", f"cannot read round {text!r} (expected like 'R1 >3 <0 g2')"
            ) from None


def exchange_order(size: int, order: Iterable[int] | None = None) -> tuple:
    """`order` (default: rank order) as a tuple, refused (`rank-order-invalid`) unless it is a
    permutation of the ranks 0..size-1."""
    order = tuple(range(size)) if order is None else tuple(order)
    if sorted(order) != list(range(size)):
        raise PlanRefusal("rank-order-invalid", f"order {order} is not a permutation of ranks 0..{size - 1}")
    return order


def schedule(size: int, rank: int, order: Iterable[int] | None = None) -> tuple[Round, ...]:
    """The rounds of `rank` on `size` ranks. `order` lists the ranks in exchange order (the
    default is rank order); position v sends to order[v - d] and receives from order[v + d]."""
    order = exchange_order(size, order)
    if not 0 <= rank < size:
        raise PlanRefusal("rank-order-invalid", f"rank {rank} is not one of ranks 0..{size - 1}")
    v = order.index(rank)
    return tuple(
        Round(i, order[(v - (1 << i)) % size], order[(v + (1 << i)) % size], rows_in_round(size, i))
        for i in range(rounds(size))
    )


def frame_buffer(i: int, incoming: bool) -> str:
    """The name of round i's outgoing (or incoming) frame buffer."""
    return f"w{3 + 2 * i + (1 if incoming else 0)}"


def lower_summary_exchange(
    size: int,
    order: Iterable[int] | None = None,
    *,
    k: int,
    capacity: int,
    row_words: int,
    topology: str,
    tree_order_id: str,
    identity: str,
    edge0: int = 0,
    pairs: bool = True,
    tiles: bool = False,
) -> Program:
    """The Program of one summary exchange on `size` ranks in exchange `order` (default: rank
    order; `schedule`); the frame identities (`topology`, `tree_order_id`, `identity`) name the
    operation, batch size and order; the message rank s sends in round i has index (header
    edge) `(edge0 + i) * size + s`. `pairs`: the blocks come as (x, y) pairs (dot, norm2; a
    sum has no y); `tiles`: the rows are N-d tiles' (else 1-D blocks'). Refuses an order that
    is not a permutation of the ranks."""
    order = exchange_order(size, order)
    record = 2 + k
    state_words = HEAD_WORDS + capacity * record
    xs = tuple(f"X{j}" for j in range(k))
    ys = tuple(f"Y{j}" for j in range(k)) if pairs else None

    def words(rows: int) -> int:
        return HEAD_WORDS + row_words * rows + capacity * record

    def build(r: int) -> RankProgram:
        rb = RankBuilder(r, 1)
        rb.work(size * row_words)  # w0 table
        rb.work(state_words)  # w1 final state
        rb.work(1)  # w2 global length
        own = schedule(size, r, order)
        for rd in own:
            for _ in range(2):  # w3 + 2i, w4 + 2i
                rb.work(words(rd.rows), framed=True)
        n_word = Region(LENGTH, 0, 1)
        merges = []
        for j, rd in enumerate(own):
            g = row_words * rd.rows
            sbuf, rbuf = frame_buffer(j, False), frame_buffer(j, True)
            rb.copy(Region(TABLE, 0, g), Region(sbuf, HEAD_WORDS, g))
            # message index (the header's edge): round and sender, one per message of a run
            out_msg = Message(
                (edge0 + rd.index) * size + r, "r", r, rd.send_to, 0, words(rd.rows), _what(rd, k)
            )
            in_msg = Message(
                (edge0 + rd.index) * size + rd.recv_from,
                "r",
                rd.recv_from,
                r,
                0,
                words(rd.rows),
                _what(rd, k),
            )
            rb.send(out_msg, Region(sbuf, 0, words(rd.rows)))
            rb.recv(in_msg, Region(rbuf, 0, words(rd.rows)))
            rb.copy(Region(rbuf, HEAD_WORDS, g), Region(TABLE, row_words << rd.index, g))
            mine = state_regions(sbuf, g, capacity, record)
            theirs = state_regions(rbuf, g, capacity, record)
            if j + 1 < len(own):
                nxt = state_regions(frame_buffer(j + 1, False), row_words * own[j + 1].rows, capacity, record)
            else:
                nxt = state_regions(FINAL, 0, capacity, record)
            merges.append(Merge(mine, theirs, nxt, n_word, k, capacity))
            rb.logical.append((Op("M", j), (*mine, *theirs, n_word), nxt))
        checks = rb.work(3 + k + 1 + size * row_words)  # w3 + 2R: the root check's words
        final = state_regions(FINAL, 0, capacity, record)
        root = Root(
            Region(TABLE, 0, size * row_words),
            checks.sub(VALUES + k, 1 + size * row_words),
            final,
            n_word,
            checks.sub(VALUES, k),
            checks.sub(VERDICT, 1),
            k,
        )
        rb.logical.append((Op("R", 0), (root.table, *final, n_word), (checks,)))
        row, state, length = _caller_regions(size, row_words, capacity, record, len(own))
        summary = Summary(
            xs, ys, GEOMETRY, state, row, length, checks.sub(SUMMARY_RESULT, 2), k, capacity, tiles
        )
        built = rb.build((), None)
        # The summary first, before every message op (posts included): it may stop the run,
        # and then nothing may be in flight (it touches no region a receive is posted into).
        ops = (Op("A", 0), *built.ops)
        return built.replace(
            ops=ops,
            merges=tuple(merges),
            summaries=(summary,),
            roots=(root,),
            bound=(*xs, *(ys or ()), GEOMETRY),
        )

    return Program(
        realization="arrays",
        tree=None,
        delivery=None,
        layout=Layout(("state", state_words)),
        size=size,
        coverage=None,
        topology=topology,
        tree_order_id=tree_order_id,
        layout_order_id=tree_order_id,  # an array exchange has no payload layout of its own
        identity=identity,
        receivers=frozenset(),
        builder=build,
        rounds=rounds(size),
        # Every exchange of a channel in rank order has one message per round per pair, whatever
        # its operation and batch size: a frame of another call pairs one to one and nothing
        # stays in flight (the engine then stays usable after naming it).
        details={
            "k": k,
            "capacity": capacity,
            "row_words": row_words,
            "order": list(order),
            "foreign_frames_pair": edge0 == 0,
        },
    )


def caller_writes(program: Program, rank: int) -> tuple:
    """(row, state, length): the regions the caller fills on `rank` before a run of the
    exchange `program`: its coverage row (table row 0), its own summary (a (head, nodes) pair in
    round 0's outgoing frame, or in the final state when p = 1) and the global length word."""
    d = program.details
    return _caller_regions(program.size, d["row_words"], d["capacity"], 2 + d["k"], program.rounds)


def _caller_regions(size: int, row_words: int, capacity: int, record: int, rounds_: int) -> tuple:
    if rounds_:
        state = state_regions(frame_buffer(0, False), row_words * rows_in_round(size, 0), capacity, record)
    else:
        state = state_regions(FINAL, 0, capacity, record)
    return Region(TABLE, 0, row_words), state, Region(LENGTH, 0, 1)


def final_regions(program: Program) -> tuple:
    """(table, state): where every rank holds the exchange's result after a run: the coverage
    rows of every rank (row j: the rank j places after it in exchange order) and the merged
    summary (a (head, nodes) pair)."""
    d = program.details
    table = Region(TABLE, 0, program.size * d["row_words"])
    return table, state_regions(FINAL, 0, d["capacity"], 2 + d["k"])


def _what(rd, k: int) -> str:
    return f"pairwise-array-round:{rd.index}:rows={rd.rows}:k={k}"


def state_regions(buf: str, rows_words: int, capacity: int, record: int) -> tuple:
    """(head, nodes) Regions of a state in `buf`: the head first, the rows, then the records."""
    return Region(buf, 0, HEAD_WORDS), Region(buf, HEAD_WORDS + rows_words, capacity * record)


__all__ = [
    "rounds",
    "rows_in_round",
    "Round",
    "schedule",
    "exchange_order",
    "lower_summary_exchange",
    "caller_writes",
    "final_regions",
    "state_regions",
    "frame_buffer",
    "GEOMETRY",
    "TABLE",
    "FINAL",
    "LENGTH",
    "HEAD_WORDS",
]
