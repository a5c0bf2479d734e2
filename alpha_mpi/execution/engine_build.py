"""Compiling a rank's Program once into the records the C round runs (construction only).

`compile_program` allocates the work buffers (numpy), writes every frame's expected header
(frames.FrameSpec), and fills the C records of csrc/round/native.h: one op per planned op, one
message record per frame, one evaluation, copy, check or merge record per op of those kinds,
each region a (buffer number, element offset) pair. Buffer numbers: 0 is `out`, 1.. the
contributions in the rank's slot order, then the program's other caller buffers
(`RankProgram.bound`: the arrays' blocks and geometry) (the caller's memory: bound per run by
writing their base pointers), then the work buffers (the engine's: bound here, once). Nothing here
communicates: once the build agreement has given the executor its tag block (endpoint.py:
message k from one rank to another uses block.base + 2k and + 2k + 1, a flag-round frame the
block's flag tag), `open_exec` writes the tags and the C executor makes its persistent requests
on the executor's communicator (an_prepare). engine.py runs it; engine_walk.py handles what a
run hands back to Python.

Receives are posted where the plan posts them (P), but never while a send that reads the same
region is still in flight: such a post moves to just after that send's completion (D). The
planner's schedule needs no such care because the executor it was written for matched frames
at W; a posted receive writes its region from the moment it is posted.
"""

from __future__ import annotations

import os

import numpy as np
from mpi4py import MPI

from .. import kernel
from .._record import Record
from ..kernel import abi
from ..planning.builder import is_split
from ..planning.program import FLAG_SEQ, Program, RankProgram
from ..refusals import KernelRefusal
from . import frames as fr
from .native import load as load_native
from .waits import mpi_failure

_set = object.__setattr__  # Records set their fields through it (frozen: _record.py)

_INT_MAX = 2**31 - 1  # the largest count of one MPI message (int)
OP_CODE = abi.OP_CODE  # csrc/kernel/abi.h AN_OP_*, checked at import (kernel/abi.py)


def payload_check_from_env() -> bool:
    """ALPHA_MPI_PAYLOAD_CHECK=1: a CRC32C of every payload travels in its header, and the flag
    rounds after the program carry a bad frame to every rank (opt-in)."""
    return os.environ.get("ALPHA_MPI_PAYLOAD_CHECK", "") not in ("", "0")


class Msg:
    """One message at this rank: its frame spec, its header buffer (with the payload behind it
    when the frame is one message), `pview`, its payload's memory when that is the engine's own
    (None: the caller's), and `pos`, its position in the C executor's message records."""

    __slots__ = (
        "m",
        "spec",
        "hbuf",
        "hmv",
        "region",
        "split",
        "nbytes",
        "peer",
        "tag",
        "what",
        "pview",
        "pos",
    )


class Compiled(Record):
    """One rank's program, built once: buffers, messages, the C executor and what binding a run
    needs to know."""

    __slots__ = (
        "rp",
        "n",
        "bufs",
        "msgs",
        "by_pos",
        "ops",
        "native",
        "ex",
        "bases",
        "slot_base",
        "bound_base",
        "internal_out",
        "small",
        "is_receiver",
        "keep",
    )

    def __init__(
        self,
        rp: RankProgram,
        n: int,
        bufs: dict,  # work buffer name -> float64 array (a framed one: the payload after its header)
        msgs: dict,  # message index -> Msg
        by_pos: tuple,  # Msg by its position in the C records
        ops: tuple,  # (kind, index) of every op the C round runs, in order (index: into the records)
        native: object,  # the extension module (ffi, lib)
        ex: object,  # the C executor (an_exec *)
        bases: object,  # its buffer base pointers (double *[]): the caller's are written per run
        slot_base: dict,  # slot -> its buffer number
        bound_base: dict,  # name in RankProgram.bound -> its buffer number (bound by the front end)
        internal_out: np.ndarray | None,  # the result buffer of small or aliased runs
        small: bool,  # results computed in internal_out, copied to the caller's `out` on success
        is_receiver: bool,
        keep: list,  # cdata and arrays that must live as long as the executor's records
    ) -> None:
        _set(self, "rp", rp)
        _set(self, "n", n)
        _set(self, "bufs", bufs)
        _set(self, "msgs", msgs)
        _set(self, "by_pos", by_pos)
        _set(self, "ops", ops)
        _set(self, "native", native)
        _set(self, "ex", ex)
        _set(self, "bases", bases)
        _set(self, "slot_base", slot_base)
        _set(self, "bound_base", bound_base)
        _set(self, "internal_out", internal_out)
        _set(self, "small", small)
        _set(self, "is_receiver", is_receiver)
        _set(self, "keep", keep)

    @property
    def messages_per_peer(self) -> int:
        """This rank's largest count of messages to or from one peer in a run (what its tag
        block must hold: the build agreement takes the largest over the ranks); flag-round
        frames travel on the block's flag tag and are not counted."""
        return 1 + max((m.seq for m in self.rp.messages.values()), default=-1)


