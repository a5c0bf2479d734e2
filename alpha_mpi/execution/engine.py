"""The one executor: runs any realization's Program (planning/program.py) over mpi4py (layer 4).

Every rank builds an Engine for the same Program (collectively: it duplicates the communicator
unless told not to). Work buffers, frame headers, persistent requests, kernel pointer arrays and
the op table are built once; a run binds the caller's contributions and `out`, then walks the
rank's ops: P posts a receive, S starts a send (its header carries the flags seen so far), W
waits for a frame and checks its header (one bytes comparison; the field-by-field naming only
on a mismatch), D completes a send, E is one fused kernel pass, C a copy, F a finiteness check.

Failure semantics (the protocol, not an afterthought):
- A local refusal (a bad contribution or `out`) does not leave peers waiting: this rank runs
  the whole program on zeros in place of its data, its frames flagged `refused` with its rank
  and code; every rank completes the run, then the refusing rank raises its refusal and every
  rank the flag reached raises `peer-refused` naming it. The next run works.
- FiniteOrRefuse: a non-finite value makes the combined value non-finite; the ranks that check
  it (F) flag their later frames, and every rank the flag reaches refuses after communication
  completed (`non-finite-contribution` where the bad slot is, else `non-finite-combined`).
- A bad frame (a header that is not the one planned, another size, a payload failing its
  check) is refused on the rank that finds it and flagged onwards like a local refusal: the
  program goes on over zeros in its place, every rank names it. A payload failure leaves the
  engine usable; a frame of another program marks it broken after the run (that program may
  have sent more), except where the Program says every peer program pairs one to one.
- A genuine failure (timeout, a dead peer) may leave frames in flight: the engine is broken
  (`combiner-broken` on later runs; build a new one on every rank) and the job aborts at exit
  instead of hanging (transport.mark_broken). Sends are never cancelled.
"""

from __future__ import annotations

import sys
import zlib
from typing import TYPE_CHECKING

import numpy as np
from mpi4py import MPI

from .. import kernel
from ..planning.builder import is_split
from ..planning.program import Program
from ..refusals import FrameRefusal, KernelRefusal, PlanRefusal, Refusal
from . import frames as fr
from .engine_bind import EngineBinding
from .engine_build import PALL, C, D, E, EngineBuild, F, M, S, W, payload_check_from_env
from .engine_ops import merge, named_check, warn_retired
from .transport import Endpoint, Waiter, cancel_receives, log, mark_broken

# The flags a received frame passes on (its payload crc bit is its own).
_FOLDED = fr.FLAG_NONFINITE | fr.FLAG_REFUSED | fr.FLAG_VOTE

if TYPE_CHECKING:
    from .contributions import Contributions


