"""Run a Plan over an mpi4py communicator (layer 4). Thin: the plan decides, this follows.

Every rank builds a Combiner for the same plan (collectively: it duplicates the communicator).
Frame buffers and persistent requests are created once; a run starts the receives in edge order,
walks the rank's steps, and completes every send before returning, so buffers can be reused.
Protocol per run, as in planning/combine_plan.py.

FiniteOrRefuse: a non-finite contribution always makes the combined value non-finite (NaN and
Inf propagate through +), so the root checks only the result, one pass, and flags the deliver
frames. Every rank the result reaches then refuses by name, after communication has completed,
so no rank is left waiting and none applies a partial update.
"""

from __future__ import annotations

import os
import struct
import sys
import time
import zlib

import numpy as np
from mpi4py import MPI

from .. import kernel
from ..planning import Plan, plan as make_plan
from ..planning.simulate import grid
from ..refusals import FrameRefusal, PeerTimeout, PlanRefusal, Refusal
from . import frames as _frames
from .contributions import check_contributions, refuse_nonfinite
from .frames import FLAG_NONFINITE, FrameSpec, frame_buffer, payload
from .transport import TAG, cancel_all, debug_enabled, library_comm, log, timeout_from_env

# Hot path (performance only; behaviour as before). Measured at 8 B - 64 KiB on 2 ranks, the
# per-call Python work dominated a combine: kernel.tree_eval's argument checks and pointer-array
# allocation, FrameSpec.write/check re-packing all 15 header fields, dict lookups and per-call
# lists. Now: pointer arrays, program and output pointers are built once per plan (only leaf
# pointers are set per call, after _payloads validated them); a send header is written in full
# once and then only its step, flags and CRC are patched; a received header is compared bytewise
# with the expected one (every field but the flags, step patched) and handed to FrameSpec.check,
# which names the refusal, only when it differs; the steps are a prebuilt table.
_F64 = np.dtype(np.float64)
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_STEP_OFF, _FLAGS_OFF, _CRC_OFF = _frames._STEP_OFF, _frames._FLAGS_OFF, _frames._CRC_OFF
_KERNEL_TREE_EVAL = kernel.tree_eval  # if it is wrapped later (instrumentation, tests), go through it
_MISSING = object()


_CLEAN_REFUSALS = frozenset(
    ("contribution-missing", "contribution-unexpected", "contribution-shape", "dtype-invalid",
     "non-finite-contribution", "non-finite-combined", "executor-reentrant", "combiner-broken")
)


class _Recv:
    __slots__ = ("step", "spec", "buf", "payload", "req", "status", "done", "flags", "mv", "expect", "nbytes", "fast")


class _Send:
    __slots__ = ("step", "spec", "buf", "payload", "req", "mv", "fast")


def _template(spec) -> bytes:
    """The header `spec` writes at step 0 with no flags (bytes 0..99, CRC excluded)."""
    tmp = np.zeros(_frames.HEADER, dtype=np.uint8)
    spec.write(tmp, 0, 0)
    return bytes(tmp[:_CRC_OFF])


def spin_from_env() -> bool:
    """ALPHA_MPI_SPIN=1: waits never sleep (benchmarks on dedicated cores; never oversubscribed)."""
    return os.environ.get("ALPHA_MPI_SPIN", "") not in ("", "0")


