"""Walking a compiled program: one small function per op kind, over one run's state.

The walk is `for fn, rec in table: fn(state, rec)` (engine.py). Each function reads its named
record (engine_build) and the run's `RunState`: the flags seen so far (they ride on every later
send), the refusing rank and code they name, the first bad frame, and the pointers into the
caller's memory. The hot path is latency-bound, so these functions do only what the op needs:
a good frame costs one bytes comparison (frames.FrameSpec.fast_check); the naming of a bad
header (frames.FrameSpec.check, via inbound.py) and the zeroing of a refused frame run only on
the bad path.

W receives size-safely (inbound.py: matched first, received only into a buffer of its own
size; the planner's P ops compile to nothing). A bad frame (a header that is not the planned
one, another size, a payload that fails its crc) is refused here and flagged onwards like a
local refusal: the program goes on over zeros in place of the frame's payload, so no
arithmetic reads it and every rank the flag reaches names this rank and code (engine.py
decides afterwards whether the engine stays usable).
"""

from __future__ import annotations

import zlib

from ..refusals import FrameRefusal, KernelRefusal
from . import frames as fr
from .engine_ops import merge as _merge
from .inbound import receive_header, receive_payload
from .log import log

_FOLDED = fr.FLAG_NONFINITE | fr.FLAG_REFUSED | fr.FLAG_VOTE  # what a received frame passes on
_NO_CODE = b"\0\0\0\0"


class RunState:
    """What one run of an engine carries from op to op (reset by `begin` for every run)."""

    __slots__ = (
        "comm",
        "waiter",
        "rank",
        "lib",
        "ffi",
        "bases",
        "arrays",
        "debug",
        "step",
        "timeout",
        "check_payload",
        "send_hook",
        "flags",
        "who",
        "refused",
        "code",
        "bad",
        "nonfinite",
    )

    def __init__(self, comm, waiter, rank, lib, ffi, debug):
        self.comm, self.waiter, self.rank, self.lib, self.ffi = comm, waiter, rank, lib, ffi
        self.bases: dict = {}  # buffer name -> cdata pointer (the caller's arrays)
        self.arrays: dict = {}  # buffer name -> the caller's array
        self.debug = debug
        self.bad = None
        self.nonfinite = ffi.new("int32_t *")  # ak_tree_eval_finite's verdict

    def begin(self, step, timeout, local, vote, check_payload, send_hook) -> None:
        """Reset for a run; `local`: this rank's refusal of its inputs (flagged from the start)."""
        self.step, self.timeout = step, timeout
        self.check_payload, self.send_hook = check_payload, send_hook
        self.flags = (fr.FLAG_REFUSED if local is not None else 0) | (fr.FLAG_VOTE if vote else 0)
        self.who = (self.rank, local.code) if local is not None else None
        self.code = fr.code_tag(local.code) if local is not None else _NO_CODE
        self.refused = self.rank if local is not None else -1
        self.bad = None


def payload_of(x, arrays):
    """The payload memory of message x at this rank (its frame buffer or its region)."""
    if x.pview is not None:
        return x.pview
    reg = x.region
    return arrays[reg.buf][reg.offset : reg.offset + reg.count]


def evaluate(st: RunState, op) -> None:
    ptrs, bases = op.ptrs, st.bases
    for j, b, off in op.dyn:
        ptrs[j] = bases[b] + off
    out = op.out_ptr if op.out_ptr is not None else bases[op.out_buf] + op.out_off
    status = st.lib.ak_tree_eval(out, ptrs, op.nin, op.count, op.prog, op.plen)
    if status:
        raise KernelRefusal(
            "kernel-bad-argument", f"rank {st.rank}: the kernel refused an evaluation (status {status})"
        )


def evaluate_checked(st: RunState, op) -> None:
    """An E op and the F op of its output in one kernel call (engine_build._fused_checks)."""
    ptrs, bases = op.ptrs, st.bases
    for j, b, off in op.dyn:
        ptrs[j] = bases[b] + off
    out = op.out_ptr if op.out_ptr is not None else bases[op.out_buf] + op.out_off
    nf = st.nonfinite
    status = st.lib.ak_tree_eval_finite(out, ptrs, op.nin, op.count, op.prog, op.plen, nf)
    if status:
        raise KernelRefusal(
            "kernel-bad-argument", f"rank {st.rank}: the kernel refused an evaluation (status {status})"
        )
    if nf[0]:
        st.flags |= fr.FLAG_NONFINITE


