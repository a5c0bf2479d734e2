"""The summary exchange over an mpi4py communicator (the schedule is alpha_mpi.arrays.tree's).

Protocol, per call, on every rank of the communicator (every call is collective):

1. The rank evaluates the summary of its own block in the C kernel, straight into the payload
   of its round-0 frame, and writes its coverage row (offset, len, n, status). A rank that
   refused its own inputs sends an empty summary and a refused row instead, so no peer waits.
2. Round i = 0 .. ceil(log2 p) - 1: start the send of the state to `send_to`; wait (bounded)
   for the frame from `recv_from`; check its header byte for byte against the expected one;
   copy its rows into the table and merge its summary with ours (C) into the next round's
   frame. A frame that fails its check marks the rows it would have brought as broken and the
   exchange goes on, so every rank finishes and every rank can name the failure.
3. After the last round every rank holds every row: `check_rows` refuses by name on every rank
   alike, or the state is the root node [0, n) and its values are the result.

Frames: one contiguous buffer each, the 128-byte identity-checked header of
alpha_mpi.execution.frames, then the payload: record count, flags, the round's rows, and a
summary of fixed capacity. Sizes depend on p, the round and the batch size only. Persistent
requests (Send_init/Recv_init) are made once per (communicator, operation, batch size, order);
the receives of all rounds are started together at the beginning of a call.
"""

from __future__ import annotations

import struct
import sys

import numpy as np
from mpi4py import MPI

from ..execution.frames import HEADER, FrameSpec, frame_buffer, patch, payload
from ..execution.transport import Waiter, debug_enabled, library_comm, log, mark_broken
from ..kernel import ffi, lib
from ..refusals import FrameRefusal
from . import tree as T

__all__ = ["Channel", "Exchange"]

if lib.AP_CAPACITY != T.CAPACITY or lib.AP_MAX_K != T.MAX_BATCH:  # pragma: no cover - a stale build
    raise ImportError(
        "alpha_mpi.kernel._alpha_kernel is older than alpha_mpi/arrays (rebuild: pip install -e .)"
    )

# The channel is alpha_mpi.arrays' own duplicate of the user's communicator, so no other frame
# (user, combiner, assembly) can ever match this tag; frames of one call are told apart by source
# and by the round index in their header.
_TAG = 21
_FALLBACK_EDGES = 64  # rounds of the second exchange (blocks out of rank order) start here
_W_ROWS = T.HEAD_WORDS
_ROW = struct.Struct("<4q")  # offset, len, n, status
_HEAD = struct.Struct("<2q")  # record count, flags
_FINAL = struct.Struct("<4q")  # record count, flags, lo and hi of the first record
_ROW_BYTES = 8 * T.ROW_WORDS
_HEAD_BYTES = 8 * T.HEAD_WORDS


class Channel:
    """alpha_mpi.arrays' own duplicate of one user communicator, with its step counter and its
    exchanges. Created collectively (Dup) by the first array reduction on that communicator."""

    def __init__(self, comm):
        self.comm = library_comm(comm)
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
        """Free the persistent requests. The duplicate itself is left allocated on purpose:
        execution.transport caches its oversubscription answer per communicator handle, and a
        freed handle that MPI hands out again on some ranks only would skip that collective
        Split_type there and hang the others (one communicator per reset, i.e. per failure)."""
        for ex in self.exchanges.values():
            ex.free()
        self.exchanges.clear()
        self.broken = "reset"