class Combiner:
    """Executes one plan repeatedly on one communicator. Build it on every rank of `comm`."""

    def __init__(self, comm, plan: Plan, *, timeout=None, contract: str = "", dup: bool = True):
        size = comm.Get_size()
        if plan.size != size:
            raise PlanRefusal("plan-rank-mismatch", f"plan is for {plan.size} ranks, communicator has {size}")
        self.plan = plan
        self.comm = library_comm(comm) if dup else comm
        self.rank = rank = self.comm.Get_rank()
        self.timeout = timeout_from_env(timeout)
        self.debug = debug_enabled()
        self.step = 0
        self.broken = None
        self._busy = False
        count = plan.layout.total
        self.count = count
        self.slots = plan.slots_of(rank)
        self.is_receiver = rank in plan.receivers

        def spec(phase, edge, src, dst):
            return FrameSpec(
                phase=phase, edge=edge, sender=src, receiver=dst, count=count, topology=plan.topology,
                order_id=plan.order_id, identity=plan.identity, layout_key=plan.layout.key(), contract=contract,
            )

        self.steps = plan.rank_program(rank)
        self.recvs: dict = {}
        self.sends: dict = {}
        for s in self.steps:
            if s.kind == "R":
                r = _Recv()
                r.step, r.spec, r.buf = s, spec(s.phase, s.index, s.peer, rank), frame_buffer(count)
                r.payload, r.status, r.done, r.flags = payload(r.buf), MPI.Status(), False, 0
                self.recvs[(s.phase, s.index)] = r
            elif s.kind == "S":
                x = _Send()
                x.step, x.spec, x.buf = s, spec(s.phase, s.index, rank, s.peer), frame_buffer(count)
                x.payload = payload(x.buf)
                self.sends[(s.phase, s.index)] = x
        # Receives are started in (phase, edge) order: the order the peer sends in (see TAG).
        self.recv_order = [self.recvs[k] for k in sorted(self.recvs, key=lambda k: (k[0], k[1]))]
        for r in self.recv_order:
            r.req = self.comm.Recv_init(r.buf, source=r.step.peer, tag=TAG[r.step.phase])
        for x in self.sends.values():
            x.req = self.comm.Send_init(x.buf, dest=x.step.peer, tag=TAG[x.step.phase])

        # Where each local group writes: an outgoing frame's payload, a scratch buffer or the result.
        self.result = np.zeros(count) if rank == plan.root_rank else None
        self.group_out = {}
        self.scratch = {}
        self.ops = []
        for s in self.steps:
            if s.kind != "E":
                self.ops.append(s)
                continue
            g = plan.groups[s.index]
            kind, v = g.output
            if kind == "edge":
                self.group_out[g.index] = self.sends[("r", v)].payload
            elif kind == "group":
                self.scratch[g.index] = self.group_out[g.index] = np.zeros(count)
            else:
                self.group_out[g.index] = self.result
            self.ops.append(s)
        self.programs = {
            g.index: np.asarray(g.program, dtype=np.int32) for g in plan.groups if g.rank == rank
        }
        self._build_hot_path()

    def _build_hot_path(self) -> None:
        ffi, lib = kernel.ffi, kernel.lib
        self.spin = spin_from_env()
        self._before_yield = polls_before_yield(self.comm)
        self._recv_reqs = [r.req for r in self.recv_order]
        for r in self.recvs.values():
            r.mv = memoryview(r.buf)
            r.expect = _template(r.spec)
            r.fast = r.spec  # a replaced spec is always asked (FrameSpec.check)
            r.nbytes = r.buf.nbytes
        for x in self.sends.values():
            x.mv = memoryview(x.buf)
            x.fast = x.spec  # the spec whose header is in the buffer; a replaced spec writes itself
            x.spec.write(x.buf, 0, 0)
        keep = self._keep = []  # cdata buffers that must outlive the pointer arrays
        self._darr = darr = ffi.typeof("double[]")

        def ptr(arr):
            c = ffi.from_buffer(darr, arr, True)
            keep.append(c)
            return c

        # One entry per op (same index as self.ops, for the error grid):
        #   (0, group, out, out_ptr, prog, prog_ptr, ptrs, leaf_positions, inputs_template, is_root,
        #    reduce receives it consumes)
        #   (1, recv) deliver receive      (2, send, is_deliver)      (3,) reduce receive (no-op)
        self._table = []
        for s in self.ops:
            if s.kind == "E":
                g = self.plan.groups[s.index]
                prog = self.programs[g.index]
                out = self.group_out[g.index]
                k = len(g.inputs)
                ptrs = ffi.new("double *[]", k)
                keep.append(ptrs)
                leaf_pos, template = [], []
                for j, (kind, v) in enumerate(g.inputs):
                    if kind == "leaf":
                        leaf_pos.append((j, v))
                        template.append(None)
                    else:
                        arr = self.recvs[("r", v)].payload if kind == "edge" else self.scratch[v]
                        ptrs[j] = ptr(arr)
                        template.append(arr)
                edges = [self.recvs[("r", v)] for kind, v in g.inputs if kind == "edge"]
                self._table.append((0, g, out, ptr(out), prog, ffi.from_buffer("int32_t[]", prog), ptrs,
                                    tuple(leaf_pos), template, g.output[0] == "root", edges))
            elif s.kind == "R":
                self._table.append((1, self.recvs[(s.phase, s.index)]) if s.phase == "d" else (3,))
            else:
                self._table.append((2, self.sends[(s.phase, s.index)], s.phase == "d"))
        self._result_ptr = ptr(self.result) if self.result is not None else None
        self._lib = lib

    # ------------------------------------------------------------------------------------------
    def _payloads(self, contributions) -> dict:
        # Fast path: exactly this rank's slots, each a 1-D (or reshapeable) contiguous float64
        # array of the layout's size. Anything else takes the checked path below.
        if type(contributions) is dict and len(contributions) == len(self.slots):
            out = {}
            count = self.count
            for slot in self.slots:
                v = contributions.get(slot, _MISSING)
                if type(v) is np.ndarray and v.dtype == _F64 and v.size == count and v.flags.c_contiguous:
                    out[slot] = v if v.ndim == 1 else v.reshape(-1)
                else:
                    break
            else:
                return out
        return self._payloads_checked(contributions)

    def _payloads_checked(self, contributions) -> dict:
        return check_contributions(contributions, self.slots, self.rank, self.count, self.plan.layout.key())

    def _wait(self, r: _Recv) -> None:
        if r.done:
            return
        s = r.step
        try:
            if not r.req.Test(r.status):
                what = (s.peer, s.index, {"r": "reduce", "d": "deliver"}[s.phase], self.step, self.timeout)
                wait_request(r.req, r.status, self._deadline, what, self.spin, self._before_yield)
        except MPI.Exception as e:
            # A longer message than planned truncates: the peer runs another layout or plan.
            raise FrameRefusal(
                "frame-size-mismatch",
                f"{s.phase} edge {s.index} from rank {s.peer} (step {self.step}): MPI reports "
                f"{e.Get_error_string().strip()} for a {r.buf.nbytes}-byte frame",
                peer=s.peer, edge=s.index, step=self.step,
            )
        nbytes = r.status.Get_count(MPI.BYTE)
        flags = _fast_check(r, self.step, nbytes) if r.spec is r.fast else -1
        r.flags = r.spec.check(r.buf, self.step, nbytes) if flags < 0 else flags
        r.done = True
        if self.debug:
            log(self.rank, f"recv <- {s.peer} edge {s.index} step {self.step} {r.buf.nbytes}B")

    def _start_send(self, x: _Send, flags: int) -> None:
        if x.spec is x.fast:  # the header is in the buffer: patch step, flags and CRC
            buf = x.buf
            _U64.pack_into(buf, _STEP_OFF, self.step)
            buf[_FLAGS_OFF] = flags
            _U32.pack_into(buf, _CRC_OFF, zlib.crc32(x.mv[:_CRC_OFF]))
        else:
            x.spec.write(x.buf, self.step, flags)
        x.req.Start()
        if self.debug:
            s = x.step
            log(self.rank, f"send -> {s.peer} edge {s.index} step {self.step} {x.buf.nbytes}B")

    def run(self, contributions, out=None):
        """Combine this rank's contributions; return the result where delivery reaches, else None."""
        if self.broken is not None:
            raise Refusal("combiner-broken", f"an earlier run refused with [{self.broken}]")
        if self._busy:
            raise Refusal("executor-reentrant", "run() called while a run is in progress")
        self._busy = True
        pc = 0
        try:
            leaves = self._payloads(contributions)
            self._deadline = time.monotonic() + self.timeout
            for r in self.recv_order:
                r.done = False
            if self._recv_reqs:
                MPI.Prequest.Startall(self._recv_reqs)
            started = []
            flags = 0
            holder = self.result
            fast = kernel.tree_eval is _KERNEL_TREE_EVAL
            lib, darr, from_buffer = self._lib, self._darr, kernel.ffi.from_buffer
            n = self.count
            for pc, op in enumerate(self._table):
                kind = op[0]
                if kind == 0:
                    _, g, gout, optr, prog, pptr, ptrs, leaf_pos, template, is_root, edges = op
                    for r in edges:
                        self._wait(r)
                    if fast:
                        held = [from_buffer(darr, leaves[slot]) for j, slot in leaf_pos]
                        for (j, _), c in zip(leaf_pos, held):
                            ptrs[j] = c
                        if lib.ak_tree_eval(optr, ptrs, len(template), n, pptr, len(prog)):
                            fast = False  # let the checked call name the problem
                    if not fast:
                        inputs = list(template)
                        for j, slot in leaf_pos:
                            inputs[j] = leaves[slot]
                        kernel.tree_eval(gout, inputs, prog)
                    if is_root and (lib.ak_first_nonfinite(self._result_ptr, n) >= 0 if fast
                                    else kernel.first_nonfinite(self.result) >= 0):
                        flags |= FLAG_NONFINITE
                elif kind == 1:
                    r = op[1]
                    self._wait(r)
                    flags |= r.flags
                    holder = r.payload
                elif kind == 2:
                    x = op[1]
                    if op[2]:
                        np.copyto(x.payload, holder)
                    self._start_send(x, flags if op[2] else 0)
                    started.append(x)
            pc = len(self.ops)
            for x in started:
                if not x.req.Test():
                    wait_request(x.req, None, self._deadline, (x.step.peer, x.step.index, "send", self.step, self.timeout),
                                 self.spin, self._before_yield)
            if flags & FLAG_NONFINITE and (self.is_receiver or self.rank == self.plan.root_rank):
                self._refuse_nonfinite(leaves)
            if not self.is_receiver:
                return None
            if out is None:
                out = np.empty(n)
            np.copyto(out if out.ndim == 1 else out.reshape(-1), holder)
            return out
        except Refusal as e:
            self._fail(e, pc)
            raise
        finally:
            self.step += 1
            self._busy = False

    def _refuse_nonfinite(self, leaves) -> None:
        refuse_nonfinite(leaves, self.step)

    def _fail(self, e: Refusal, pc: int) -> None:
        # Refusals raised before any request started, or after communication completed, leave
        # the channel clean and the combiner usable; anything else may leave frames in flight.
        if e.code in _CLEAN_REFUSALS:
            return
        self.broken = e.code
        cancel_all([r.req for r in self.recv_order] + [x.req for x in self.sends.values()])
        pcs = [None] * self.plan.size
        pcs[self.rank] = pc
        at = self.ops[pc] if pc < len(self.ops) else "end"
        sys.stderr.write(
            f"r{self.rank} | combine step {self.step} refused [{e.code}] at {at}\n"
            + grid(self.plan.programs, pcs, self.rank) + "\n"
        )
        sys.stderr.flush()

    def free(self) -> None:
        for req in [r.req for r in self.recv_order] + [x.req for x in self.sends.values()]:
            try:
                req.Free()
            except Exception:
                pass
        self.recv_order, self.sends = [], {}


