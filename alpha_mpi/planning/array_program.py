"""The array reductions' summary exchange lowered to the one program format (pure).

alpha_mpi.arrays (arrays/pairwise.py) fixes the exchange: a dissemination allgather (Bruck) in
which rank r, in round i, sends its merged state to one rank and receives another's. Here that
schedule becomes a Program the one engine runs, so the arrays have the engine's frames, tags,
bounded waits and failure path. Buffers of every rank (int64 words; the engine's buffers are
8-byte words whatever they hold):

    w0        the coverage table: one row (offset, len, n, status) per rank, row j = the rank
              j places after this one in exchange order; row 0 is written by the caller
    w1        the final state: head (record count, flags) + `capacity` records
    w2        one word: the global length n (written per call, read by the merges)
    w3 + 2i   round i's outgoing frame: head, the rows the receiver lacks, the state
    w4 + 2i   round i's incoming frame (same layout)

Round i: copy the first `rows` table rows into the outgoing frame (C), send it (S), wait for
the incoming one (W), copy its rows into the table at row 2^i (C), and merge its state with
ours into the next round's outgoing frame, or into w1 after the last round (M). The caller
writes its own summary into round 0's frame (w1 when p = 1) before the run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from ..model.layout import Layout
from .builder import RankBuilder
from .program import Merge, Message, Op, Program, RankProgram, Region

TABLE, FINAL, LENGTH = "w0", "w1", "w2"
HEAD_WORDS = 2  # record count, flags


def frame_buffer(i: int, incoming: bool) -> str:
    """The name of round i's outgoing (or incoming) frame buffer."""
    return f"w{3 + 2 * i + (1 if incoming else 0)}"


def lower_summary_exchange(
    size: int,
    rounds_of: Callable[[int], Sequence],
    *,
    k: int,
    capacity: int,
    row_words: int,
    topology: str,
    tree_order_id: str,
    identity: str,
    edge0: int = 0,
) -> Program:
    """The Program of one summary exchange on `size` ranks. `rounds_of(rank)`: that rank's
    rounds, each with .index, .send_to, .recv_from and .rows (arrays.pairwise.Round); the frame
    identities (`topology`, `tree_order_id`, `identity`) name the operation, batch size and order;
    the message rank s sends in round i has index (header edge) `(edge0 + i) * size + s`."""
    record = 2 + k
    state_words = HEAD_WORDS + capacity * record

    def words(rows: int) -> int:
        return HEAD_WORDS + row_words * rows + capacity * record

    def build(r: int) -> RankProgram:
        rb = RankBuilder(r, 1)
        rb.work(size * row_words)  # w0 table
        rb.work(state_words)  # w1 final state
        rb.work(1)  # w2 global length
        rounds = tuple(rounds_of(r))
        for rd in rounds:
            for _ in range(2):  # w3 + 2i, w4 + 2i
                rb.work(words(rd.rows), framed=True)
        n_word = Region(LENGTH, 0, 1)
        merges = []
        for j, rd in enumerate(rounds):
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
            mine = _state(sbuf, g, capacity, record)
            theirs = _state(rbuf, g, capacity, record)
            if j + 1 < len(rounds):
                nxt = _state(frame_buffer(j + 1, False), row_words * rounds[j + 1].rows, capacity, record)
            else:
                nxt = _state(FINAL, 0, capacity, record)
            merges.append(Merge(mine, theirs, nxt, n_word, k, capacity))
            rb.logical.append((Op("M", j), (*mine, *theirs, n_word), nxt))
        return replace(rb.build((), None), merges=tuple(merges))

    n_rounds = len(rounds_of(0))
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
        rounds=n_rounds,
        # Every exchange of a channel in rank order has one message per round per pair, whatever
        # its operation and batch size: a frame of another call pairs one to one and nothing
        # stays in flight (the engine then stays usable after naming it).
        details={"k": k, "capacity": capacity, "foreign_frames_pair": edge0 == 0},
    )


def _what(rd, k: int) -> str:
    return f"pairwise-array-round:{rd.index}:rows={rd.rows}:k={k}"


def _state(buf: str, rows_words: int, capacity: int, record: int) -> tuple:
    """(head, nodes) Regions of a state in `buf`: the head first, the rows, then the records."""
    return Region(buf, 0, HEAD_WORDS), Region(buf, HEAD_WORDS + rows_words, capacity * record)


__all__ = ["lower_summary_exchange", "frame_buffer", "TABLE", "FINAL", "LENGTH", "HEAD_WORDS"]