class Exchange:
    """Buffers, frame specs and persistent requests of one (operation, batch size, order)."""

    def __init__(self, ch: Channel, op: str, k: int, order=None):
        p, me = ch.size, ch.rank
        self.ch, self.op, self.k = ch, op, k
        self.order = tuple(range(p)) if order is None else tuple(order)
        self.rounds = T.schedule(p, me, self.order)
        edge0 = 0 if order is None else _FALLBACK_EDGES
        w = 2 + k
        self.record_words = w
        order_name = "rank" if order is None else ",".join(map(str, self.order))
        names = dict(
            topology="pairwise-array",
            order_id=f"pairwise-array:{op}:k={k}",
            identity=f"alpha_mpi.arrays:{op}:k={k}:p={p}:capacity={T.CAPACITY}:order={order_name}",
        )
        keep = self._keep = []

        def i64ptr(arr):
            c = ffi.from_buffer("int64_t[]", arr, True)
            keep.append(c)
            return c

        self.table = np.zeros((p, T.ROW_WORDS), dtype=np.int64)  # row j: rank order[v + j]
        self.sbuf, self.rbuf, self.swords, self.rwords, self.srows, self.rrows = [], [], [], [], [], []
        self.rnodes, self.state, self.sspec, self.rspec = [], [], [], []
        self.sreq, self.rreq, self.smv, self.rmv, self.rstatus = [], [], [], [], []
        self.spmv, self.rpmv, self.rbytes = [], [], []
        for rd in self.rounds:
            words = T.frame_words(p, rd.index, k)
            layout = f"pairwise-array-round:{rd.index}:rows={rd.rows}:k={k}"
            ss = FrameSpec(
                phase="r",
                edge=edge0 + rd.index,
                sender=me,
                receiver=rd.send_to,
                count=words,
                layout_key=layout,
                **names,
            )
            rs = FrameSpec(
                phase="r",
                edge=edge0 + rd.index,
                sender=rd.recv_from,
                receiver=me,
                count=words,
                layout_key=layout,
                **names,
            )
            sb, rb = frame_buffer(words), frame_buffer(words)
            ss.write(sb, 0, 0)
            sw, rw = payload(sb).view(np.int64), payload(rb).view(np.int64)
            nodes = _W_ROWS + T.ROW_WORDS * rd.rows
            self.sbuf.append(sb), self.rbuf.append(rb), self.sspec.append(ss), self.rspec.append(rs)
            self.swords.append(sw), self.rwords.append(rw)
            self.srows.append(sw[_W_ROWS:nodes].reshape(rd.rows, T.ROW_WORDS))
            self.rrows.append(rw[_W_ROWS:nodes].reshape(rd.rows, T.ROW_WORDS))
            self.state.append(i64ptr(sw[nodes:]))
            self.rnodes.append(i64ptr(rw[nodes:]))
            self.smv.append(memoryview(sb)), self.rmv.append(memoryview(rb))
            self.spmv.append(memoryview(sb)[HEADER:]), self.rpmv.append(memoryview(rb)[HEADER:])
            self.rbytes.append(rb.nbytes)
            self.sreq.append(ch.comm.Send_init(sb, dest=rd.send_to, tag=_TAG))
            self.rreq.append(ch.comm.Recv_init(rb, source=rd.recv_from, tag=_TAG))
            self.rstatus.append(MPI.Status())
        self.tmv = memoryview(self.table).cast("B")
        self.final = np.zeros(T.HEAD_WORDS + T.CAPACITY * w, dtype=np.int64)
        self.fmv = memoryview(self.final).cast("B")
        self.values = struct.Struct(f"<{k}d")  # the root's values, after its lo and hi
        self.state.append(i64ptr(self.final[T.HEAD_WORDS :]))
        # Where the local summary goes (round 0's frame) and where the root ends (final).
        self.local_words = (
            self.swords[0][_W_ROWS + T.ROW_WORDS :] if self.rounds else self.final[T.HEAD_WORDS :]
        )
        self.valid = None  # the table bytes that last passed every check
        self.valid_order = None  # with them: None (rank order) or the sorted exchange order
        self.flags = 0
        self.xs_ptrs = ffi.new("double *[]", k)  # kernel arguments, set per call
        self.ys_ptrs = ffi.new("double *[]", k)
        self.nonfinite = ffi.new("int32_t *")
        self.frame_error = None

    # ------------------------------------------------------------------------------------------
    def run(self, row, m: int, n: int) -> int:
        """Exchange (row, the m-record local summary already in place); returns the record count
        of the merged state in `final` and sets `self.flags` and `self.frame_error`."""
        ch, tmv, k, cap = self.ch, self.tmv, self.k, T.CAPACITY
        step = ch.step
        _ROW.pack_into(tmv, 0, *row)
        flags = 0
        self.frame_error = None
        merge = lib.ap_merge
        rreq = self.rreq
        if len(rreq) == 1:
            rreq[0].Start()
        elif rreq:
            MPI.Prequest.Startall(rreq)
        started = 0
        try:
            for i, rd in enumerate(self.rounds):
                pmv = self.spmv[i]
                _HEAD.pack_into(pmv, 0, m, flags)
                g = _ROW_BYTES * rd.rows
                pmv[_HEAD_BYTES : _HEAD_BYTES + g] = tmv[:g]
                patch(self.smv[i], step, 0)
                self.sreq[i].Start()
                started += 1
                if ch.debug:
                    log(ch.rank, f"send -> {rd.send_to} round {i} step {step} {self.sbuf[i].nbytes}B")
                bad = self._receive(i, rd, step)
                d = _ROW_BYTES << i
                nxt = self.state[i + 1]
                if bad is None:
                    rp = self.rpmv[i]
                    rm, rflags = _HEAD.unpack_from(rp, 0)
                    tmv[d : d + g] = rp[_HEAD_BYTES : _HEAD_BYTES + g]
                    flags |= rflags & (T.FLAG_OVERFLOW | T.FLAG_INVALID)
                    m2 = (
                        merge(self.state[i], m, self.rnodes[i], rm, nxt, cap, n, k)
                        if 0 <= rm <= cap
                        else lib.AP_ERR_INVALID
                    )
                else:
                    self.frame_error = self.frame_error or bad
                    for j in range(rd.rows):
                        _ROW.pack_into(tmv, d + _ROW_BYTES * j, 0, 0, 0, T.STATUS_BROKEN)
                    m2 = merge(self.state[i], m, ffi.NULL, 0, nxt, cap, n, k)
                if m2 < 0:
                    flags |= T.FLAG_OVERFLOW if m2 == lib.AP_ERR_OVERFLOW else T.FLAG_INVALID
                    m2 = 0
                m = m2
            if started:
                wait, t = ch.waiter.wait, ch.call_timeout
                for i in range(started):
                    if not self.sreq[i].Test():
                        wait(
                            self.sreq[i],
                            None,
                            self.rounds[i].send_to,
                            f"array {self.op} send of round {i}",
                            step,
                            t,
                        )
        except BaseException as e:
            self._abandon(getattr(e, "code", type(e).__name__))
            raise
        _HEAD.pack_into(self.fmv, 0, m, flags)
        self.flags = flags
        return m

    def root(self, n: int):
        """The root's k values if `final` is exactly the root node [0, n), else None."""
        count, flags, lo, hi = _FINAL.unpack_from(self.fmv, 0)
        if flags:
            return None
        if count == 1 and lo == 0 and hi == n:
            return list(self.values.unpack_from(self.fmv, 32))
        return [0.0] * self.k if n == 0 and count == 0 else None

    def _receive(self, i, rd, step):
        """Wait (bounded) for round i's frame; None when its header is byte for byte the one due,
        else the FrameRefusal that names the difference (the exchange then goes on)."""
        req, status = self.rreq[i], self.rstatus[i]
        try:
            self.ch.waiter.wait(
                req, status, rd.recv_from, f"array {self.op} frame of round {i}", step, self.ch.call_timeout
            )
        except FrameRefusal as e:  # a longer frame than planned was truncated: another batch size
            return e
        nbytes = status.Get_count(MPI.BYTE)
        if nbytes == self.rbytes[i] and self.rspec[i].fast_check(self.rmv[i], step) == 0:
            if self.ch.debug:
                log(self.ch.rank, f"recv <- {rd.recv_from} round {i} step {step} {nbytes}B")
            return None
        try:  # FrameSpec names the first field that differs
            self.rspec[i].check(self.rbuf[i], step, nbytes)
        except FrameRefusal as e:
            if e.code == "frame-checksum" and nbytes != self.rbytes[i]:
                # A frame of another size whose header did not arrive intact (some MPIs leave a
                # truncated receive's buffer undefined): the size is what is known.
                return FrameRefusal(
                    "frame-size-mismatch",
                    f"array {self.op} round {i} from rank {rd.recv_from} (step {step}): {nbytes} bytes arrived, "
                    f"expected {self.rbytes[i]} (another batch size or decomposition)",
                    peer=rd.recv_from,
                    edge=i,
                    step=step,
                )
            return e
        return FrameRefusal(
            "frame-identity-mismatch",
            f"array {self.op} round {i} from rank {rd.recv_from} "
            f"(step {step}): the header differs from the one due (flags or reserved bytes)",
            peer=rd.recv_from,
            edge=i,
            step=step,
        )

    def _abandon(self, code) -> None:
        """After a timeout, an MPI failure or an interrupt: frames of this step may still be in
        flight, so the channel is broken (array-channel-broken) until `reset` on every rank, and
        the transport aborts the job at exit rather than hang in MPI_Finalize."""
        self.ch.broken = code
        mark_broken(self.ch.rank, str(code))
        sys.stderr.write(
            f"r{self.ch.rank} | array {self.op} step {self.ch.step} abandoned [{code}]; channel broken\n"
        )
        sys.stderr.flush()

    # ------------------------------------------------------------------------------------------
    def rows(self) -> list:
        """The table in rank order, as Rows."""
        p, v = self.ch.size, self.order.index(self.ch.rank)
        out = [None] * p
        for j, (off, ln, n, st) in enumerate(self.table.tolist()):
            r = self.order[(v + j) % p]
            out[r] = T.Row(r, off, ln, n, st)
        return out

    def copy_local_from(self, other: Exchange, m: int) -> None:
        w = self.record_words * m
        self.local_words[:w] = other.local_words[:w]

    def free(self) -> None:
        for req in self.rreq + self.sreq:
            try:
                req.Free()
            except Exception:
                pass
        self.rreq, self.sreq = [], []