def _fast_check(r: _Recv, step: int, nbytes: int) -> int:
    """The frame's flags if its header is byte for byte the expected one (step patched, flags
    free); -1 otherwise, and FrameSpec.check then names what differs."""
    if nbytes != r.nbytes:
        return -1
    h = r.mv[:_CRC_OFF].tobytes()
    e = r.expect
    if (h[:_FLAGS_OFF] != e[:_FLAGS_OFF] or h[_FLAGS_OFF + 1:_STEP_OFF] != e[_FLAGS_OFF + 1:_STEP_OFF]
            or h[_STEP_OFF + 8:] != e[_STEP_OFF + 8:] or _U64.unpack_from(h, _STEP_OFF)[0] != step
            or _U32.unpack_from(r.mv, _CRC_OFF)[0] != zlib.crc32(h)):
        return -1
    return h[_FLAGS_OFF]


# Waiting (replaces transport.wait_one on the hot path; the same bound and the same refusal):
# poll, then yield the core between polls (sched_yield returns at once on a dedicated core and
# lets an oversubscribed peer run, without the 50-100 us timer slack of a sleep), and only after
# SLEEP_AFTER seconds of waiting back off with sleeps up to 1 ms (a slow or dead peer must not
# cost a core). With more ranks on the node than cores, yield from the first empty poll: the
# peer being waited for is then often not running (measured at p = 4 on 2 cores: 8 B combines
# 2x faster for the tree, 8x for scatter). ALPHA_MPI_SPIN=1 never yields or sleeps (benchmarks
# on dedicated cores).
POLLS_BEFORE_YIELD = 200
SLEEP_AFTER = 0.005
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))