class Engine(Endpoint, EngineBuild, EngineBinding):
    """Executes one Program repeatedly on one communicator. Build it on every rank of `comm`.

    `waiter`: a transport.Waiter to share (its bound and idle policy) instead of making one,
    which is collective over `comm`. Subclasses that take another kind of plan (Combiner: a tree Plan; ScatterCombiner: a
    scatter program) say how it becomes the Program they run, in `_program_of`."""

    def __init__(
        self,
        comm: MPI.Comm,
        program: Program,
        *,
        timeout: float | None = None,
        contract: str = "",
        dup: bool = True,
        waiter: Waiter | None = None,
        **retired: object,
    ) -> None:
        warn_retired(retired)
        program = self._program_of(program)
        size = comm.Get_size()
        if program.size != size:
            raise PlanRefusal(
                "plan-rank-mismatch", f"the program is for {program.size} ranks, the communicator has {size}"
            )
        self.program = self.plan = program
        rank = self._open(comm, timeout, dup, waiter)
        self._busy = False
        self.contract = contract
        rp = self.rp = program.rank(rank)
        self.slots = rp.slots
        self.n = n = program.layout.total
        self.is_receiver = rp.result is not None and program.mode == "allreduce"
        self.realization = program.realization
        self.chunk = program.chunk(rank)  # reduce-scatter: (start, stop) of this rank's chunk
        ffi = kernel.ffi
        self._ffi, self._lib = ffi, kernel.lib
        self._darr = ffi.typeof("double[]")
        # Work buffers (framed ones with header room in front).
        self.bufs, self.framed = {}, {}
        for b in rp.buffers:
            if b.framed:
                raw = np.zeros(fr.HEADER + 8 * b.count, dtype=np.uint8)
                self.framed[b.name] = raw
                self.bufs[b.name] = raw[fr.HEADER :].view(np.float64)
            else:
                self.bufs[b.name] = np.zeros(b.count)
        self._keep = []
        self._ptr = {name: self._p(arr) for name, arr in self.bufs.items()}
        self._internal_out = None
        if any(r.buf == "out" for r in self._all_regions()):
            self._internal_out = np.zeros(n)
        self._zeros = None
        self._bases, self._arrays, self._bound = {}, {}, {}
        self._leaf_names = {s: f"L{s}" for s in self.slots}
        # Small results are computed in the internal buffer and copied to the caller's `out` once
        # the run succeeded, so a refused run leaves `out` as it was; results of 64 KiB and more
        # land in place (no copy), and `out` is unspecified after a refusal.
        self._small = not is_split(n)
        self._msgs = {}
        for i, m in rp.messages.items():
            self._msgs[i] = self._message(m, rp.regions.get(i))
        self._table = self._compile()
        # Fault injection for tests and verification tools (alpha_mpi_verify, tests/): when set,
        # called as send_hook(message index, header memoryview) after a header is written and
        # before it is sent. None in production (one attribute test per send).
        self.send_hook = None
        # ALPHA_MPI_PAYLOAD_CHECK=1: a crc32 of every payload travels in its header and is checked
        # on arrival (opt-in: it costs a pass over every payload at both ends; README).
        self.payload_check = payload_check_from_env()
        self._bad = None  # the first bad frame of the current run (refused, flagged onwards)
        # Programs whose every possible peer program pairs its messages one to one with this one
        # (the arrays' exchanges in rank order): a foreign frame leaves nothing in flight, so
        # the executor stays usable after naming it.
        self._pairs = bool(program.details.get("foreign_frames_pair"))
        self.flags = 0  # the frame flags the last run saw (frames.FLAG_*)

    def _program_of(self, plan: object) -> Program:
        """The Program this executor runs for `plan` (`plan-kind-mismatch` for another kind)."""
        if not isinstance(plan, Program):
            raise PlanRefusal(
                "plan-kind-mismatch", f"Engine runs a Program (planning.realize), got {type(plan).__name__}"
            )
        return plan

    # -- construction --------------------------------------------------------------------------
    # -- binding the caller's memory -------------------------------------------------------------
    # -- running ---------------------------------------------------------------------------------
    def run(
        self, contributions: Contributions, out: np.ndarray | None = None, *, timeout: float | None = None
    ) -> np.ndarray | None:
        """Run the program once with this rank's contributions (slot -> float64 payload).

        Returns the combined payload (a float64 vector) where the delivery reaches this rank,
        else None (`out`, if given, is then left as it was). Reduce-scatter mode: the values of
        this rank's chunk, coordinates `self.chunk` (`reduce_scatter_run` adds the bounds).
        `timeout` overrides the per-wait bound for this run."""
        try:
            leaves, local = self._leaves(contributions), None
        except Refusal as e:
            leaves, local = None, e
        return self.execute(leaves, out, local=local, timeout=timeout)

    def execute(
        self,
        leaves: dict | None,
        out: np.ndarray | None = None,
        *,
        local: Refusal | None = None,
        timeout: float | None = None,
        vote: int = 0,
    ) -> np.ndarray | None:
        """The one run of every front end (combine, assembly, arrays). `leaves`: slot -> checked
        contiguous float64 vector of its length, or None when `local` is this rank's refusal of
        its inputs (the program then runs on zeros, flagged, and `local` is raised at the end);
        `out`: the caller's (checked here); `vote` (0 or 1) rides on the frames, and afterwards
        `self.flags` holds the frame flags this rank saw (`frames.FLAG_VOTE`: any rank voted)."""
        if self.broken is not None:
            raise Refusal(
                "combiner-broken",
                f"an earlier run refused with [{self.broken}]; build a new executor on every rank",
            )
        if self._busy:
            raise Refusal("executor-reentrant", "run() called while a run is in progress")
        self._busy = True
        self._bad = None
        try:
            if leaves is None:
                leaves = self._zero_leaves()
            try:
                outarr = self._bind_out(out)
                if (
                    outarr is not None
                    and outarr is not self._internal_out
                    and (self._small or self._aliased(outarr, leaves))
                ):
                    outarr = self._internal_out  # copied to the caller's `out` only on success
            except Refusal as e:
                local = local or e
                outarr = (
                    self._internal_out
                    if self._internal_out is not None
                    else (np.empty(self.n) if self.rp.result is not None else None)
                )
            flags, who = self._walk(leaves, outarr, local, timeout, vote)
        except Refusal as e:
            self._fail(e)
            if self._bad is not None and e is not self._bad:
                # a bad frame came first and explains what followed (a peer running another
                # program stops sending what this one waits for)
                raise self._bad from e
            raise
        finally:
            self.step += 1
            self._busy = False
        self.flags = flags
        bad = self._bad
        if bad is not None and bad.code != "frame-payload-corrupt" and not self._pairs:
            # A frame of another program: every rank has named it by now, but that program may
            # have sent more than this one received, so the executor cannot run again.
            self._fail(bad)
        return self._finish(local, flags, who, leaves, outarr, out)

    def _walk(self, leaves, outarr, local, timeout, vote=0):
        ffi, lib = self._ffi, self._lib
        bases, arrays, bound, names = self._bases, self._arrays, self._bound, self._leaf_names
        # Pointers into the caller's arrays, rebuilt only when another array object comes
        # (the learner and most loops pass the same buffers every step).
        for s, a in leaves.items():
            name = names[s]
            if bound.get(name) is not a:
                bound[name] = a
                bases[name] = ffi.from_buffer(self._darr, a)
            arrays[name] = a
        if outarr is not None:
            if bound.get("out") is not outarr:
                bound["out"] = outarr
                bases["out"] = ffi.from_buffer(self._darr, outarr, True)
            arrays["out"] = outarr
        step, waiter, debug, rank = self.step, self.waiter, self.debug, self.rank
        check_payload = self.payload_check
        flags = (fr.FLAG_REFUSED if local is not None else 0) | (fr.FLAG_VOTE if vote else 0)
        who = (rank, local.code) if local is not None else None
        code = fr.code_tag(local.code) if local is not None else b"\0\0\0\0"
        refused = rank if local is not None else -1
        for op in self._table:
            k = op[0]
            if k == E:
                _, ptrs, dyn, nin, cnt, pptr, plen, optr, obuf, ooff = op
                for j, b, off in dyn:
                    ptrs[j] = bases[b] + off
                if optr is None:
                    optr = bases[obuf] + ooff
                st = lib.ak_tree_eval(optr, ptrs, nin, cnt, pptr, plen)
                if st:
                    raise KernelRefusal(
                        "kernel-bad-argument", f"rank {rank}: the kernel refused an evaluation (status {st})"
                    )
            elif k == PALL:
                MPI.Prequest.Startall(op[1])
            elif k == S:
                x = op[1]
                if x.split and x.dyn:
                    reg = x.region
                    view = arrays[reg.buf][reg.offset : reg.offset + reg.count]
                x.hmv[:124] = x.spec.expect  # the buffer may have held a received header
                if check_payload and x.m.count:
                    crc = zlib.crc32(view if x.split and x.dyn else self._payload(x, arrays))
                    fr.patch(x.hmv, step, flags | fr.FLAG_PAYLOAD_CRC, refused, code, crc)
                else:
                    fr.patch(x.hmv, step, flags, refused, code)
                if self.send_hook is not None:
                    self.send_hook(x.m.index, x.hmv)
                x.hreq.Start()
                if x.split:
                    if x.dyn:
                        x.preq = self.comm.Isend(view, dest=x.peer, tag=x.tag + 1)
                    else:
                        x.preq.Start()
                if debug:
                    log(rank, f"send -> {x.peer} {x.what} step {step} {fr.HEADER + 8 * x.m.count}B")
            elif k == W:
                x = op[1]
                bad = None
                try:
                    try:
                        waiter.wait(x.hreq, x.status, x.peer, x.what, step, timeout)
                        got = x.status.Get_count(MPI.BYTE)
                    except FrameRefusal as e:  # truncated: a longer frame; its header may say whose
                        got, bad = -1, e
                    f = x.spec.fast_check(x.hmv, step) if got == x.nbytes else -1
                    if f < 0:
                        f = named_check(x, step, got, bad)
                except FrameRefusal as e:
                    bad = e
                if x.split:
                    try:
                        waiter.wait(x.preq, x.pstatus, x.peer, x.what + " payload", step, timeout)
                        if x.pstatus.Get_count(MPI.BYTE) != 8 * x.m.count:
                            raise FrameRefusal(
                                "frame-size-mismatch",
                                f"{x.what} from rank {x.peer}: payload of "
                                f"{x.pstatus.Get_count(MPI.BYTE)} bytes, expected {8 * x.m.count}",
                                peer=x.peer,
                                step=step,
                            )
                    except FrameRefusal as e:
                        bad = bad or e
                if bad is None and f & fr.FLAG_PAYLOAD_CRC:
                    if zlib.crc32(self._payload(x, arrays)) != fr.payload_crc_of(x.hmv):
                        bad = FrameRefusal(
                            "frame-payload-corrupt",
                            f"rank {rank}: the payload of {x.what} from rank {x.peer} (step {step}) fails its crc32",
                            peer=x.peer,
                            step=step,
                        )
                if bad is not None:
                    # Refused here and flagged onwards like a local refusal: the program goes on
                    # over zeros in place of the frame's payload (no arithmetic ever reads a bad
                    # frame), every rank the flag reaches refuses, and the next run works.
                    if self._bad is None:
                        self._bad = bad
                    self._zero_payload(x, arrays)
                    if who is None:
                        who, refused, code = (rank, bad.code), rank, fr.code_tag(bad.code)
                    flags |= fr.FLAG_REFUSED
                    continue
                if f & fr.FLAG_REFUSED and who is None:
                    who = fr.refusal_of(x.hmv)
                    refused, code = who[0], fr.code_tag(who[1])
                flags |= f & _FOLDED
                if debug:
                    log(rank, f"recv <- {x.peer} {x.what} step {step} {fr.HEADER + 8 * x.m.count}B")
            elif k == C:
                _, sp, sb, so, dp, db, do, nb = op
                ffi.memmove(
                    dp if dp is not None else bases[db] + do, sp if sp is not None else bases[sb] + so, nb
                )
            elif k == F:
                _, rptr, rb, ro, cnt = op
                if lib.ak_first_nonfinite(rptr if rptr is not None else bases[rb] + ro, cnt) >= 0:
                    flags |= fr.FLAG_NONFINITE
            elif k == D:
                x = op[1]
                waiter.wait(x.hreq, None, x.peer, x.what, step, timeout)
                if x.split:
                    waiter.wait(x.preq, None, x.peer, x.what + " payload", step, timeout)
            elif k == M:
                merge(lib, op[1])
            else:  # P of a frame received into the caller's memory
                x = op[1]
                x.hreq.Start()
                reg = x.region
                x.preq = self.comm.Irecv(
                    arrays[reg.buf][reg.offset : reg.offset + reg.count], source=x.peer, tag=x.tag + 1
                )
        return flags, who

    def _fail(self, e: Refusal) -> None:
        if e.code in ("executor-reentrant", "combiner-broken"):
            return
        self.broken = e.code
        mine = [x for x in self._msgs.values()]
        cancel_receives([r for x in mine if x.m.dst == self.rank for r in (x.hreq, x.preq) if r is not None])
        mark_broken(
            self.rank,
            e.code,
            [r for x in mine if x.m.src == self.rank for r in (x.hreq, x.preq) if r is not None],
        )
        sys.stderr.write(
            f"r{self.rank} | {self.realization} step {self.step} refused [{e.code}]: {e.message}\n"
            f"  r{self.rank}: {self.rp.text()}  <-- ERROR HERE\n"
        )
        sys.stderr.flush()

    def free(self) -> None:
        """Free the persistent requests (and the duplicated communicator, if this made one)."""
        for x in self._msgs.values():
            for req in (x.hreq, x.preq if not x.dyn else None):
                if req is not None:
                    try:
                        req.Free()
                    except Exception:
                        pass
        self._msgs, self._table = {}, []
        self._bound.clear()
        self._bases.clear()
        self._arrays.clear()
        if self._owns_comm:
            self._owns_comm = False
            self.comm.Free()


__all__ = ["Engine"]