def compile_program(program: Program, rank: int, contract: str, sequence: int = 0) -> Compiled:
    """Build rank `rank`'s part of `program`: buffers, headers and the C records (no
    communication; tags and requests come with `open_exec`). `sequence`: the executor's number
    on its communicator (endpoint.py), carried in every frame header so a frame of another
    executor is refused. A frame larger than one MPI message can be is refused here, before
    the build agreement (so every rank names it)."""
    nat = load_native()
    ffi = nat.ffi
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
    slot_base = {s: 1 + i for i, s in enumerate(rp.slots)}
    bound_base = {name: 1 + len(rp.slots) + i for i, name in enumerate(rp.bound)}
    first_static = 1 + len(rp.slots) + len(rp.bound)
    number = {"out": 0, **{f"L{s}": i for s, i in slot_base.items()}, **bound_base}
    bases = ffi.new("double *[]", first_static + len(rp.buffers))
    for i, b in enumerate(rp.buffers):
        number[b.name] = first_static + i
        ptr = ffi.from_buffer("double[]", bufs[b.name], True)
        keep.append(ptr)
        bases[first_static + i] = ptr
    internal_out = np.zeros(n) if any(r.buf == "out" for r in _regions(rp)) else None

    def region(r, into):
        into.buf, into.off = number[r.buf], r.offset

    msgs = {}
    order = sorted(rp.messages)
    cmsgs = ffi.new("an_msg[]", max(1, len(order)))
    for pos, i in enumerate(order):
        x = _message(program, rank, contract, sequence, rp.messages[i], rp.regions.get(i), bufs, framed)
        x.pos = pos
        msgs[i] = x
        if x.nbytes > _INT_MAX or x.m.count > _INT_MAX:
            raise KernelRefusal(
                "kernel-bad-argument",
                f"rank {rank}: {x.what} is larger than one MPI message can be ({x.nbytes} bytes)",
            )
        c = cmsgs[pos]
        c.index, c.peer, c.tag = x.m.index, x.peer, -1  # open_exec
        c.sending, c.split, c.count = int(x.m.src == rank), int(x.split), x.m.count
        hb = ffi.from_buffer("uint8_t[]", x.hbuf, True)
        expect = ffi.new("uint8_t[]", x.spec.expect)
        what = ffi.new("char[]", x.what.encode())
        keep.extend((hb, expect, what))
        c.hbuf, c.hbytes, c.expect, c.what = hb, x.nbytes, expect, what
        c.merge_min = int(x.m.seq == FLAG_SEQ)
        c.payload.buf = nat.lib.AN_NO_BUFFER
        if x.split:
            region(x.region, c.payload)
    ops = _ops(rp)
    cops = ffi.new("an_op[]", max(1, len(ops)))
    for j, (kind, index) in enumerate(ops):
        cops[j].kind = OP_CODE[kind]
        cops[j].index = msgs[index].pos if kind in "PSWD" else index
    evals = ffi.new("an_eval[]", max(1, len(rp.evals)))
    fused = {rp.ops[pos].index for pos in _fused_checks(rp, kernel.lib.AK_EVAL_CHECK_MAX_INPUTS)}
    for j, ev in enumerate(rp.evals):
        e = evals[j]
        ins = ffi.new("an_region[]", len(ev.inputs))
        for k, reg in enumerate(ev.inputs):
            region(reg, ins[k])
        prog = ffi.new("int32_t[]", list(ev.program))
        ptrs = ffi.new("double *[]", len(ev.inputs))
        keep.extend((ins, prog, ptrs))
        e.nin, e.count, e.prog, e.plen, e.inputs, e.ptrs = (
            len(ev.inputs),
            ev.output.count,
            prog,
            len(prog),
            ins,
            ptrs,
        )
        e.finite = int(j in fused)
        region(ev.output, e.out)
    copies = ffi.new("an_copy[]", max(1, len(rp.copies)))
    for j, (a, b) in enumerate(rp.copies):
        region(a, copies[j].src)
        region(b, copies[j].dst)
        copies[j].count = a.count
    checks = ffi.new("an_check[]", max(1, len(rp.checks)))
    for j, reg in enumerate(rp.checks):
        region(reg, checks[j].at)
        checks[j].count = reg.count
    merges = ffi.new("an_merge[]", max(1, len(rp.merges)))
    for j, mg in enumerate(rp.merges):
        c = merges[j]
        for field, reg in (
            ("a_head", mg.a[0]),
            ("a_nodes", mg.a[1]),
            ("b_head", mg.b[0]),
            ("b_nodes", mg.b[1]),
            ("out_head", mg.out[0]),
            ("out_nodes", mg.out[1]),
            ("n_word", mg.n),
        ):
            region(reg, getattr(c, field))
        c.k, c.capacity = mg.k, mg.capacity
    summaries = ffi.new("an_summary[]", max(1, len(rp.summaries)))
    for j, sm in enumerate(rp.summaries):
        c = summaries[j]
        c.k, c.tiles, c.capacity, c.row_words = sm.k, int(sm.tiles), sm.capacity, sm.row.count
        c.x0, c.geometry = number[sm.xs[0]], number[sm.geometry]
        c.y0 = nat.lib.AN_NO_BUFFER if sm.ys is None else number[sm.ys[0]]
        for field, reg in (
            ("head", sm.state[0]),
            ("nodes", sm.state[1]),
            ("row", sm.row),
            ("n_word", sm.n),
            ("result", sm.result),
        ):
            region(reg, getattr(c, field))
        scratch = ffi.new("double *[]", 2 * sm.k)
        keep.append(scratch)
        c.scratch = scratch
    roots = ffi.new("an_root[]", max(1, len(rp.roots)))
    for j, rt in enumerate(rp.roots):
        c = roots[j]
        c.k, c.table_words = rt.k, rt.table.count
        for field, reg in (
            ("table", rt.table),
            ("valid", rt.valid),
            ("final", rt.final[0]),
            ("n_word", rt.n),
            ("values", rt.values),
            ("verdict", rt.verdict),
        ):
            region(reg, getattr(c, field))
    keep.extend((cmsgs, cops, evals, copies, checks, merges, summaries, roots, bases))
    table = kernel.ffi.cast("uintptr_t", kernel.lib.ak_functions())
    ex = nat.lib.an_new(ffi.cast("void *", int(table)))
    if ex == ffi.NULL:
        raise MemoryError("the C executor could not be allocated")
    pg = ex.program  # the immutable part (native.h an_program); engine.py sets the policy
    pg.rank, pg.nops, pg.ops, pg.msgs, pg.nmsgs = rank, len(ops), cops, cmsgs, len(order)
    pg.evals, pg.copies, pg.checks, pg.merges = evals, copies, checks, merges
    pg.summaries, pg.roots = summaries, roots
    pg.bases, pg.nbases, pg.first_static = bases, len(bases), first_static
    res = rp.result
    if res is not None and res.buf == "out" and program.mode.whole:  # engine_bind.bind_out
        pg.deliver_from.buf, pg.deliver_from.off, pg.deliver_count = 0, res.offset, res.count
    return Compiled(
        rp=rp,
        n=n,
        bufs=bufs,
        msgs=msgs,
        by_pos=tuple(msgs[i] for i in order),
        ops=tuple(ops),
        native=nat,
        ex=ex,
        bases=bases,
        slot_base=slot_base,
        bound_base=bound_base,
        # Small results are computed in the internal buffer and copied to the caller's `out`
        # once the run succeeded, so a refused run leaves `out` as it was; results of 64 KiB and
        # more land in place (no copy), and `out` is unspecified after a refusal.
        internal_out=internal_out,
        small=not is_split(n),
        is_receiver=rp.result is not None and program.mode.whole,
        keep=keep,
    )