class Idle:
    """The idle policy of one wait: call `idle()` after each poll that found nothing."""

    __slots__ = ("polls", "sleep_from", "pause", "deadline", "spin", "before_yield")

    def __init__(self, deadline: float, spin: bool, before_yield: int = POLLS_BEFORE_YIELD):
        self.polls, self.sleep_from, self.pause, self.deadline, self.spin = 0, None, 5e-5, deadline, spin
        self.before_yield = before_yield

    def reset(self) -> None:
        self.polls, self.sleep_from, self.pause = 0, None, 5e-5

    def idle(self) -> bool:
        """False once the deadline has passed."""
        self.polls += 1
        if self.polls < self.before_yield:
            return True
        if self.spin:
            return (self.polls & 4095) or time.monotonic() <= self.deadline
        now = time.monotonic()
        if now > self.deadline:
            return False
        if self.sleep_from is None:
            self.sleep_from = now + SLEEP_AFTER
        if now < self.sleep_from:
            _yield()
        else:
            time.sleep(self.pause)
            self.pause = min(self.pause * 2, 1e-3)
        return True


_OVERSUBSCRIBED: dict = {}


def polls_before_yield(comm) -> int:
    """1 when this node runs more ranks of `comm` than it has cores, else POLLS_BEFORE_YIELD.
    Collective over `comm` (a communicator-management call, no data) the first time per comm."""
    key = comm.py2f()
    v = _OVERSUBSCRIBED.get(key)
    if v is None:
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        try:
            v = local.Get_size() > (os.cpu_count() or 1)
        finally:
            local.Free()
        _OVERSUBSCRIBED[key] = v
    return 1 if v else POLLS_BEFORE_YIELD


