"""The summary exchange, run by the one engine (the schedule is alpha_mpi.arrays.tree's).

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

Each (operation, batch size, order) has its own Program, built once per channel and cached,
and its own Engine on the channel's communicator (alpha_mpi.arrays' own duplicate).

Agreement. Every other executor ends its build in an agreement round (execution/agreement.py).
The exchanges cannot: they are built lazily, per (operation, batch, order), without any
collective, so that ranks calling different operations meet in the frames and are named there
instead of hanging; a round at each lazy build would pair one rank's build of `dot` with
another's of `norm2` (or wait for a build that never comes). So the agreement is held once,
where every rank is known to take part: the channel's creation (collective anyway: it
duplicates the communicator), on the communicator's library channel before that Dup, on the
payload check (which must be equal on every rank). The exchanges then share the channel's
Waiter and its sequence, and each exchange's identity (operation, batch, order, p) travels in
every frame header: a frame of another exchange is refused by name (`frame-identity-mismatch`)
and, since every exchange pairs its frames one to one, the next call works. Every receive is
size-safe (the engine's W: matched and size-compared before it is received).
"""

from __future__ import annotations

import struct

import numpy as np

from ..execution import agreement
from ..execution.engine import Engine
from ..execution.engine_build import payload_check_from_env
from ..execution.transport import Waiter, debug_enabled, library_comm, next_sequence
from ..kernel import ffi, lib
from ..planning.array_program import FINAL, HEAD_WORDS, LENGTH, TABLE, frame_buffer, lower_summary_exchange
from ..refusals import Refusal
from . import tree as T

__all__ = ["Channel", "Exchange"]

if lib.AP_CAPACITY != T.CAPACITY or lib.AP_MAX_K != T.MAX_BATCH:  # pragma: no cover - a stale build
    raise ImportError(
        "alpha_mpi.kernel._alpha_kernel is older than alpha_mpi/arrays (rebuild: pip install -e .)"
    )

_FALLBACK_EDGES = 64  # rounds of the second exchange (blocks out of rank order) start here
_FINAL = struct.Struct("<4q")  # record count, flags, lo and hi of the first record


class Channel:
    """alpha_mpi.arrays' own duplicate of one user communicator, with its step counter, its
    wait policy and its exchanges. Created collectively (Dup, and the Waiter's one Split_type)
    by the first array reduction on that communicator; exchanges are built later without any
    collective, so ranks that call different operations still meet in the frames."""

    def __init__(self, comm):
        # The one agreement of the arrays on this communicator (see the module docstring): held
        # before the Dup, so a rank that differs (or never comes) is named within the bound.
        identity = f"alpha_mpi.arrays channel|{int(payload_check_from_env())}"
        self.comm = library_comm(
            agreement.agree_first(comm, identity, None, None, "arrays channel"), exclusive=False
        )
        self.sequence = next_sequence(self.comm)  # shared by every exchange of this channel
        self.size = self.comm.Get_size()
        self.rank = self.comm.Get_rank()
        self.step = 0
        self.broken = None
        self.exchanges: dict = {}
        self.debug = debug_enabled()
        self.waiter = Waiter(self.comm)  # the transport's bounded wait (ALPHA_MPI_TIMEOUT, SPIN)
        self.timeout = self.waiter.timeout
        self.call_timeout = self.timeout

    def exchange(self, op: str, k: int, order=None) -> Exchange:
        key = (op, k, order)
        ex = self.exchanges.get(key)
        if ex is None:
            ex = self.exchanges[key] = Exchange(self, op, k, order)
        return ex

    def free(self) -> None:
        """Free the persistent requests. The duplicate itself is left allocated on purpose: a
        freed handle that MPI hands out again on some ranks only must never meet a cache."""
        for ex in self.exchanges.values():
            ex.free()
        self.exchanges.clear()
        self.broken = "reset"


