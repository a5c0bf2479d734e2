"""The one executor: runs any realization's Program (planning/program.py) over mpi4py (layer 4).

Every rank builds an Engine for the same Program (collectively: it duplicates the communicator
unless told not to), and the build ends in one agreement round (agreement.py): every rank built
the same executor, as the same executor of its communicator (its sequence, carried in every
frame), or every rank refuses by name. Work buffers, frame headers, persistent send requests,
kernel pointer arrays and the op table are built once; a run binds the caller's contributions
and `out`, then walks the rank's ops: S starts a send (its header carries the flags seen so
far), W matches a frame, compares its size with the plan's and only then receives it
(inbound.py: never into a buffer smaller than the message), and checks its header (one bytes
comparison; the field-by-field naming only on a mismatch), D completes a send, E is one fused
kernel pass, C a copy, F a finiteness check. The planner's P ops (post a receive) post nothing.

Failure semantics (the protocol, not an afterthought):
- A local refusal (a bad contribution, `out` or `timeout=`) does not leave peers waiting: this
  rank runs the whole program on zeros in place of its data, its frames flagged `refused` with
  its rank and code; every rank completes the run, then the refusing rank raises its refusal and
  every rank the flag reached raises `peer-refused` naming it. The next run works.
- With the payload check on (ALPHA_MPI_PAYLOAD_CHECK=1, held equal by the build agreement) a
  corrupt payload is flagged onwards like a local refusal, and one flag round after the run
  reaches the ranks no later frame reaches: every rank refuses, or none does.
- FiniteOrRefuse: a non-finite value makes the combined value non-finite; the ranks that check
  it (F) flag their later frames, and every rank the flag reaches refuses after communication
  completed (`non-finite-contribution` where the bad slot is, else `non-finite-combined`).
- A genuine failure (timeout, a frame from another plan, a dead peer) may leave frames in
  flight: the engine is broken (`combiner-broken` on later runs; build a new one on every rank)
  and the job aborts at exit instead of hanging (transport.mark_broken). Sends are never
  cancelled. Any other exception inside a run breaks the engine too, and it says so.
"""

from __future__ import annotations

import sys
import warnings
import zlib
from typing import TYPE_CHECKING

import numpy as np
from mpi4py import MPI

from .. import kernel
from ..planning.builder import is_split
from ..planning.program import Program
from ..refusals import KernelRefusal, PlanRefusal, Refusal
from . import agreement
from . import frames as fr
from .engine_bind import EngineBinding
from .engine_build import C, D, E, EngineBuild, F, S, W, payload_check_from_env
from .inbound import receive_frame
from .transport import Endpoint, cancel_receives, dup_false_hint, log, mark_broken, timeout_from_env

if TYPE_CHECKING:
    from .contributions import Contributions


# Keywords of 0.1 that no longer steer anything: accepted with a warning, so old scripts run.
_RETIRED = {
    "crossover_bytes": "auto chooses by the α–β–γ model (calibration=, ALPHA_MPI_CALIBRATION)",
    "depth": "the engine allocates its own buffers per message",
}


def warn_retired(kwargs: dict) -> None:
    """Warn (DeprecationWarning) for each retired 0.1 keyword; any other is a TypeError."""
    for k in kwargs:
        if k not in _RETIRED:
            raise TypeError(f"unexpected keyword argument {k!r}")
        warnings.warn(f"{k}= is ignored since 0.2: {_RETIRED[k]}", DeprecationWarning, stacklevel=3)