def wait_request(req, status, deadline: float, what, spin: bool = False, before_yield: int = POLLS_BEFORE_YIELD) -> None:
    """Complete `req` or raise peer-timeout at `deadline` (what = peer, edge, phase, step, timeout)."""
    if req.Test(status):
        return
    idle = Idle(deadline, spin, before_yield)
    while not req.Test(status):
        if not idle.idle():
            peer, edge, phase, step, timeout = what
            raise PeerTimeout(
                "peer-timeout",
                f"no {phase} frame for edge {edge} from rank {peer} at step {step} within {timeout:g} s",
                peer=peer, edge=edge, step=step,
            )


_CACHE: dict = {}
_COMMS: dict = {}


def _cached_comm(comm):
    key = comm.py2f()
    c = _COMMS.get(key)
    if c is None:
        c = _COMMS[key] = library_comm(comm)
    return c


def combine(comm, tree, contributions, delivery=None, *, layout=None, out=None, timeout=None):
    """Combine `contributions` (slot -> float64 array, or (numerator, mass) tuple) by `tree`.

    `tree` may be a Plan (no re-planning in loops). Returns the combined payload where delivery
    reaches this rank, else None (that rank's values are left as they were).
    """
    if isinstance(tree, Plan):
        pl = tree
    else:
        if layout is None:
            layout = _infer_layout(contributions)
        pl = make_plan(tree, delivery, layout, size=comm.Get_size())
    key = (comm.py2f(), pl.identity)
    c = _CACHE.get(key)
    if c is None or c.broken is not None:
        c = _CACHE[key] = Combiner(_cached_comm(comm), pl, timeout=timeout, dup=False)
    return c.run(contributions, out=out)


def _infer_layout(contributions):
    from ..model import Layout

    for value in contributions.values():
        if isinstance(value, tuple):
            return Layout(*[(n, int(np.size(v))) for n, v in zip(("numerator", "mass"), value)])
        return Layout.vector(int(np.size(value)))
    raise Refusal(
        "contribution-missing",
        "this rank passed no contributions, so the payload size is unknown; pass layout= (every rank the same)",
    )
