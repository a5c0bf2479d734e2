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

import sys
import time

import numpy as np
from mpi4py import MPI

from .. import kernel
from ..planning import Plan, plan as make_plan
from ..planning.simulate import grid
from ..refusals import FrameRefusal, KernelRefusal, PlanRefusal, Refusal
from .frames import FLAG_NONFINITE, FrameSpec, frame_buffer, payload
from .transport import TAG, cancel_all, debug_enabled, library_comm, log, timeout_from_env, wait_one


_CLEAN_REFUSALS = frozenset(
    ("contribution-missing", "contribution-unexpected", "contribution-shape", "dtype-invalid",
     "non-finite-contribution", "non-finite-combined", "executor-reentrant", "combiner-broken")
)


class _Recv:
    __slots__ = ("step", "spec", "buf", "payload", "req", "status", "done", "flags")


class _Send:
    __slots__ = ("step", "spec", "buf", "payload", "req")


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

    # ------------------------------------------------------------------------------------------
    def _payloads(self, contributions) -> dict:
        if not isinstance(contributions, dict):
            raise Refusal("contribution-shape", "contributions must be a dict mapping slot -> payload")
        extra = sorted(set(contributions) - set(self.slots))
        if extra:
            raise Refusal("contribution-unexpected", f"rank {self.rank} passed slot(s) {extra[:8]} it does not own in the tree (it owns {list(self.slots)[:8]})")
        missing = [s for s in self.slots if s not in contributions]
        if missing:
            raise Refusal("contribution-missing", f"rank {self.rank} owns slot(s) {missing[:8]} but passed no payload for them")
        out = {}
        for slot, value in contributions.items():
            if isinstance(value, tuple):
                parts = [np.ravel(np.asarray(p, dtype=np.float64)) for p in value]
                arr = np.concatenate(parts) if len(parts) > 1 else parts[0]
            else:
                arr = value
            if not isinstance(arr, np.ndarray) or arr.dtype != np.float64:
                raise Refusal("dtype-invalid", f"slot {slot}: payload must be a float64 array, got {getattr(arr, 'dtype', type(arr))}")
            if arr.size != self.count:
                raise Refusal("contribution-shape", f"slot {slot}: {arr.size} elements, the layout {self.plan.layout.key()} needs {self.count}")
            out[slot] = np.ascontiguousarray(arr).reshape(-1)
        return out

    def _wait(self, r: _Recv) -> None:
        if r.done:
            return
        s = r.step
        try:
            wait_one(r.req, r.status, self._deadline, (s.peer, s.index, {"r": "reduce", "d": "deliver"}[s.phase], self.step, self.timeout))
        except MPI.Exception as e:
            # A longer message than planned truncates: the peer runs another layout or plan.
            raise FrameRefusal(
                "frame-size-mismatch",
                f"{s.phase} edge {s.index} from rank {s.peer} (step {self.step}): MPI reports "
                f"{e.Get_error_string().strip()} for a {r.buf.nbytes}-byte frame",
                peer=s.peer, edge=s.index, step=self.step,
            )
        r.flags = r.spec.check(r.buf, self.step, r.status.Get_count(MPI.BYTE))
        r.done = True
        if self.debug:
            log(self.rank, f"recv <- {s.peer} edge {s.index} step {self.step} {r.buf.nbytes}B")

    def _start_send(self, x: _Send, flags: int) -> None:
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
                r.req.Start()
            started = []
            flags = 0
            holder = self.result
            for pc, s in enumerate(self.ops):
                if s.kind == "E":
                    g = self.plan.groups[s.index]
                    inputs = []
                    for kind, v in g.inputs:
                        if kind == "leaf":
                            inputs.append(leaves[v])
                        elif kind == "edge":
                            r = self.recvs[("r", v)]
                            self._wait(r)
                            inputs.append(r.payload)
                        else:
                            inputs.append(self.scratch[v])
                    kernel.tree_eval(self.group_out[g.index], inputs, self.programs[g.index])
                    if g.output[0] == "root" and kernel.first_nonfinite(self.result) >= 0:
                        flags |= FLAG_NONFINITE
                elif s.kind == "R":
                    if s.phase == "r":
                        continue  # reduce frames are waited for by the group that consumes them
                    r = self.recvs[(s.phase, s.index)]
                    self._wait(r)
                    flags |= r.flags
                    holder = r.payload
                else:
                    x = self.sends[(s.phase, s.index)]
                    if s.phase == "d":
                        np.copyto(x.payload, holder)
                    self._start_send(x, flags if s.phase == "d" else 0)
                    started.append(x)
            pc = len(self.ops)
            for x in started:
                wait_one(x.req, None, self._deadline, (x.step.peer, x.step.index, "send", self.step, self.timeout))
            if flags & FLAG_NONFINITE and (self.is_receiver or self.rank == self.plan.root_rank):
                self._refuse_nonfinite(leaves)
            if not self.is_receiver:
                return None
            if out is None:
                out = np.empty(self.count)
            np.copyto(out.reshape(-1), holder)
            return out
        except Refusal as e:
            self._fail(e, pc)
            raise
        finally:
            self.step += 1
            self._busy = False

    def _refuse_nonfinite(self, leaves) -> None:
        for slot, arr in leaves.items():
            i = kernel.first_nonfinite(arr)
            if i >= 0:
                raise KernelRefusal(
                    "non-finite-contribution",
                    f"slot {slot} holds {arr[i]!r} at element {i} (step {self.step}); nothing was applied",
                    slot=slot, index=i,
                )
        raise KernelRefusal(
            "non-finite-combined",
            f"the combined value at step {self.step} is not finite (a contribution on another rank, or overflow)",
        )

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
