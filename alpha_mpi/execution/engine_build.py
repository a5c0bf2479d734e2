"""Compiling a rank's Program once: work buffers, frame headers, persistent requests and the op
table, each op a named record with every pointer a run needs (construction only; engine.py
runs it, engine_walk.py holds the function of each op kind).

`compile_program` returns a frozen `Compiled`. Its message records (`Msg`) get their tags and
persistent send requests from `open_sends`, once the build agreement has given the executor its
tag block (endpoint.py: message k from one rank to another uses block.base + 2k and + 2k + 1);
a frame sent from the caller's memory gets its payload request per run (the only field a run
writes). Receives get no request at all: W matches the frame first and receives it size-safely
(inbound.py), so the planner's P ops compile to nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from .. import kernel
from ..planning.builder import is_split
from ..planning.program import Program, RankProgram
from . import engine_walk as w
from . import frames as fr


def payload_check_from_env() -> bool:
    """ALPHA_MPI_PAYLOAD_CHECK=1: a crc32 of every payload travels in its header (opt-in)."""
    return os.environ.get("ALPHA_MPI_PAYLOAD_CHECK", "") not in ("", "0")


class Msg:
    """One message at this rank: its frame spec, header buffer and requests, its region, and
    `pview`, its payload's memory when that is the engine's own (None: the caller's)."""

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
        "pview",
        "got",
    )


class EvalOp(NamedTuple):
    """E: one fused kernel pass. `ptrs[j]` is set per run for each (j, buffer, offset) in `dyn`
    (inputs in the caller's memory); `out_ptr` is None when the output is the caller's too."""

    ptrs: object
    dyn: tuple
    nin: int
    count: int
    prog: object
    plen: int
    out_ptr: object
    out_buf: str
    out_off: int


class CopyOp(NamedTuple):
    """C: copy `nbytes`; a pointer is None where its region lies in the caller's memory."""

    src_ptr: object
    src_buf: str
    src_off: int
    dst_ptr: object
    dst_buf: str
    dst_off: int
    nbytes: int


class CheckOp(NamedTuple):
    """F: the finiteness check of `count` elements (ptr None: in the caller's memory)."""

    ptr: object
    buf: str
    off: int
    count: int


class MergeOp(NamedTuple):
    """M: int64 views of the three heads (count, flags) and of the length word, kernel pointers
    to the three node arrays (planning.program.Merge)."""

    a_head: np.ndarray
    b_head: np.ndarray
    out_head: np.ndarray
    n_word: np.ndarray
    a_nodes: object
    b_nodes: object
    out_nodes: object
    k: int
    capacity: int


@dataclass(frozen=True)
class Compiled:
    """One rank's program, built once: buffers, messages, the op table ((function, record)
    pairs, engine_walk's functions) and what binding a run needs to know."""

    rp: RankProgram
    n: int
    bufs: dict  # work buffer name -> float64 array (a framed one: the payload after its header)
    msgs: dict  # message index -> Msg
    table: tuple
    internal_out: np.ndarray | None  # the result buffer of small or aliased runs
    small: bool  # results computed in internal_out, copied to the caller's `out` on success
    is_receiver: bool
    keep: list  # cdata that must live as long as the table's pointers

    @property
    def messages_per_peer(self) -> int:
        """This rank's largest count of messages to or from one peer in a run (what its tag
        block must hold: the build agreement takes the largest over the ranks)."""
        return 1 + max((m.seq for m in self.rp.messages.values()), default=-1)


def compile_program(program: Program, rank: int, contract: str, sequence: int = 0) -> Compiled:
    """Build rank `rank`'s part of `program` (no communication; tags and send requests come
    with `open_sends`). `sequence`: the executor's number on its communicator, agreed at build
    (endpoint.py), carried in every frame header so a frame of another executor is refused."""
    ffi = kernel.ffi
    darr = ffi.typeof("double[]")
    rp = program.rank(rank)
    n = program.layout.total
    keep: list = []
    bufs, framed = {}, {}
    for b in rp.buffers:
        if b.framed:
            raw = np.zeros(fr.HEADER + 8 * b.count, dtype=np.uint8)
            framed[b.name] = raw
            bufs[b.name] = raw[fr.HEADER :].view(np.float64)
        else:
            bufs[b.name] = np.zeros(b.count)
    ptr = {}
    for name, arr in bufs.items():
        ptr[name] = ffi.from_buffer(darr, arr, True)
        keep.append(ptr[name])
    internal_out = np.zeros(n) if any(r.buf == "out" for r in _regions(rp)) else None
    msgs = {
        i: _message(program, rank, contract, sequence, m, rp.regions.get(i), bufs, framed)
        for i, m in rp.messages.items()
    }
    table = _table(rp, msgs, ptr, bufs, keep)
    return Compiled(
        rp=rp,
        n=n,
        bufs=bufs,
        msgs=msgs,
        table=table,
        internal_out=internal_out,
        # Small results are computed in the internal buffer and copied to the caller's `out`
        # once the run succeeded, so a refused run leaves `out` as it was; results of 64 KiB and
        # more land in place (no copy), and `out` is unspecified after a refusal.
        small=not is_split(n),
        is_receiver=rp.result is not None and program.mode == "allreduce",
        keep=keep,
    )


def _static(region) -> bool:
    return region.buf.startswith("w")


def _regions(rp):
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


def open_sends(c: Compiled, comm: MPI.Comm, rank: int, base: int) -> None:
    """Give every message of `c` its tags in the executor's block from `base` (header
    base + 2 * seq, payload + 1) and create the persistent sends on `comm` (no communication)."""
    for x in c.msgs.values():
        x.tag = base + 2 * x.m.seq
        if x.m.src != rank:
            continue
        x.hreq = comm.Send_init(x.hbuf, dest=x.peer, tag=x.tag)
        if x.split and not x.dyn and x.pview is not None:
            x.preq = comm.Send_init(x.pview, dest=x.peer, tag=x.tag + 1)