class Engine(Endpoint, EngineBuild, EngineBinding):
    """Executes one Program repeatedly on one communicator. Build it on every rank of `comm`.

    Subclasses that take another kind of plan (Combiner: a tree Plan; ScatterCombiner: a
    scatter program) say how it becomes the Program they run, in `_program_of`."""

    def __init__(
        self,
        comm: MPI.Comm,
        program: Program,
        *,
        timeout: float | None = None,
        contract: str = "",
        dup: bool = True,
        **retired: object,
    ) -> None:
        warn_retired(retired)
        # Everything that can refuse on one rank is decided before any collective call, and
        # every rank takes part in one agreement round with its verdict: every rank built the
        # same executor, or every rank refuses by name (agreement.py) and no later call pairs
        # with the wrong one. With dup=True the round is held on the communicator's library
        # channel before the collective Dup, so a rank that never comes is a bounded, named
        # refusal, not a Dup that waits for ever.
        self.payload_check = payload_check_from_env()
        local, identity = None, ""
        try:
            program = self._program_of(program)
            identity = f"{program.identity}|{contract}|{int(self.payload_check)}"
        except Refusal as e:
            local = e
        if dup:
            comm = agreement.agree_first(comm, identity, local, timeout, "executor")
        local = self._open(comm, timeout, dup) or local
        try:
            if local is not None:
                raise local
            self._build(program, contract)
        except Refusal as e:
            local = e
        if local is not None:
            identity = ""
        try:
            agreement.build_round(self.comm, self.waiter, self.sequence, identity, local, "executor")
        except Refusal:
            for x in getattr(self, "_msgs", {}).values():
                for req in (x.hreq, None if x.dyn else x.preq):
                    if req is not None:
                        req.Free()
            if self._owns_comm:
                self._owns_comm = False
                self.comm.Free()
            raise

    def _build(self, program, contract) -> None:
        size = self.comm.Get_size()
        if program.size != size:
            raise PlanRefusal(
                "plan-rank-mismatch", f"the program is for {program.size} ranks, the communicator has {size}"
            )
        self.program = self.plan = program
        rank = self.rank
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
        # ALPHA_MPI_PAYLOAD_CHECK=1 (self.payload_check, read before the build agreement, which
        # holds it equal on every rank): a crc32 of every payload travels in its header and is
        # checked on arrival (opt-in: it costs a pass over every payload at both ends; README).
        self._corrupt = None

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
        if self.broken is not None:
            raise Refusal(
                "combiner-broken",
                f"an earlier run failed with [{self.broken}]; this executor is broken: build a new one on every rank",
            )
        if self._busy:
            raise Refusal("executor-reentrant", "run() called while a run is in progress")
        self._busy = True
        local = None
        try:
            if timeout is not None:  # checked before any communication; refused like a bad input
                try:
                    timeout = timeout_from_env(timeout)
                except Refusal as e:
                    local, timeout = e, None
            try:
                leaves = self._leaves(contributions)
            except Refusal as e:
                local, leaves = local or e, self._zero_leaves()
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
            flags, who = self._walk(leaves, outarr, local, timeout)
            if self.payload_check:
                # A corrupt payload in a rank's last receive reaches nobody by frame: one
                # agreement round (paid only with the check on) makes every rank refuse or none.
                flags, who = self._flag_round(flags, who, timeout)
        except Refusal as e:
            self._fail(e)
            if self.shared:
                raise dup_false_hint(e) from None
            raise
        except Exception as e:  # not a refusal: a bug or an interrupt; the channel state is unknown
            self._fail(e)
            raise
        finally:
            self.step += 1
            self._busy = False
        return self._finish(local, flags, who, leaves, outarr, out)

    def _walk(self, leaves, outarr, local, timeout):
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
        step, waiter, debug, rank, comm = self.step, self.waiter, self.debug, self.rank, self.comm
        check_payload = self.payload_check
        self._corrupt = None
        flags = fr.FLAG_REFUSED if local is not None else 0
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
                f = receive_frame(comm, waiter, x, step, timeout, arrays)
                if f & fr.FLAG_PAYLOAD_CRC and zlib.crc32(self._payload(x, arrays)) != fr.payload_crc_of(
                    x.hmv
                ):
                    # Refused here and flagged onwards like any local refusal: every rank the
                    # flag reaches refuses, nothing is applied, the next run works.
                    if self._corrupt is None:
                        self._corrupt = Refusal(
                            "frame-payload-corrupt",
                            f"rank {rank}: the payload of {x.what} from rank {x.peer} (step {step}) fails its crc32",
                            peer=x.peer,
                            step=step,
                        )
                    if who is None:
                        who, refused, code = (
                            (rank, "frame-payload-corrupt"),
                            rank,
                            fr.code_tag("frame-payload-corrupt"),
                        )
                    flags |= fr.FLAG_REFUSED
                if f & fr.FLAG_REFUSED and who is None:
                    who = fr.refusal_of(x.hmv)
                    refused, code = who[0], fr.code_tag(who[1])
                flags |= f & (fr.FLAG_NONFINITE | fr.FLAG_REFUSED)
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
        return flags, who

    def _flag_round(self, flags, who, timeout):
        key = agreement.key_of(self.program.identity, self.sequence)
        heard = who if flags & fr.FLAG_REFUSED else None
        v = agreement.exchange(self.comm, self.waiter, agreement.RUN, key, self.step, heard, timeout, "flag")
        return (flags | fr.FLAG_REFUSED, (v.refused, v.code)) if v.refused is not None else (flags, who)

    def _fail(self, e: Exception) -> None:
        code = getattr(e, "code", None) or type(e).__name__  # a refusal's code, else the exception's name
        if code in ("executor-reentrant", "combiner-broken"):
            return
        self.broken = code
        mine = [x for x in self._msgs.values()]
        cancel_receives([r for x in mine if x.m.dst == self.rank for r in (x.hreq, x.preq) if r is not None])
        mark_broken(
            self.rank,
            code,
            [r for x in mine if x.m.src == self.rank for r in (x.hreq, x.preq) if r is not None],
        )
        sys.stderr.write(
            f"r{self.rank} | {self.realization} step {self.step} refused [{code}]: {getattr(e, 'message', e)}\n"
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
