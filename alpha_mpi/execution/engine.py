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
- A genuine failure (timeout, a frame from another plan, a dead peer) may leave frames in
  flight: the engine is broken (`combiner-broken` on later runs; build a new one on every rank)
  and the job aborts at exit instead of hanging (transport.mark_broken). Sends are never
  cancelled.
"""

from __future__ import annotations

import os
import sys
import zlib

import numpy as np
from mpi4py import MPI

from .. import kernel
from ..planning.builder import is_split
from ..planning.program import Program
from ..refusals import FrameRefusal, KernelRefusal, PlanRefusal, Refusal
from . import frames as fr
from .contributions import check_contributions, refuse_nonfinite
from .transport import TAG_BASE, Waiter, cancel_receives, debug_enabled, library_comm, log, mark_broken

_F64 = np.dtype(np.float64)
_MISSING = object()
P, S, W, D, E, C, F, PALL = range(8)
_KIND = {"P": P, "S": S, "W": W, "D": D, "E": E, "C": C, "F": F}


def payload_check_from_env() -> bool:
    return os.environ.get("ALPHA_MPI_PAYLOAD_CHECK", "") not in ("", "0")


class _Msg:
    """One message at this rank: its header buffer and requests, its region."""

    __slots__ = (
        "m",
        "spec",
        "hbuf",
        "hmv",
        "hreq",
        "preq",
        "region",
        "dyn",
        "status",
        "pstatus",
        "split",
        "nbytes",
        "peer",
        "tag",
        "what",
    )


class Engine:
    """Executes one Program repeatedly on one communicator. Build it on every rank of `comm`."""

    def __init__(self, comm, program: Program, *, timeout=None, contract: str = "", dup: bool = True):
        if not isinstance(program, Program):
            raise PlanRefusal(
                "plan-rank-mismatch",
                f"Engine runs a Program (planning.realize), got {type(program).__name__}",
            )
        size = comm.Get_size()
        if program.size != size:
            raise PlanRefusal(
                "plan-rank-mismatch", f"the program is for {program.size} ranks, the communicator has {size}"
            )
        self.program = self.plan = program
        self.comm = library_comm(comm) if dup else comm
        self._owns_comm = dup
        self.rank = rank = self.comm.Get_rank()
        self.waiter = Waiter(self.comm, timeout)
        self.timeout = self.waiter.timeout
        self.debug = debug_enabled()
        self.step = 0
        self.broken = None
        self._busy = False
        self.contract = contract
        rp = self.rp = program.rank(rank)
        self.slots = rp.slots
        self.n = n = program.layout.total
        self.is_receiver = rp.result is not None and program.mode == "allreduce"
        self.realization = program.realization
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
        self._corrupt = None

    # -- construction --------------------------------------------------------------------------
    def _p(self, arr):
        c = self._ffi.from_buffer(self._darr, arr, True)
        self._keep.append(c)
        return c

    def _all_regions(self):
        rp = self.rp
        for ev in rp.evals:
            yield from ev.inputs
            yield ev.output
        for a, b in rp.copies:
            yield a
            yield b
        yield from rp.checks
        yield from (r for r in rp.regions.values() if r is not None)
        if rp.result is not None:
            yield rp.result

    def _static(self, region) -> bool:
        return region.buf.startswith("w")

    def _message(self, m, region) -> _Msg:
        prog = self.program
        x = _Msg()
        x.m, x.region, x.peer = m, region, (m.dst if m.src == self.rank else m.src)
        x.spec = fr.FrameSpec(
            phase=m.phase,
            edge=m.index,
            sender=m.src,
            receiver=m.dst,
            count=m.count,
            topology=prog.topology,
            order_id=prog.order_id,
            identity=prog.identity,
            layout_key=m.what,
            contract=self.contract,
        )
        x.split = is_split(m.count)  # the planner's rule, the same at both ends
        x.tag = TAG_BASE + 2 * m.seq
        x.what = f"{fr.PHASE_NAME[fr.PHASE_CODE[m.phase]]} frame {m.index}"
        x.status, x.pstatus = MPI.Status(), MPI.Status()
        sending = m.src == self.rank
        if x.split or m.count == 0:
            x.hbuf = np.zeros(fr.HEADER, dtype=np.uint8)
        else:
            x.hbuf = self.framed[region.buf][: fr.HEADER + 8 * m.count]
        x.hmv = memoryview(x.hbuf)
        x.nbytes = x.hbuf.nbytes
        if sending:
            x.hmv[: fr._CRC_OFF] = x.spec.expect
            x.hreq = self.comm.Send_init(x.hbuf, dest=x.peer, tag=x.tag)
        else:
            x.hreq = self.comm.Recv_init(x.hbuf, source=x.peer, tag=x.tag)
        x.preq, x.dyn = None, False
        if x.split:
            if self._static(region):
                view = self.bufs[region.buf][region.offset : region.offset + region.count]
                x.preq = (
                    self.comm.Send_init(view, dest=x.peer, tag=x.tag + 1)
                    if sending
                    else self.comm.Recv_init(view, source=x.peer, tag=x.tag + 1)
                )
            else:
                x.dyn = True  # in the caller's memory: a request per run
        return x

    def _compile(self) -> list:
        """The op table: one tuple per op, with everything a run needs prebuilt."""
        rp, ffi = self.rp, self._ffi
        table = []
        for op in rp.ops:
            k = _KIND[op.kind]
            if k in (P, S, W, D):
                x = self._msgs[op.index]
                if k == P and not x.dyn and table and table[-1][0] == PALL:
                    table[-1][1].append(x.hreq)
                    if x.preq is not None:
                        table[-1][1].append(x.preq)
                    table[-1][2].append(x)
                elif k == P and not x.dyn:
                    table.append((PALL, [x.hreq] + ([x.preq] if x.preq is not None else []), [x]))
                else:
                    table.append((k, x))
            elif k == E:
                ev = rp.evals[op.index]
                prog = np.asarray(ev.program, dtype=np.int32)
                ptrs = ffi.new("double *[]", len(ev.inputs))
                self._keep.append(ptrs)
                dyn = []
                for j, reg in enumerate(ev.inputs):
                    if self._static(reg):
                        ptrs[j] = self._ptr[reg.buf] + reg.offset
                    else:
                        dyn.append((j, reg.buf, reg.offset))
                out = ev.output
                pptr = ffi.from_buffer("int32_t[]", prog)
                self._keep.append((prog, pptr))
                table.append(
                    (
                        E,
                        ptrs,
                        tuple(dyn),
                        len(ev.inputs),
                        out.count,
                        pptr,
                        len(prog),
                        self._ptr[out.buf] + out.offset if self._static(out) else None,
                        out.buf,
                        out.offset,
                    )
                )
            elif k == C:
                a, b = rp.copies[op.index]
                table.append(
                    (
                        C,
                        self._ptr[a.buf] + a.offset if self._static(a) else None,
                        a.buf,
                        a.offset,
                        self._ptr[b.buf] + b.offset if self._static(b) else None,
                        b.buf,
                        b.offset,
                        8 * a.count,
                    )
                )
            elif k == F:
                reg = rp.checks[op.index]
                table.append(
                    (
                        F,
                        self._ptr[reg.buf] + reg.offset if self._static(reg) else None,
                        reg.buf,
                        reg.offset,
                        reg.count,
                    )
                )
        return table

    # -- binding the caller's memory -------------------------------------------------------------
    def _leaves(self, contributions) -> dict:
        # Fast path: exactly this rank's slots, each a contiguous float64 array of n elements.
        if type(contributions) is dict and len(contributions) == len(self.slots):
            out, n = {}, self.n
            for slot in self.slots:
                v = contributions.get(slot, _MISSING)
                if type(v) is np.ndarray and v.dtype == _F64 and v.size == n and v.flags.c_contiguous:
                    out[slot] = v if v.ndim == 1 else v.reshape(-1)
                else:
                    break
            else:
                return out
        return check_contributions(contributions, self.slots, self.rank, self.n, self.program.layout.key())

    def _result_len(self) -> int:
        r = self.rp.result
        return 0 if r is None else r.count

    def _bind_out(self, out):
        """The array the `out` buffer is bound to: the caller's when given (checked), else new."""
        if self._internal_out is None and self.rp.result is None:
            return None
        n = self.n
        if out is None:
            return np.empty(n) if self.is_receiver and not self._small else self._internal_out
        if (
            not isinstance(out, np.ndarray)
            or out.dtype != _F64
            or not out.flags.c_contiguous
            or not out.flags.writeable
        ):
            raise Refusal(
                "out-invalid",
                f"out must be a writeable C-contiguous float64 array, got "
                f"{type(out).__name__ if not isinstance(out, np.ndarray) else out.dtype} "
                f"{'' if not isinstance(out, np.ndarray) else ('C-contiguous' if out.flags.c_contiguous else 'not C-contiguous')}"
                f"{'' if not isinstance(out, np.ndarray) or out.flags.writeable else ' read-only'}",
            )
        want = n if self.program.mode == "allreduce" else None
        if want is not None and out.size != want:
            raise Refusal("out-invalid", f"out has {out.size} elements, the result has {want}")
        if self.program.mode == "reduce-scatter":
            if out.size not in (n, self._result_len()):
                raise Refusal(
                    "out-invalid",
                    f"out has {out.size} elements; give the chunk's {self._result_len()} "
                    f"or the whole payload's {n}",
                )
            return self._internal_out
        return out.reshape(-1) if self.is_receiver else self._internal_out

    def _aliased(self, out, leaves) -> bool:
        """`out` shares memory with a contribution: run into the internal buffer, copy at the end
        (a realization may still send a contribution while it writes the result)."""
        return out is not None and any(np.shares_memory(out, v) for v in leaves.values())

    # -- running ---------------------------------------------------------------------------------
    def run(self, contributions, out=None, *, timeout=None):
        """Run the program once with this rank's contributions (slot -> float64 payload).

        Allreduce mode: the combined payload where the delivery reaches this rank, else None
        (`out`, if given, is then left as it was). Reduce-scatter mode: (start, stop, chunk).
        `timeout` overrides the per-wait bound for this run."""
        if self.broken is not None:
            raise Refusal(
                "combiner-broken",
                f"an earlier run refused with [{self.broken}]; build a new executor on every rank",
            )
        if self._busy:
            raise Refusal("executor-reentrant", "run() called while a run is in progress")
        self._busy = True
        local = None
        try:
            try:
                leaves = self._leaves(contributions)
            except Refusal as e:
                local, leaves = e, self._zero_leaves()
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
        except Refusal as e:
            self._fail(e)
            raise
        finally:
            self.step += 1
            self._busy = False
        return self._finish(local, flags, who, leaves, outarr, out)

    def _zero_leaves(self) -> dict:
        if self._zeros is None:
            self._zeros = np.zeros(self.n)
        return {s: self._zeros for s in self.slots}

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
        step, waiter, debug, rank = self.step, self.waiter, self.debug, self.rank
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
                try:
                    waiter.wait(x.hreq, x.status, x.peer, x.what, step, timeout)
                except FrameRefusal as e:  # truncated: a longer frame; its header may say whose
                    x.spec.check(x.hbuf, step, x.nbytes + 8, split=x.split)
                    raise e
                got = x.status.Get_count(MPI.BYTE)
                f = x.spec.fast_check(x.hmv, step) if got == x.nbytes else -1
                if f < 0:
                    try:
                        f = x.spec.check(x.hbuf, step, got, split=x.split)
                    except FrameRefusal as e:
                        if e.code != "frame-checksum" or got == x.nbytes:
                            raise
                        # another size, and a header that did not arrive intact (some MPIs leave
                        # a truncated receive's buffer undefined): the size is what is known
                        raise FrameRefusal(
                            "frame-size-mismatch",
                            f"{x.what} from rank {x.peer} (step {step}): "
                            f"{got} bytes arrived, expected {x.nbytes}",
                            peer=x.peer,
                            step=step,
                        ) from None
                if x.split:
                    waiter.wait(x.preq, x.pstatus, x.peer, x.what + " payload", step, timeout)
                    if x.pstatus.Get_count(MPI.BYTE) != 8 * x.m.count:
                        raise Refusal(
                            "frame-size-mismatch",
                            f"{x.what} from rank {x.peer}: payload of "
                            f"{x.pstatus.Get_count(MPI.BYTE)} bytes, expected {8 * x.m.count}",
                        )
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
            else:  # P of a frame received into the caller's memory
                x = op[1]
                x.hreq.Start()
                reg = x.region
                x.preq = self.comm.Irecv(
                    arrays[reg.buf][reg.offset : reg.offset + reg.count], source=x.peer, tag=x.tag + 1
                )
        return flags, who

    def _payload(self, x, arrays):
        """The payload bytes of message x at this rank (in its frame buffer or its region)."""
        if not x.split:
            return x.hmv[fr.HEADER : fr.HEADER + 8 * x.m.count]
        reg = x.region
        src = self.bufs[reg.buf] if self._static(reg) else arrays[reg.buf]
        return src[reg.offset : reg.offset + reg.count]

    def _finish(self, local, flags, who, leaves, outarr, out):
        if local is not None:
            raise local
        if self._corrupt is not None:
            raise self._corrupt
        if flags & fr.FLAG_REFUSED:
            rank, code = who
            raise Refusal(
                "peer-refused",
                f"rank {rank} refused step {self.step - 1} [{code}] before its arithmetic; "
                "every rank completed the round and nothing was applied",
                peer=rank,
                peer_code=code,
            )
        if flags & fr.FLAG_NONFINITE and (self.rp.result is not None or self.rp.checks):
            refuse_nonfinite(leaves, self.step - 1)
        res = self.rp.result
        if res is None:
            return None
        if self.program.mode == "reduce-scatter":
            chunk = (
                self.bufs[res.buf][res.offset : res.offset + res.count]
                if res.buf != "out"
                else outarr[res.offset : res.offset + res.count]
            )
            lo, hi = self.program.chunks[self.rank]
            if out is not None:
                target = (
                    out.reshape(-1)[lo:hi] if out.size == self.n and out.size != hi - lo else out.reshape(-1)
                )
                np.copyto(target, chunk)
                chunk = target
            return lo, hi, chunk
        if res.buf != "out":  # pragma: no cover - allreduce results always land in `out`
            raise PlanRefusal("plan-simulation-failed", "an allreduce result outside `out`")
        if out is None:
            return outarr.copy() if outarr is self._internal_out else outarr
        if outarr is self._internal_out:  # small, or `out` aliased a contribution
            np.copyto(out.reshape(-1), outarr)
        return out

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
