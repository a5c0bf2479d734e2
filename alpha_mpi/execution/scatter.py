"""Run a ScatterPlan (planning/scatter_plan.py) over an mpi4py communicator (layer 4).

Every rank builds a ScatterCombiner for the same plan (collectively: it duplicates the
communicator unless told not to). Each planned frame gets a persistent request at construction;
frames of one (phase, peer) channel rotate through `depth` reused buffers, so a large vector
streams through a few cache-resident buffers: pack a segment of the contributions, transfer,
evaluate the whole tree over the segment (one fused kernel pass, straight into `out`), copy it
into the gather frames, transfer. A gather frame lands in place in `out` whenever 16 coordinates
of its own chunk precede it: its 128-byte header then sits on them for the time of the receive
(they are saved and put back), so the frame is still one contiguous header + payload buffer and
no unpacking copy is needed. One event loop per run advances whatever is ready and never blocks
on one request, so no order of arrival can deadlock; every wait is bounded (`peer-timeout`).

Why not zero-copy everywhere: every message is a header followed by its payload (DESIGN.md
"Frames"), and a contribution belongs to the caller (never written), so the scatter phase packs
each piece into a frame (one copy); the reduced segment is copied into its gather frame (one
copy). MPICH's derived datatypes (header + user buffer in one message) were measured slower
than the copies (they pack internally).

Matching: frames of one channel use one tag (scatter shares the tree realization's reduce tag,
gather its deliver tag; see transport.TAG) and are sent and their receives started in segment
order, so MPI's non-overtaking rule pairs them exactly. Every header is checked before the
payload is used; a frame of another size (a peer running another plan or realization) is refused
by name, `frame-identity-mismatch` when its header names another plan of the same order.

FiniteOrRefuse, as in the Combiner: each chunk owner checks its reduced segments and flags the
gather frames; every rank that the result (or, in reduce-scatter mode, the header-only flag
frame) reaches refuses `non-finite-contribution` (it holds the bad slot) or `non-finite-combined`
after communication has completed, so no rank is left waiting and none applies a partial update.
On such a refusal the contents of `out` are unspecified.
"""

from __future__ import annotations

import sys
import time
import zlib

import numpy as np
from mpi4py import MPI

from .. import kernel
from ..planning.scatter_plan import ReduceScatter, ScatterPlan, plan_scatter
from ..refusals import FrameRefusal, KernelRefusal, PeerTimeout, PlanRefusal, Refusal
from .combiner import (
    _CRC_OFF, _FLAGS_OFF, _KERNEL_TREE_EVAL, _STEP_OFF, _U32, _U64, Idle, _template, polls_before_yield, spin_from_env,
)
from .contributions import check_contributions, refuse_nonfinite
from .frames import FLAG_NONFINITE, HEADER, MAGIC, FrameSpec, short_digest
from .transport import TAG, cancel_all, debug_enabled, library_comm, log, timeout_from_env

# Buffers per channel: frame j reuses the buffer of frame j - DEPTH once that one completed.
DEFAULT_DEPTH = 3
# An idle event loop polls, then yields the core between polls (from the first empty poll when
# the node runs more ranks than cores), then (after 5 ms) sleeps: see combiner.Idle.
# ALPHA_MPI_SPIN=1 never yields or sleeps: for benchmarks on dedicated cores only.

_CLEAN_REFUSALS = frozenset(
    ("contribution-missing", "contribution-unexpected", "contribution-shape", "dtype-invalid",
     "non-finite-contribution", "non-finite-combined", "executor-reentrant", "combiner-broken",
     "kernel-bad-argument")
)


