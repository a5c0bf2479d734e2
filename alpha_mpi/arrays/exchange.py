"""The summary exchange, run by the one engine (the schedule is planning/array_program.py's).

Protocol, per call, on every rank of the communicator (every call is collective):

1. The rank evaluates the summary of its own block in the C kernel, straight into the payload
   of its round-0 frame, and writes its coverage row (offset, len, n, status). A rank that
   refused its own inputs runs the exchange on an empty summary, its frames flagged with its
   rank and code (the engine's local refusal), so no peer waits and every rank names it.
2. The exchange is a Program (planning/array_program.py: per round a rows copy, the send, the
   bounded wait, a rows copy and a merge of the received summary with ours) that the engine
   runs with its frames, tags, header checks and failure path: a bad frame is refused on the
   rank that finds it and flagged onwards (`peer-refused` elsewhere), the next call works; a
   timeout breaks the channel (`combiner-broken` until `reset` on every rank).
3. After the last round every rank holds every row: `check_rows` refuses by name on every rank
   alike, or the final state is the root node [0, n) and its values are the result.

Each (operation, batch size, order) has its own Program, built once per communicator and
cached, and its own Engine on the communicator's endpoint (execution/endpoint.py), all on the
endpoint's "arrays" stream: one tag block for every exchange of the array reductions. N-d tiles
(alpha_mpi.arrays.tiles) run the same Program with longer rows (TILES: the tile's shape, offset,
extent and summary record count) and a capacity that the tiling calls for, each (operation,
batch size, capacity) its own exchange.

Agreement. Every other executor ends its build in an agreement round (the endpoint's build
agreement). The exchanges cannot: they are built lazily, per (operation, batch, order), without
any communication, so that ranks calling different operations meet in the frames and are named
there instead of hanging; a round at each lazy build would pair one rank's build of `dot` with
another's of `norm2` (or wait for a build that never comes). So the agreement is held once,
where every rank is known to take part: the arrays stream's creation (the first array reduction
on the communicator), on the payload check (which must be equal on every rank). The exchanges
then share the stream's sequence and tag block, and each exchange's identity (operation, batch,
order, p) travels in every frame header: a frame of another exchange is refused by name
(`frame-identity-mismatch`) and, since every exchange pairs its frames one to one, the next
call works. Every receive is size-safe (the engine's W: matched and size-compared before it is
received).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..execution.endpoint import Endpoint
from ..execution.engine import Engine
from ..execution.log import debug_enabled
from ..kernel import ffi, lib
from ..planning.array_program import (
    FINAL,
    GEOMETRY,
    HEAD_WORDS,
    LENGTH,
    TABLE,
    frame_buffer,
    lower_summary_exchange,
    schedule,
)
from ..refusals import PlanRefusal, Refusal
from . import pairwise, tiles

__all__ = ["Exchanges", "Exchange", "RowKind", "BLOCKS", "TILES", "block_need"]

if (
    lib.AP_CAPACITY != pairwise.CAPACITY
    or lib.AP_MAX_K != pairwise.MAX_BATCH
    or lib.AP_MAX_NDIM != tiles.MAX_NDIM
):  # pragma: no cover - a stale build
    raise ImportError(
        "alpha_mpi.kernel._alpha_kernel is older than alpha_mpi/arrays (rebuild: pip install -e .)"
    )

_FALLBACK_EDGES = 64  # rounds of the second exchange (blocks out of rank order) start here
_FINAL = struct.Struct("<4q")  # record count, flags, lo and hi of the first record


@dataclass(frozen=True)
class RowKind:
    """What an exchange's coverage rows hold: `words` int64 words per rank, read by `parse`
    (rank, words) into a pairwise.Row (1-D blocks) or a tiles.Tile (N-d tiles)."""

    name: str
    words: int
    parse: Callable


BLOCKS = RowKind("blocks", pairwise.ROW_WORDS, pairwise.Row.from_words)
TILES = RowKind("tiles", tiles.ROW_WORDS, tiles.Tile.from_words)


STREAM = "arrays"


class Exchanges:
    """alpha_mpi.arrays' state on one user communicator: its endpoint stream (one agreed
    sequence and tag block), its step counter, its wait bound and its exchanges. Made by the
    first array reduction on that communicator (collective then: the stream's agreement, and
    the endpoint's one duplicate if this is the communicator's first use); exchanges are built
    later without any communication, so ranks that call different operations still meet in
    the frames."""

    def __init__(self, comm, drop=None):
        self.user = comm
        self.endpoint = ep = Endpoint.of(comm)
        # the one agreement of the arrays on this communicator; `drop`: what a reset that drops
        # the stream makes the caller forget (api.py: this channel)
        self.stream = ep.stream(STREAM, drop=drop)
        self.comm = self.stream.seat.wire
        self.size, self.rank = ep.size, ep.rank
        self.step = 0
        self.broken = None
        self.exchanges: dict = {}
        self.capacity = tiles.Capacity()  # the tile exchanges' (the same on every rank)
        self.block_capacity = tiles.Capacity()  # the 1-D blocks' exchanges'
        self.geometries: dict = {}  # checked tile geometries (tile_call.Geometry), by their key
        self.debug = debug_enabled()
        self.timeout = ep.waiter().timeout  # the bound (ALPHA_MPI_TIMEOUT, else the default)
        self.call_timeout = self.timeout

    def exchange(self, op: str, k: int, order=None, capacity: int | None = None) -> Exchange:
        """The 1-D blocks' exchange of (op, k) in rank order or in `order`, with frames of
        `capacity` records (by default the channel's current block capacity)."""
        if capacity is None:
            capacity = self.block_capacity.current
        key = (op, k, order, capacity)
        ex = self.exchanges.get(key)
        if ex is None:
            ex = self.exchanges[key] = Exchange(self, op, k, order, BLOCKS, capacity)
        return ex

    def tile_exchange(self, op: str, k: int, capacity: int) -> Exchange:
        """The N-d tiles' exchange of (op, k) with frames of `capacity` records (rank order)."""
        key = (op, k, TILES.name, capacity)
        ex = self.exchanges.get(key)
        if ex is None:
            ex = self.exchanges[key] = Exchange(self, op, k, None, TILES, capacity)
        return ex

    def free(self) -> None:
        """Free the persistent requests and drop the stream: the next reduction agrees a new one
        with a fresh tag block (this one's is never handed out again: a stale frame may still
        arrive there). Local."""
        for ex in self.exchanges.values():
            ex.free()
        self.exchanges.clear()
        self.endpoint.streams.pop(STREAM, None)
        self.broken = "reset"


class Exchange:
    """The Engine of one (operation, batch size, order, rows, capacity) and int64 views of its
    buffers."""

    def __init__(
        self,
        ch: Exchanges,
        op: str,
        k: int,
        order=None,
        kind: RowKind = BLOCKS,
        capacity: int = pairwise.CAPACITY,
    ):
        p, me = ch.size, ch.rank
        self.ch, self.op, self.k, self.kind, self.capacity = ch, op, k, kind, capacity
        self.order = tuple(range(p)) if order is None else tuple(order)
        schedule(p, me, self.order)  # refuses an order that is not a permutation
        order_name = "rank" if order is None else ",".join(map(str, self.order))
        identity = f"alpha_mpi.arrays:{op}:k={k}:p={p}:capacity={capacity}:order={order_name}"
        program = lower_summary_exchange(
            p,
            self.order,
            k=k,
            capacity=capacity,
            row_words=kind.words,
            topology="pairwise-array",
            tree_order_id=f"pairwise-array:{op}:k={k}",
            identity=identity if kind is BLOCKS else f"{identity}:rows={kind.name}",
            edge0=0 if order is None else _FALLBACK_EDGES,
            pairs=op != "sum",
            tiles=kind is TILES,
        )
        self.engine = Engine(ch.user, program, seat=ch.stream.seat, what="array exchange")
        self.prepared = self.engine.prepare()  # every run of the exchange goes through it
        self.rounds = self.engine.rp.merges
        bufs = self.engine.bufs

        def words(name):
            return bufs[name].view(np.int64)

        self.table = words(TABLE).reshape(p, kind.words)  # row j: rank order[v + j]
        self.final = words(FINAL)
        self.fmv = memoryview(self.final).cast("B")
        self.length = words(LENGTH)
        if self.rounds:
            first = words(frame_buffer(0, False))
            self.head = first[:HEAD_WORDS]
            self.local_words = first[HEAD_WORDS + kind.words :]  # round 0 carries one row: ours
        else:
            self.head = self.final[:HEAD_WORDS]
            self.local_words = self.final[HEAD_WORDS:]
        self.state0 = ffi.from_buffer("int64_t[]", self.local_words, True)  # where ap_summary writes
        self.values = struct.Struct(f"<{k}d")  # the root's values, after its lo and hi
        self.valid = None  # the table bytes that last passed every check
        self.valid_order = None  # with them: None (rank order) or the sorted exchange order
        # The program's root check (an R op, planning/array_program.py) compares the table with
        # `valid_words` (word 0: 1 while `valid` may be used as it is, then the table's words)
        # and writes its verdict and the root's values; the summary op its record count and
        # non-finite flag: views of the engine's buffer.
        root, summary = self.engine.rp.roots[0], self.engine.rp.summaries[0]
        checks = words(root.verdict.buf)
        self.valid_words = checks[root.valid.offset : root.valid.offset + root.valid.count]
        # (cdata: indexing it gives a Python int)
        self.verdict = ffi.from_buffer("int64_t[]", checks[root.verdict.offset : root.verdict.offset + 1])
        self.geometry = None  # the geometry words bound to the prepared run (run_bound)
        self.summary_result = checks[summary.result.offset : summary.result.offset + 2]
        # the root's values as a cdata array: indexing it gives Python floats
        self.root_values = ffi.from_buffer(
            "double[]", bufs[root.values.buf][root.values.offset : root.values.offset + k]
        )
        self.valid_need = 0  # with them (tiles): the records the largest state may hold
        self.xs_ptrs = ffi.new("double *[]", k)  # kernel arguments, set per call
        self.ys_ptrs = ffi.new("double *[]", k)
        self.scratch = ffi.new("double *[]", 2 * k) if kind is TILES else ffi.NULL  # ap_summary_tile's
        self.nonfinite = ffi.new("int32_t *")
        self.room = ffi.new("int64_t *")  # ap_summary_tile's records held at most

    @property
    def flags(self) -> int:
        """The merged state's flags word (pairwise.FLAG_OVERFLOW, FLAG_INVALID)."""
        return int(self.final[1])

    def run(self, row, m: int, n: int, local: Refusal | None = None) -> None:
        """Exchange (row, the m-record local summary already in place): afterwards `table` holds
        every rank's row and `final` the merged state. Raises this rank's `local` refusal, a
        bad frame's refusal, or `peer-refused` naming another rank's, on every rank alike."""
        ch = self.ch
        self.table[0] = row
        self.length[0] = n
        self.head[0], self.head[1] = m, 0
        self.prepared.bind(GEOMETRY, None)  # the summary is written: the A op does nothing
        self.geometry = None
        try:
            # one step count per channel: every frame of a call names the call
            self.prepared.run_checked(
                None if local is not None else {}, refused=local, timeout=ch.call_timeout, step=ch.step
            )
        finally:
            if self.engine.broken is not None:
                ch.broken = self.engine.broken

    def run_bound(self, step: int, geometry) -> int:
        """One run at frame step `step` with the blocks bound to the prepared run (fast.py) and
        the `geometry` words (fast.Call.words) bound here: the summary, the exchange and the
        root check in the one C call. 0: the run ended (`verdict[0]` 0: the root's values are
        in `root_values`; 1: the caller checks the table); abi.STOP: the summary stopped it
        before anything was sent."""
        if self.geometry is not geometry:
            self.prepared.bind(GEOMETRY, geometry)
            self.geometry = geometry
        try:
            return self.prepared.run_bound(step, self.ch.timeout)
        finally:
            if self.engine.broken is not None:
                self.ch.broken = self.engine.broken

    def passed(self, tb: bytes, order, need: int) -> None:
        """The table `tb` (every rank's rows, as bytes) passed every check, calls for the
        exchange `order` (None: this one's) and its largest state holds `need` records
        (block_need): the root check may use it where this exchange is the one and its frames
        hold them."""
        self.valid, self.valid_order, self.valid_need = tb, order, need
        w = self.valid_words
        w[0] = 0
        if order is None and need <= self.capacity:
            w[1:] = np.frombuffer(tb, dtype=np.int64)
            w[0] = 1

    def passed_tiles(self, tb: bytes, need: int) -> None:
        """The tile table `tb` passed every check, and its largest state holds `need` records:
        the root check may use it where this exchange's frames hold them."""
        self.valid, self.valid_need = tb, need
        w = self.valid_words
        w[0] = 0
        if need <= self.capacity:
            w[1:] = np.frombuffer(tb, dtype=np.int64)
            w[0] = 1

    def root(self, n: int):
        """The root's k values if `final` is exactly the root node [0, n), else None."""
        count, flags, lo, hi = _FINAL.unpack_from(self.fmv, 0)
        if flags:
            return None
        if count == 1 and lo == 0 and hi == n:
            return list(self.values.unpack_from(self.fmv, 32))
        return [0.0] * self.k if n == 0 and count == 0 else None

    def run_again(self, row, m: int, n: int, check, what: str) -> None:
        """The second exchange of a call whose rows every rank has checked already (the sorted
        order, or frames that fit): run it, and check its table where it is new to this one."""
        self.run(row, m, n)
        tb = self.table.tobytes()
        if tb != self.valid:
            check(self.rows(), what)
            self.valid = tb

    def result(self, n: int, what: str) -> list:
        """The root's values after rows that passed every check; internal-error if the merged
        state is not the root all the same (a bug, named)."""
        values = self.root(n)
        if values is None:
            raise PlanRefusal(
                "internal-error",
                f"{what}: the blocks cover the array of {n} elements but the merged summary is "
                f"{int(self.final[0])} records (flags {self.flags}), not the root",
            )
        return values

    def rows(self) -> list:
        """The table in rank order, as Rows (1-D blocks) or Tiles."""
        p, v = self.ch.size, self.order.index(self.ch.rank)
        out = [None] * p
        parse = self.kind.parse
        for j, words in enumerate(self.table.tolist()):
            r = self.order[(v + j) % p]
            out[r] = parse(r, words)
        return out

    def copy_local_from(self, other: Exchange, m: int) -> None:
        w = (2 + self.k) * m
        self.local_words[:w] = other.local_words[:w]

    def free(self) -> None:
        self.engine.free()


def block_need(rows, order) -> int:
    """Records the largest state of the 1-D exchange in `order` (None: rank order) holds for
    these rows (rank order, checked): each block's summary records and room from its place
    alone (the kernel's count, ap_tile_records of a 1-D tile: the walk ap_summary makes), the
    windows of tiles.window_need, and never more than pairwise.CAPACITY (blocks that follow
    each other in exchange order merge into at most 2 * 64 + 1 nodes: the frames' bound before
    they could shrink)."""
    records, rooms, n = [], [], 0
    g, room = ffi.new("int64_t[]", 3), ffi.new("int64_t *")
    for r in order if order is not None else range(len(rows)):
        row = rows[r]
        n = max(n, row.n)
        if not row.length:
            records.append(0)
            continue
        g[0], g[1], g[2] = row.n, row.offset, row.length
        records.append(int(lib.ap_tile_records(1, g, g + 1, g + 2, ffi.NULL, 0, room)))
        rooms.append(int(room[0]))
    return min(pairwise.CAPACITY, tiles.window_need(records, rooms, n))
