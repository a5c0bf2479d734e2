"""Building an Engine once per program: work buffers, frame headers, persistent requests and the
op table with every pointer a run needs (a mixin of engine.Engine; construction only)."""

from __future__ import annotations

import os

import numpy as np
from mpi4py import MPI

from ..planning.builder import is_split
from . import frames as fr
from .transport import TAG_BASE

_F64 = np.dtype(np.float64)
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
        "pview",
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


class EngineBuild:
    """What Engine.__init__ builds from its RankProgram (see engine.py for the protocol)."""

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
            order_id=prog.layout_order_id,
            identity=prog.identity,
            layout_key=m.what,
            contract=self.contract,
            sequence=self.sequence,  # agreed at build (agreement.py): a frame of another executor is refused
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
        # Receives get no request: W matches the frame first and receives it size-safely
        # (inbound.receive_frame); only sends are persistent.
        x.hreq = x.preq = x.pview = None
        if sending:
            x.hmv[: fr._CRC_OFF] = x.spec.expect
            x.hreq = self.comm.Send_init(x.hbuf, dest=x.peer, tag=x.tag)
        x.dyn = False
        if x.split:
            if self._static(region):
                x.pview = self.bufs[region.buf][region.offset : region.offset + region.count]
                if sending:
                    x.preq = self.comm.Send_init(x.pview, dest=x.peer, tag=x.tag + 1)
            else:
                x.dyn = True  # in the caller's memory: a request per run
        return x

    def _compile(self) -> list:
        """The op table: one tuple per op, with everything a run needs prebuilt."""
        rp, ffi = self.rp, self._ffi
        table = []
        for op in rp.ops:
            k = _KIND[op.kind]
            if k == P:
                continue  # nothing is posted: W matches and receives (size-safe receives)
            if k in (S, W, D):
                table.append((k, self._msgs[op.index]))
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