class Exchange:
    """The Engine of one (operation, batch size, order) and int64 views of its buffers."""

    def __init__(self, ch: Channel, op: str, k: int, order=None):
        p, me = ch.size, ch.rank
        self.ch, self.op, self.k = ch, op, k
        self.order = tuple(range(p)) if order is None else tuple(order)
        T.schedule(p, me, self.order)  # refuses an order that is not a permutation
        order_name = "rank" if order is None else ",".join(map(str, self.order))
        program = lower_summary_exchange(
            p,
            lambda r: T.schedule(p, r, self.order),
            k=k,
            capacity=T.CAPACITY,
            row_words=T.ROW_WORDS,
            topology="pairwise-array",
            tree_order_id=f"pairwise-array:{op}:k={k}",
            identity=f"alpha_mpi.arrays:{op}:k={k}:p={p}:capacity={T.CAPACITY}:order={order_name}",
            edge0=0 if order is None else _FALLBACK_EDGES,
        )
        self.engine = Engine(ch.comm, program, dup=False, waiter=ch.waiter, sequence=ch.sequence)
        self.rounds = self.engine.rp.merges
        bufs = self.engine.bufs

        def words(name):
            return bufs[name].view(np.int64)

        self.table = words(TABLE).reshape(p, T.ROW_WORDS)  # row j: rank order[v + j]
        self.final = words(FINAL)
        self.fmv = memoryview(self.final).cast("B")
        self.length = words(LENGTH)
        if self.rounds:
            first = words(frame_buffer(0, False))
            self.head = first[:HEAD_WORDS]
            self.local_words = first[HEAD_WORDS + T.ROW_WORDS :]  # round 0 carries one row: ours
        else:
            self.head = self.final[:HEAD_WORDS]
            self.local_words = self.final[HEAD_WORDS:]
        self.state0 = ffi.from_buffer("int64_t[]", self.local_words, True)  # where ap_summary writes
        self.values = struct.Struct(f"<{k}d")  # the root's values, after its lo and hi
        self.valid = None  # the table bytes that last passed every check
        self.valid_order = None  # with them: None (rank order) or the sorted exchange order
        self.xs_ptrs = ffi.new("double *[]", k)  # kernel arguments, set per call
        self.ys_ptrs = ffi.new("double *[]", k)
        self.nonfinite = ffi.new("int32_t *")

    @property
    def flags(self) -> int:
        """The merged state's flags word (tree.FLAG_OVERFLOW, FLAG_INVALID)."""
        return int(self.final[1])

    def run(self, row, m: int, n: int, local: Refusal | None = None) -> None:
        """Exchange (row, the m-record local summary already in place): afterwards `table` holds
        every rank's row and `final` the merged state. Raises this rank's `local` refusal, a
        bad frame's refusal, or `peer-refused` naming another rank's, on every rank alike."""
        ch = self.ch
        self.table[0] = row
        self.length[0] = n
        self.head[0], self.head[1] = m, 0
        eng = self.engine
        eng.step = ch.step  # one step count per channel: every frame of a call names the call
        try:
            eng.execute(None if local is not None else {}, local=local, timeout=ch.call_timeout)
        finally:
            if eng.broken is not None:
                ch.broken = eng.broken

    def root(self, n: int):
        """The root's k values if `final` is exactly the root node [0, n), else None."""
        count, flags, lo, hi = _FINAL.unpack_from(self.fmv, 0)
        if flags:
            return None
        if count == 1 and lo == 0 and hi == n:
            return list(self.values.unpack_from(self.fmv, 32))
        return [0.0] * self.k if n == 0 and count == 0 else None

    def rows(self) -> list:
        """The table in rank order, as Rows."""
        p, v = self.ch.size, self.order.index(self.ch.rank)
        out = [None] * p
        for j, (off, ln, n, st) in enumerate(self.table.tolist()):
            r = self.order[(v + j) % p]
            out[r] = T.Row(r, off, ln, n, st)
        return out

    def copy_local_from(self, other: Exchange, m: int) -> None:
        w = (2 + self.k) * m
        self.local_words[:w] = other.local_words[:w]

    def free(self) -> None:
        self.engine.free()