def _message(program, rank, contract, sequence, m, region, bufs, framed) -> Msg:
    x = Msg()
    x.m, x.region, x.peer = m, region, (m.dst if m.src == rank else m.src)
    x.spec = fr.FrameSpec(
        phase=m.phase,
        edge=m.index,
        sender=m.src,
        receiver=m.dst,
        count=m.count,
        topology=program.topology,
        layout_order_id=program.layout_order_id,
        identity=program.identity,
        layout_key=m.what,
        contract=contract,
        sequence=sequence,
    )
    x.split = is_split(m.count)  # the planner's rule, the same at both ends
    x.tag = None  # open_sends, once the build agreement gave the executor its tag block
    x.what = f"{fr.PHASE_NAME[fr.PHASE_CODE[m.phase]]} frame {m.index}"
    x.status, x.pstatus = MPI.Status(), MPI.Status()
    sending = m.src == rank
    if x.split or m.count == 0:
        x.hbuf = np.zeros(fr.HEADER, dtype=np.uint8)
    else:
        x.hbuf = framed[region.buf][: fr.HEADER + 8 * m.count]
    x.hmv = memoryview(x.hbuf)
    x.nbytes = x.hbuf.nbytes
    # Receives get no request: W matches the frame and receives it size-safely (inbound.py);
    # only sends are persistent (open_sends).
    x.hreq = x.preq = x.pview = None
    x.dyn = False
    if sending:
        x.hmv[: fr.HEADER - 4] = x.spec.expect
    if not x.split:
        x.pview = x.hbuf[fr.HEADER :]
    elif _static(region):
        x.pview = bufs[region.buf][region.offset : region.offset + region.count]
    else:
        x.dyn = True  # in the caller's memory: a request per run
    return x


def _table(rp, msgs, ptr, bufs, keep) -> tuple:
    """The op table: one (function, named record) per op, with everything a run needs."""
    ffi = kernel.ffi
    table: list = []
    fused = _fused_checks(rp, kernel.lib.AK_EVAL_CHECK_MAX_INPUTS)
    for pos, op in enumerate(rp.ops):
        kind = op.kind
        if pos in fused.values():
            continue  # this F runs inside the evaluation before it
        if kind == "P":
            continue  # nothing is posted: W matches the frame and receives it (size-safe)
        if kind in "SWD":
            table.append(({"S": w.send, "W": w.wait, "D": w.done}[kind], msgs[op.index]))
        elif kind == "E":
            ev = rp.evals[op.index]
            prog = np.asarray(ev.program, dtype=np.int32)
            ptrs = ffi.new("double *[]", len(ev.inputs))
            dyn = []
            for j, reg in enumerate(ev.inputs):
                if _static(reg):
                    ptrs[j] = ptr[reg.buf] + reg.offset
                else:
                    dyn.append((j, reg.buf, reg.offset))
            out = ev.output
            pptr = ffi.from_buffer("int32_t[]", prog)
            keep.extend((ptrs, prog, pptr))
            rec = EvalOp(
                ptrs,
                tuple(dyn),
                len(ev.inputs),
                out.count,
                pptr,
                len(prog),
                ptr[out.buf] + out.offset if _static(out) else None,
                out.buf,
                out.offset,
            )
            table.append((w.evaluate_checked if pos in fused else w.evaluate, rec))
        elif kind == "C":
            a, b = rp.copies[op.index]
            rec = CopyOp(
                ptr[a.buf] + a.offset if _static(a) else None,
                a.buf,
                a.offset,
                ptr[b.buf] + b.offset if _static(b) else None,
                b.buf,
                b.offset,
                8 * a.count,
            )
            table.append((w.copy, rec))
        elif kind == "F":
            reg = rp.checks[op.index]
            rec = CheckOp(ptr[reg.buf] + reg.offset if _static(reg) else None, reg.buf, reg.offset, reg.count)
            table.append((w.check, rec))
        elif kind == "M":
            table.append((w.merge, _merge_op(rp.merges[op.index], ptr, bufs)))
    return tuple(table)


def _fused_checks(rp, max_inputs: int) -> dict:
    """{position of an E op: position of the F op right after it} where that F checks exactly
    the E's output: the pair is one kernel call (ak_tree_eval_finite), the check reading each
    block while it is still in cache, instead of a second pass over the result."""
    ops, out = rp.ops, {}
    for pos in range(len(ops) - 1):
        e, f = ops[pos], ops[pos + 1]
        if e.kind == "E" and f.kind == "F":
            ev = rp.evals[e.index]
            if rp.checks[f.index] == ev.output and len(ev.inputs) <= max_inputs:
                out[pos] = pos + 1
    return out


def _merge_op(mg, ptr, bufs) -> MergeOp:
    ffi = kernel.ffi

    def words(reg):
        return bufs[reg.buf].view(np.int64)[reg.offset : reg.offset + reg.count]

    def nodes(reg):
        return ffi.cast("int64_t *", ptr[reg.buf] + reg.offset)

    return MergeOp(
        words(mg.a[0]),
        words(mg.b[0]),
        words(mg.out[0]),
        words(mg.n),
        nodes(mg.a[1]),
        nodes(mg.b[1]),
        nodes(mg.out[1]),
        mg.k,
        mg.capacity,
    )


__all__ = ["Compiled", "compile_program", "open_sends", "payload_check_from_env", "Msg"]