class _Frame:
    """One planned frame at this rank: spec, its ring buffer views, persistent request."""

    __slots__ = ("f", "spec", "buf", "payload", "pieces", "req", "status", "flags", "mv", "tmpl", "nbytes",
                 "payptr", "pptrs", "fast")

    def write(self, step: int, flags: int) -> None:
        """The header: the frame's template (step 0, no flags), then step, flags and CRC."""
        if self.spec is not self.fast:  # a replaced spec writes itself
            self.spec.write(self.buf, step, flags)
            return
        mv = self.mv
        mv[:_CRC_OFF] = self.tmpl
        _U64.pack_into(mv, _STEP_OFF, step)
        mv[_FLAGS_OFF] = flags
        _U32.pack_into(mv, _CRC_OFF, zlib.crc32(mv[:_CRC_OFF]))

    def check(self, step: int, nbytes: int, buf=None) -> int:
        """Flags of a received frame (in its ring buffer, or in `buf` where it was received in
        place); FrameSpec.check names any difference from the plan."""
        if buf is None:
            buf = self.buf
        if nbytes == self.nbytes and self.spec is self.fast:
            h = buf[:_CRC_OFF].tobytes()
            e = self.tmpl
            if (h[:_FLAGS_OFF] == e[:_FLAGS_OFF] and h[_FLAGS_OFF + 1:_STEP_OFF] == e[_FLAGS_OFF + 1:_STEP_OFF]
                    and h[_STEP_OFF + 8:] == e[_STEP_OFF + 8:] and _U64.unpack_from(h, _STEP_OFF)[0] == step
                    and _U32.unpack_from(buf, _CRC_OFF)[0] == zlib.crc32(h)):
                return h[_FLAGS_OFF]
        return self.spec.check(buf, step, nbytes)


class _Channel:
    """The frames of one (phase, direction, peer), in segment order."""

    __slots__ = ("phase", "peer", "frames", "nxt", "done", "posted", "send", "base", "direct_req", "direct_buf",
                 "saved", "saved_ptr", "status")

    def __init__(self, phase, peer, frames, send):
        self.phase, self.peer, self.frames, self.send = phase, peer, frames, send
        self.nxt = self.done = self.posted = 0
        self.direct_req = self.direct_buf = None