def open_exec(c: Compiled, comm: MPI.Comm, block, probe: bool) -> None:
    """Give every message of `c` its tags in the executor's `block` (endpoint.TagBlock: header
    base + 2 * seq, payload + 1; a flag-round frame the block's flag tag) and make the C
    executor's persistent requests on `comm` (local: no communication). `probe`: match every
    frame before receiving it (size-safe), where others can send on the executor's tags."""
    for x in c.by_pos:
        x.tag = block.flag_tag if x.m.seq == FLAG_SEQ else block.base + 2 * x.m.seq
        c.ex.program.msgs[x.pos].tag = x.tag
    c.ex.program.probe = int(probe)
    rc = c.native.lib.an_prepare(c.ex, comm.py2f())
    if rc != 0:
        raise mpi_failure(MPI.Exception(rc), c.rp.rank, "making the executor's persistent requests", 0)


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
    x.tag = None  # open_exec, once the build agreement gave the executor its tag block
    x.what = f"{fr.PHASE_NAME[fr.PHASE_CODE[m.phase]]} frame {m.index}"
    if x.split or m.count == 0:
        x.hbuf = np.zeros(fr.HEADER, dtype=np.uint8)
    else:
        x.hbuf = framed[region.buf][: fr.HEADER + 8 * m.count]
    x.hmv = memoryview(x.hbuf)
    x.nbytes = x.hbuf.nbytes
    x.pview = None
    if not x.split:
        x.pview = x.hbuf[fr.HEADER :]
    elif region.buf.startswith("w"):
        x.pview = bufs[region.buf][region.offset : region.offset + region.count]
    return x


def _ops(rp) -> list:
    """(kind, index) per op the C round runs: the planner's, without the F ops fused into the
    evaluation before them, with each receive posted no earlier than the completion of every
    send still reading its region (the module docstring says why)."""
    fused = set(_fused_checks(rp, kernel.lib.AK_EVAL_CHECK_MAX_INPUTS).values())
    ops = [(op.kind, op.index) for pos, op in enumerate(rp.ops) if pos not in fused]
    out = list(ops)
    for pos, (kind, m) in enumerate(ops):
        if kind != "P" or rp.regions.get(m) is None:
            continue
        target = rp.regions[m]
        wait = ops.index(("W", m), pos)
        after = pos
        for q in range(pos + 1, wait):
            k, s = ops[q]
            src = rp.regions.get(s) if k == "D" else None
            if src is not None and src.overlaps(target):
                after = q
        if after != pos:
            out.remove(("P", m))
            out.insert(out.index(ops[after]) + 1, ("P", m))
    return out


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


__all__ = ["Compiled", "compile_program", "open_exec", "payload_check_from_env", "Msg", "OP_CODE"]