def send(st: RunState, x) -> None:
    view = payload_of(x, st.arrays) if x.dyn else None
    hmv = x.hmv
    hmv[:124] = x.spec.expect  # the buffer may have held a received header
    if st.check_payload and x.m.count:
        crc = zlib.crc32(view if view is not None else x.pview)
        fr.patch(hmv, st.step, st.flags | fr.FLAG_PAYLOAD_CRC, st.refused, st.code, crc)
    else:
        fr.patch(hmv, st.step, st.flags, st.refused, st.code)
    if st.send_hook is not None:
        st.send_hook(x.m.index, hmv)
    x.hreq.Start()
    if x.split:
        if x.dyn:
            x.preq = st.comm.Isend(view, dest=x.peer, tag=x.tag + 1)
        else:
            x.preq.Start()
    if st.debug:
        log(st.rank, f"send -> {x.peer} {x.what} step {st.step} {fr.HEADER + 8 * x.m.count}B")


def wait(st: RunState, x) -> None:
    comm, waiter, step, timeout = st.comm, st.waiter, st.step, st.timeout
    bad, f = None, 0
    try:
        f = receive_header(comm, waiter, x, step, timeout)
    except FrameRefusal as e:
        bad = e
    # A split frame's payload is awaited unless its header message had another size: then the
    # peer is not sending this frame (another program), and no payload of it is coming.
    if x.split and (bad is None or x.got == x.nbytes):
        try:
            receive_payload(comm, waiter, x, step, timeout, payload_of(x, st.arrays))
        except FrameRefusal as e:
            bad = bad or e
        except Exception:
            if bad is not None:  # the bad header came first and explains the rest
                _refuse_frame(st, x, bad)
            raise
    if bad is None and f & fr.FLAG_PAYLOAD_CRC:
        if zlib.crc32(payload_of(x, st.arrays)) != fr.payload_crc_of(x.hmv):
            bad = FrameRefusal(
                "frame-payload-corrupt",
                f"rank {st.rank}: the payload of {x.what} from rank {x.peer} (step {step}) fails its crc32",
                peer=x.peer,
                step=step,
            )
    if bad is not None:
        _refuse_frame(st, x, bad)
        return
    if f & fr.FLAG_REFUSED and st.who is None:
        st.who = fr.refusal_of(x.hmv)
        st.refused, st.code = st.who[0], fr.code_tag(st.who[1])
    st.flags |= f & _FOLDED
    if st.debug:
        log(st.rank, f"recv <- {x.peer} {x.what} step {step} {fr.HEADER + 8 * x.m.count}B")


def _refuse_frame(st: RunState, x, bad: FrameRefusal) -> None:
    """Record the first bad frame, put zeros where its payload landed, flag it onwards."""
    if st.bad is None:
        st.bad = bad
    payload_of(x, st.arrays)[:] = 0
    if st.who is None:
        st.who, st.refused, st.code = (st.rank, bad.code), st.rank, fr.code_tag(bad.code)
    st.flags |= fr.FLAG_REFUSED


def done(st: RunState, x) -> None:
    """D: the send's buffers may be written again."""
    st.waiter.wait(x.hreq, None, x.peer, x.what, st.step, st.timeout)
    if x.split:
        st.waiter.wait(x.preq, None, x.peer, x.what + " payload", st.step, st.timeout)


def copy(st: RunState, op) -> None:
    bases = st.bases
    st.ffi.memmove(
        op.dst_ptr if op.dst_ptr is not None else bases[op.dst_buf] + op.dst_off,
        op.src_ptr if op.src_ptr is not None else bases[op.src_buf] + op.src_off,
        op.nbytes,
    )


def check(st: RunState, op) -> None:
    ptr = op.ptr if op.ptr is not None else st.bases[op.buf] + op.off
    if st.lib.ak_first_nonfinite(ptr, op.count) >= 0:
        st.flags |= fr.FLAG_NONFINITE


def merge(st: RunState, op) -> None:
    _merge(st.lib, op)


__all__ = [
    "RunState",
    "payload_of",
    "evaluate",
    "evaluate_checked",
    "send",
    "wait",
    "done",
    "copy",
    "check",
    "merge",
]