class ScatterCombiner:
    """Executes one ScatterPlan repeatedly on one communicator. Build it on every rank of `comm`."""

    def __init__(self, comm, splan: ScatterPlan, *, timeout=None, contract: str = "", dup: bool = True, depth: int | None = None):
        size = comm.Get_size()
        if not isinstance(splan, ScatterPlan):
            raise PlanRefusal("plan-rank-mismatch", f"ScatterCombiner runs a ScatterPlan (plan_scatter), got {type(splan).__name__}")
        if splan.size != size:
            raise PlanRefusal("plan-rank-mismatch", f"plan is for {splan.size} ranks, communicator has {size}")
        self.plan = splan
        self.comm = library_comm(comm) if dup else comm
        self.rank = rank = self.comm.Get_rank()
        self.timeout = timeout_from_env(timeout)
        self.debug = debug_enabled()
        self.spin = spin_from_env()
        self._before_yield = polls_before_yield(self.comm)
        self.step = 0
        self.broken = None
        self._busy = False
        self._in_flight = False
        self._depth = D = int(depth or DEFAULT_DEPTH)
        if D < 1:
            raise PlanRefusal("plan-rank-mismatch", f"depth must be >= 1, got {depth!r}")
        layout = splan.layout
        self.count = splan.layout.total
        self.slots = splan.owner_slots[rank]
        self.start, self.stop = splan.chunks[rank]
        self.segs = splan.segments(rank)
        self.reduce_scatter = splan.mode == "reduce-scatter"
        self.is_receiver = rank in splan.receivers

        def spec(f):
            return FrameSpec(
                phase=f.phase, edge=f.segment, sender=f.src, receiver=f.dst, count=f.count,
                topology=splan.topology, order_id=splan.order_id, identity=splan.identity,
                layout_key=f.layout_key(layout), contract=contract,
            )

        self._order16 = short_digest(splan.order_id, 16)
        self._ident16 = short_digest(splan.identity, 16)

        ffi = kernel.ffi
        self._darr = darr = ffi.typeof("double[]")

        # Channels: group the planned frames by (phase, peer), keeping the planned order.
        def channels(frames, send):
            by = {}
            for f in frames:
                key = (f.phase, f.dst if send else f.src)
                by.setdefault(key, []).append(f)
            out = {}
            for (phase, peer), fs in by.items():
                ring = [np.zeros(HEADER + max(x.nbytes for x in fs), dtype=np.uint8) for _ in range(min(D, len(fs)))]
                items = []
                for j, f in enumerate(fs):
                    x = _Frame()
                    x.f, x.spec, x.flags = f, spec(f), 0
                    x.fast, x.tmpl = x.spec, _template(x.spec)
                    x.buf = ring[j % len(ring)][: HEADER + f.nbytes]
                    x.mv, x.nbytes = memoryview(x.buf), HEADER + f.nbytes
                    x.payload = x.buf[HEADER:].view(np.float64)
                    m = f.stop - f.start
                    x.pieces = [x.payload[i * m:(i + 1) * m] for i in range(f.pieces)] if f.pieces else []
                    x.payptr = ffi.from_buffer(darr, x.payload, True)
                    x.pptrs = [x.payptr + i * m for i in range(f.pieces)]
                    tag = TAG[phase]
                    if send:
                        x.req = self.comm.Send_init(x.buf, dest=peer, tag=tag)
                        x.status = None
                    else:
                        x.req = self.comm.Recv_init(x.buf, source=peer, tag=tag)
                        x.status = MPI.Status()
                    items.append(x)
                out[(phase, peer)] = _Channel(phase, peer, items, send)
            return out

        outs = channels(splan.frames_from(rank), True)
        ins = channels(splan.frames_to(rank), False)
        self.s_out = [c for (ph, _), c in outs.items() if ph == "s"]
        self.g_out = [c for (ph, _), c in outs.items() if ph == "g"]
        self.s_in = [c for (ph, _), c in ins.items() if ph == "s"]
        self.g_in = [c for (ph, _), c in ins.items() if ph == "g"]
        self.channels = self.s_out + self.s_in + self.g_out + self.g_in
        # Gather frames received in place: frame j >= 1 of chunk c lands straight in `out` at
        # [start - 16, stop) (coordinates); its header overwrites the last 16 coordinates of
        # segment j - 1 of the same chunk, which are saved before and put back after. The frames
        # of such a channel are received one at a time, in order; a frame without 16 coordinates
        # of its own chunk before it (segment 0) goes through the ring buffer.
        self._direct = not self.reduce_scatter and self.is_receiver
        for ch in self.g_in:
            ch.base = splan.chunks[ch.peer][0]
            ch.saved = np.empty(HEADER // 8)
            ch.saved_ptr = ffi.from_buffer(darr, ch.saved, True)
            ch.status = MPI.Status()
        self._direct_pending = {}  # id -> request received in place, for cancelling on a refusal
        self._slot_index = {s: i for i, s in enumerate(self.slots)}
        # Where each leaf's piece of my chunk comes from: my own contribution, or piece i of the
        # scatter frame from channel c (the same segment index j).
        src_of = {}
        for ci, ch in enumerate(self.s_in):
            for i, s in enumerate(splan.owner_slots[ch.peer]):
                src_of[s] = (ci, i)
        maxseg = max((b - a for a, b in self.segs), default=0)
        self.scratch = {g.index: np.empty(maxseg) for g in splan.groups if g.output[0] == "group"}
        self._result_scratch = np.empty(maxseg)
        self._scratch_ptr = {gi: ffi.from_buffer(darr, a, True) for gi, a in self.scratch.items()}
        self._result_ptr = ffi.from_buffer(darr, self._result_scratch, True)
        # Per group: (index, recipe, program, program pointer, input pointer array, is_root);
        # recipe entries: (0, position of my slot) | (1, s_in channel, piece) | (2, group).
        self.groups = []
        for g in splan.groups:
            recipe = []
            for kind, v in g.inputs:
                if kind == "leaf":
                    if v in self._slot_index:
                        recipe.append((0, self._slot_index[v], v))
                    else:  # an empty chunk has no pieces (and is never evaluated)
                        recipe.append((1,) + src_of.get(v, (-1, -1)))
                else:
                    recipe.append((2, v, None))
            prog = np.asarray(g.program, dtype=np.int32)
            self.groups.append((g.index, tuple(recipe), prog, ffi.from_buffer("int32_t[]", prog),
                                ffi.new("double *[]", len(recipe)), g.output[0] == "root"))

    # ------------------------------------------------------------------------------------------
    def _payloads(self, contributions) -> dict:
        return check_contributions(contributions, self.slots, self.rank, self.count, self.plan.layout.key())

    @staticmethod
    def _out_array(out, n, what):
        if not isinstance(out, np.ndarray) or out.dtype != np.float64 or out.size != n or not out.flags.c_contiguous or not out.flags.writeable:
            raise KernelRefusal(
                "kernel-bad-argument",
                f"{what}: out must be a writeable C-contiguous float64 array of {n} elements, got "
                f"{getattr(out, 'dtype', type(out).__name__)} of {getattr(out, 'size', '?')}",
            )
        return out.reshape(-1)

    # ------------------------------------------------------------------------------------------
    def run(self, contributions, out=None):
        """Allreduce modes: the combined payload where delivery reaches this rank, else None
        (`out`, if given, is then left as it was). Reduce-scatter mode: (start, stop, chunk)."""
        if self.reduce_scatter:
            return self.reduce_scatter_run(contributions, out)
        return self._run(contributions, out)

    def reduce_scatter_run(self, contributions, out=None):
        """(start, stop, values of coordinates start..stop-1). `out`: an array of the chunk's
        length, or of the whole payload (the chunk is written at out[start:stop])."""
        if not self.reduce_scatter:
            raise PlanRefusal("plan-rank-mismatch", "this plan delivers the whole result; plan it with ReduceScatter()")
        return self._run(contributions, out)

    def _run(self, contributions, out):
        if self.broken is not None:
            raise Refusal("combiner-broken", f"an earlier run refused with [{self.broken}]")
        if self._busy:
            raise Refusal("executor-reentrant", "run() called while a run is in progress")
        self._busy = True
        try:
            leaves = self._payloads(contributions)
            L = self.stop - self.start
            if self.reduce_scatter:
                if out is None:
                    chunk = np.empty(L)
                elif isinstance(out, np.ndarray) and out.size == self.count and out.size != L:
                    chunk = self._out_array(out, self.count, "reduce_scatter")[self.start:self.stop]
                else:
                    chunk = self._out_array(out, L, "reduce_scatter")
                full, base = None, self.start
                target = chunk
            elif self.is_receiver:
                full = np.empty(self.count) if out is None else self._out_array(out, self.count, "allreduce")
                base, target = 0, full
            else:
                full, base, target = None, 0, None
            self._in_flight = True
            flags = self._exchange(leaves, full, target, base)
            self._in_flight = False
            if flags & FLAG_NONFINITE and (self.is_receiver or self.reduce_scatter or self._own_flag):
                self._refuse_nonfinite(leaves, full if full is not None else target)
            if self.reduce_scatter:
                return self.start, self.stop, chunk
            return out if (full is not None and out is not None) else full
        except Refusal as e:
            self._fail(e)
            raise
        except BaseException:
            if self._in_flight:  # a bug or an interrupt mid-exchange: frames may be in flight
                self._fail(Refusal("combiner-broken", "an exception interrupted the exchange"))
            raise
        finally:
            self.step += 1
            self._busy = False

    def _exchange(self, leaves, full, target, base) -> int:
        """One run's event loop; returns the OR of the non-finite flags this rank saw."""
        step = self.step
        D = self._depth
        self._deadline = time.monotonic() + self.timeout
        self._own_flag = False
        flags = 0
        for ch in self.channels:
            ch.nxt = ch.done = ch.posted = 0
        direct = self._direct and full is not None
        for ch in self.s_in + self.g_in:  # post the first receives, in frame order
            limit = 1 if (direct and ch.phase == "g") else D
            while ch.posted < len(ch.frames) and ch.posted < limit:
                ch.frames[ch.posted].req.Start()  # frame 0 never lands in place
                ch.posted += 1
        nseg = len(self.segs)
        evaluated = 0
        rs_flags_sent = not self.reduce_scatter
        idle = Idle(self._deadline, self.spin, self._before_yield)
        debug, rank = self.debug, self.rank
        mine = leaves
        ffi = kernel.ffi
        memmove, darr = ffi.memmove, self._darr
        lptrs = [ffi.from_buffer(darr, leaves[s]) for s in self.slots]
        tptr = ffi.from_buffer(darr, target, True) if target is not None else None
        fptr = ffi.from_buffer(darr, full, True) if full is not None else None
        fast = kernel.tree_eval is _KERNEL_TREE_EVAL
        while True:
            moved = False
            # 1. scatter sends: free completed buffers, pack and start the next frames.
            for ch in self.s_out:
                frames = ch.frames
                while ch.done < ch.nxt and frames[ch.done].req.Test():
                    ch.done += 1
                while ch.nxt < len(frames) and ch.nxt - ch.done < D:
                    x = frames[ch.nxt]
                    a = x.f.start
                    nb = 8 * (x.f.stop - a)
                    for pp, lp in zip(x.pptrs, lptrs):
                        memmove(pp, lp + a, nb)
                    x.write(step, 0)
                    x.req.Start()
                    if debug:
                        log(rank, f"send -> {ch.peer} scatter segment {x.f.segment} step {step} {x.buf.nbytes}B")
                    ch.nxt += 1
                    moved = True
            # 2. scatter receives: check headers as frames arrive (ch.nxt = checked so far).
            for ch in self.s_in:
                while ch.nxt < ch.posted:
                    x = ch.frames[ch.nxt]
                    if not self._test_recv(x, ch, step):
                        break
                    ch.nxt += 1
                    moved = True
            # 3. evaluate my chunk segment by segment once every piece has arrived and every
            #    gather channel has a free buffer.
            while evaluated < nseg:
                j = evaluated
                if any(ch.nxt <= j for ch in self.s_in):
                    break
                if not self.reduce_scatter and any(ch.nxt - ch.done >= D and not self._free_one(ch) for ch in self.g_out):
                    break
                a, b = self.segs[j]
                if fast:
                    flags |= self._evaluate_fast(j, a, b, lptrs, tptr, base)
                else:
                    flags |= self._evaluate(j, a, b, mine, target, base)
                for ch in self.s_in:  # the buffers of segment j are free: start receive j + D
                    if ch.posted < len(ch.frames):
                        ch.frames[ch.posted].req.Start()
                        ch.posted += 1
                    ch.done = j + 1
                evaluated += 1
                moved = True
            if not rs_flags_sent and evaluated == nseg:
                for ch in self.g_out:
                    x = ch.frames[0]
                    x.write(step, flags & FLAG_NONFINITE)
                    x.req.Start()
                    ch.nxt = 1
                rs_flags_sent = True
                moved = True
            # 4. gather sends complete; gather receives land in `out`.
            for ch in self.g_out:
                while ch.done < ch.nxt and ch.frames[ch.done].req.Test():
                    ch.done += 1
            for ch in self.g_in:
                while ch.nxt < ch.posted:
                    x = ch.frames[ch.nxt]
                    if ch.direct_req is not None:
                        if not self._test_direct(x, ch, step, fptr):
                            break
                    else:
                        if not self._test_recv(x, ch, step):
                            break
                        if fptr is not None and x.pieces:
                            memmove(fptr + x.f.start, x.payptr, 8 * (x.f.stop - x.f.start))
                    flags |= x.flags
                    ch.nxt += 1
                    ch.done = ch.nxt
                    if ch.posted < len(ch.frames):
                        if direct:
                            self._post_direct(ch, ch.frames[ch.posted], full, fptr)
                        else:
                            ch.frames[ch.posted].req.Start()
                        ch.posted += 1
                    moved = True
            if moved:
                if idle.polls:
                    idle.reset()
                continue
            if self._finished(evaluated, nseg, rs_flags_sent):
                return flags
            if not idle.idle():
                self._timeout(evaluated)

    def _post_direct(self, ch, x, full, fptr) -> None:
        """Receive gather frame x straight into `full` when 16 coordinates of its own chunk
        precede it (their values saved first), else into its ring buffer."""
        a = x.f.start
        if a - ch.base < HEADER // 8:
            x.req.Start()
            return
        kernel.ffi.memmove(ch.saved_ptr, fptr + (a - HEADER // 8), HEADER)
        ch.direct_buf = full.view(np.uint8)[8 * a - HEADER:8 * x.f.stop]
        ch.direct_req = self.comm.Irecv(ch.direct_buf, source=ch.peer, tag=TAG["g"])
        self._direct_pending[id(ch.direct_req)] = ch.direct_req

    def _test_direct(self, x, ch, step, fptr) -> bool:
        req, buf = ch.direct_req, ch.direct_buf
        try:
            if not req.Test(ch.status):
                return False
        except MPI.Exception as e:
            self._direct_pending.pop(id(req), None)
            ch.direct_req = None
            self._refuse_foreign(x, -1, step, f"MPI reports {e.Get_error_string().strip()} for a {x.nbytes}-byte frame", buf)
        self._direct_pending.pop(id(req), None)
        ch.direct_req = None
        nbytes = ch.status.Get_count(MPI.BYTE)
        if nbytes != x.nbytes:
            self._refuse_foreign(x, nbytes, step, f"{nbytes} bytes arrived, expected {x.nbytes}", buf)
        x.flags = x.check(step, nbytes, buf)
        # The header sat on the last coordinates of the segment before: put them back.
        kernel.ffi.memmove(fptr + (x.f.start - HEADER // 8), ch.saved_ptr, HEADER)
        if self.debug:
            log(self.rank, f"recv <- {ch.peer} gather segment {x.f.segment} step {step} {nbytes}B (in place)")
        return True

    @property
    def depth(self) -> int:
        """Buffers per channel (fixed at construction: the rings are sized by it)."""
        return self._depth

    def _free_one(self, ch) -> bool:
        if ch.frames[ch.done].req.Test():
            ch.done += 1
            return True
        return False

    def _finished(self, evaluated, nseg, rs_flags_sent) -> bool:
        if evaluated < nseg or not rs_flags_sent:
            return False
        for ch in self.s_out:
            if ch.done < len(ch.frames):
                return False
        for ch in self.g_out:
            if ch.done < len(ch.frames):
                return False
        for ch in self.g_in:
            if ch.nxt < len(ch.frames):
                return False
        return True

    def _test_recv(self, x, ch, step) -> bool:
        try:
            if not x.req.Test(x.status):
                return False
        except MPI.Exception as e:
            # A longer frame than planned truncates: the peer runs another plan or realization.
            self._refuse_foreign(x, -1, step, f"MPI reports {e.Get_error_string().strip()} for a {x.buf.nbytes}-byte frame")
        nbytes = x.status.Get_count(MPI.BYTE)
        if nbytes != x.buf.nbytes:
            self._refuse_foreign(x, nbytes, step, f"{nbytes} bytes arrived, expected {x.buf.nbytes}")
        x.flags = x.check(step, nbytes)
        if self.debug:
            log(self.rank, f"recv <- {ch.peer} {'scatter' if ch.phase == 's' else 'gather'} segment {x.f.segment} step {step} {nbytes}B")
        return True

    def _refuse_foreign(self, x, nbytes, step, what, buf=None):
        f = x.f
        where = f"{'scatter' if f.phase == 's' else 'gather'} segment {f.segment} from rank {f.src} (step {step})"
        ctx = dict(edge=f.segment, peer=f.src, step=step)
        if buf is None:
            buf = x.buf
        # The header comes first, so even a truncated frame says whose plan it belongs to
        # (offsets: magic 0..8, order id 24..40, plan identity 40..56; see frames.py).
        if (nbytes < 0 or nbytes >= HEADER) and bytes(buf[0:8]) == MAGIC and bytes(buf[24:40]) == self._order16:
            ident = bytes(buf[40:56])
            if ident != self._ident16:
                raise FrameRefusal(
                    "frame-identity-mismatch",
                    f"{where}: {what}; the frame belongs to plan {ident.hex()}, not this scatter plan "
                    f"{self._ident16.hex()} of the same order: the peer runs another realization "
                    "(tree vs scatter), delivery, segment length or rank count",
                    **ctx,
                )
        raise FrameRefusal("frame-size-mismatch", f"{where}: {what}", **ctx)

    def _evaluate(self, j, a, b, mine, target, base) -> int:
        m = b - a
        dest = None
        if target is not None:
            dest = target[a - base:b - base]
        elif self.g_out:
            dest = self.g_out[0].frames[j].payload
        else:
            dest = self._result_scratch[:m]
        s_in = self.s_in
        for gi, recipe, prog, _, _, is_root in self.groups:
            inputs = []
            for kind, u, v in recipe:
                if kind == 0:
                    inputs.append(mine[v][a:b])
                elif kind == 1:
                    inputs.append(s_in[u].frames[j].pieces[v])
                else:
                    inputs.append(self.scratch[u][:m])
            kernel.tree_eval(dest if is_root else self.scratch[gi][:m], inputs, prog)
        flag = 0
        if kernel.first_nonfinite(dest) >= 0:
            flag = FLAG_NONFINITE
            self._own_flag = True
        if not self.reduce_scatter:
            step = self.step
            for ch in self.g_out:
                x = ch.frames[j]
                if x.payload is not dest:
                    np.copyto(x.payload, dest)
                x.write(step, flag)
                x.req.Start()
                if self.debug:
                    log(self.rank, f"send -> {ch.peer} gather segment {j} step {step} {x.buf.nbytes}B")
                ch.nxt = j + 1
        return flag

    def _evaluate_fast(self, j, a, b, lptrs, tptr, base) -> int:
        """_evaluate with the kernel called directly on pointers (the same C function, the same
        checks in C); any status other than success is re-run through kernel.tree_eval, which
        names it."""
        m = b - a
        lib = kernel.lib
        if tptr is not None:
            dest = tptr + (a - base)
        elif self.g_out:
            dest = self.g_out[0].frames[j].payptr
        else:
            dest = self._result_ptr
        s_in, sp = self.s_in, self._scratch_ptr
        for gi, recipe, prog, pptr, ptrs, is_root in self.groups:
            for idx, (kind, u, v) in enumerate(recipe):
                if kind == 0:
                    ptrs[idx] = lptrs[u] + a
                elif kind == 1:
                    ptrs[idx] = s_in[u].frames[j].pptrs[v]
                else:
                    ptrs[idx] = sp[u]
            if lib.ak_tree_eval(dest if is_root else sp[gi], ptrs, len(recipe), m, pptr, len(prog)):
                raise KernelRefusal("kernel-bad-argument", "scatter: the kernel refused a segment (overlapping out and inputs?)")
        flag = 0
        if lib.ak_first_nonfinite(dest, m) >= 0:
            flag = FLAG_NONFINITE
            self._own_flag = True
        if not self.reduce_scatter:
            step = self.step
            nb = 8 * m
            memmove = kernel.ffi.memmove
            for ch in self.g_out:
                x = ch.frames[j]
                if x.payptr is not dest:
                    memmove(x.payptr, dest, nb)
                x.write(step, flag)
                x.req.Start()
                if self.debug:
                    log(self.rank, f"send -> {ch.peer} gather segment {j} step {step} {x.buf.nbytes}B")
                ch.nxt = j + 1
        return flag

    def _timeout(self, evaluated):
        step = self.step
        for ch in self.s_in:
            if ch.nxt < len(ch.frames):
                self._raise_timeout("scatter", ch.peer, ch.nxt, step)
        for ch in self.g_in:
            if ch.nxt < len(ch.frames):
                self._raise_timeout("gather", ch.peer, ch.nxt, step)
        for ch in self.s_out + self.g_out:
            if ch.done < len(ch.frames):
                raise PeerTimeout(
                    "peer-timeout",
                    f"rank {ch.peer} did not take the {'scatter' if ch.phase == 's' else 'gather'} frame for segment "
                    f"{ch.done} at step {step} within {self.timeout:g} s",
                    peer=ch.peer, edge=ch.done, step=step,
                )
        raise PeerTimeout("peer-timeout", f"step {step} did not complete within {self.timeout:g} s", step=step)

    def _raise_timeout(self, phase, peer, seg, step):
        raise PeerTimeout(
            "peer-timeout",
            f"no {phase} frame for segment {seg} from rank {peer} at step {step} within {self.timeout:g} s",
            peer=peer, edge=seg, step=step,
        )

    def _refuse_nonfinite(self, leaves, result) -> None:
        refuse_nonfinite(leaves, self.step, result)

    def _fail(self, e: Refusal) -> None:
        # Refusals raised before any request started, or after communication completed, leave
        # the channel clean and the combiner usable; anything else may leave frames in flight.
        if e.code in _CLEAN_REFUSALS and not self._in_flight:
            return
        self._in_flight = False
        self.broken = e.code
        cancel_all([x.req for ch in self.channels for x in ch.frames] + list(self._direct_pending.values()))
        self._direct_pending.clear()
        sys.stderr.write(f"r{self.rank} | scatter combine step {self.step} refused [{e.code}]: {e}\n")
        sys.stderr.flush()

    def free(self) -> None:
        for ch in self.channels:
            for x in ch.frames:
                try:
                    x.req.Free()
                except Exception:
                    pass
        self.channels, self.s_out, self.s_in, self.g_out, self.g_in = [], [], [], [], []


__all__ = ["ScatterCombiner", "ReduceScatter", "plan_scatter", "DEFAULT_DEPTH", "spin_from_env"]
