"""Binding the caller's memory to an Engine run: contributions, `out`, and shaping the result or
the refusal after the walk (a mixin of engine.Engine; per call, outside the op loop)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..refusals import PlanRefusal, Refusal
from . import frames as fr
from .contributions import Contributions, check_contributions, refuse_nonfinite

_F64 = np.dtype(np.float64)
_MISSING = object()


class Chunk(NamedTuple):
    """A reduce-scatter result: this rank's coordinates start..stop-1 and their values."""

    start: int
    stop: int
    values: np.ndarray


class EngineBinding:
    """Per-run binding of contributions and `out`, and the end of a run (see engine.py)."""

    def reduce_scatter_run(
        self, contributions: Contributions, out: np.ndarray | None = None, *, timeout: float | None = None
    ) -> Chunk:
        """Reduce-scatter programs only: run once and return Chunk(start, stop, values). `out`:
        an array of the chunk's length, or of the whole payload (written at out[start:stop])."""
        if self.program.mode != "reduce-scatter":
            raise PlanRefusal(
                "plan-delivery-mismatch",
                "this executor delivers the whole result; build it with mode='reduce-scatter'",
            )
        values = self.run(contributions, out=out, timeout=timeout)
        return Chunk(self.chunk[0], self.chunk[1], values)

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

    def _zero_leaves(self) -> dict:
        """Zeros in place of every leaf (of its own length: `RankProgram.inputs`)."""
        if self._zeros is None:
            self._zeros = np.zeros(max([self.n, *self.rp.inputs.values()]))
        counts = self.rp.inputs
        return {s: self._zeros[: counts.get(s, self.n)] for s in self.slots}

    def _zero_payload(self, x, arrays) -> None:
        """Zeros over what message x brought (a refused frame is never read)."""
        if x.split:
            self._payload(x, arrays)[:] = 0.0
        else:
            x.hbuf[fr.HEADER :] = 0

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
        if self._bad is not None:
            raise self._bad
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
            return chunk
        if res.buf != "out":  # pragma: no cover - allreduce results always land in `out`
            raise PlanRefusal("plan-simulation-failed", "an allreduce result outside `out`")
        if out is None:
            return outarr.copy() if outarr is self._internal_out else outarr
        if outarr is self._internal_out:  # small, or `out` aliased a contribution
            np.copyto(out.reshape(-1), outarr)
        return out
