"""Assembly over MPI: the full vector built by selection from owners of disjoint ranges.

No arithmetic: every word is copied from exactly the owner that holds it. The plan
(planning/assembly.py) has already refused overlaps and holes. Frames are checked like combine
frames (phase "assemble"), receives name their source and have the exact piece size.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..planning.assembly import AssemblyPlan
from ..refusals import PlanRefusal, Refusal
from .frames import FrameSpec, frame_buffer, payload
from .transport import TAG, Waiter, cancel_receives, debug_enabled, library_comm, log, mark_broken


class Assembler:
    """Assembles one AssemblyPlan repeatedly. Build it on every rank of `comm`."""

    def __init__(self, comm, aplan: AssemblyPlan, *, timeout=None, contract: str = "", dup: bool = True):
        size = comm.Get_size()
        if aplan.size != size:
            raise PlanRefusal(
                "plan-rank-mismatch", f"assembly plan is for {aplan.size} ranks, communicator has {size}"
            )
        self.plan = aplan
        self.comm = library_comm(comm) if dup else comm
        self.rank = rank = self.comm.Get_rank()
        self.waiter = Waiter(self.comm, timeout)
        self.timeout = self.waiter.timeout
        self.debug = debug_enabled()
        self.step = 0
        self.broken = None
        self.own = [(a, b) for o, a, b in aplan.pieces if o == rank]
        self.recvs, self.sends = [], []
        for s in aplan.programs[rank]:
            o, a, b = aplan.piece_of_edge(s.index)
            src, dst = (s.peer, rank) if s.kind == "R" else (rank, s.peer)
            spec = FrameSpec(
                phase="a",
                edge=s.index,
                sender=src,
                receiver=dst,
                count=b - a,
                topology="assembly",
                order_id="selection",
                identity=aplan.identity,
                layout_key=f"range:{a}:{b}",
                contract=contract,
            )
            buf = frame_buffer(b - a)
            if s.kind == "R":
                req = self.comm.Recv_init(buf, source=s.peer, tag=TAG["a"])
                self.recvs.append((s, spec, buf, payload(buf), (a, b), req, MPI.Status()))
            else:
                req = self.comm.Send_init(buf, dest=s.peer, tag=TAG["a"])
                self.sends.append((s, spec, buf, payload(buf), (a, b), req))
        # Receives are started in edge order, sends go out in edge order: MPI pairs them in order.
        self.recvs.sort(key=lambda r: r[0].index)
        self.flags = 0
        self.sends.sort(key=lambda x: x[0].index)

    def run(self, pieces: dict, out=None, flags: int = 0):
        """`pieces` maps (start, stop) -> float64 array for every range this rank owns.

        Returns the full vector on receivers, else None (an `out` array is then left untouched).
        `flags` (a small int) travels in this rank's frame headers; afterwards `self.flags` is the
        OR of this rank's and every received frame's flags: a one-bit vote riding on the data.
        """
        if self.broken is not None:
            raise Refusal("combiner-broken", f"an earlier assembly refused with [{self.broken}]")
        missing = [r for r in self.own if r not in pieces]
        extra = [r for r in pieces if r not in self.own]
        if missing or extra:
            raise Refusal(
                "contribution-missing" if missing else "contribution-unexpected",
                f"rank {self.rank} owns ranges {self.own}, got {sorted(pieces)}",
            )
        for (a, b), v in pieces.items():
            if not isinstance(v, np.ndarray) or v.dtype != np.float64 or v.size != b - a:
                raise Refusal("contribution-shape", f"range [{a}, {b}) needs {b - a} float64 values")
        self.flags = flags
        try:
            for r in self.recvs:
                r[5].Start()
            for s, spec, buf, pl, (a, b), req in self.sends:
                np.copyto(pl, pieces[(a, b)])
                spec.write(buf, self.step, flags)
                req.Start()
                if self.debug:
                    log(self.rank, f"send -> {s.peer} edge {s.index} step {self.step} {buf.nbytes}B")
            receiver = self.rank in self.plan.receivers
            if receiver:
                if out is None:
                    out = np.empty(self.plan.n)
                for (a, b), v in pieces.items():
                    out[a:b] = v
            for s, spec, buf, pl, (a, b), req, status in self.recvs:
                self.waiter.wait(req, status, s.peer, f"assemble frame {s.index}", self.step)
                self.flags |= spec.check(buf, self.step, status.Get_count(MPI.BYTE))
                if self.debug:
                    log(self.rank, f"recv <- {s.peer} edge {s.index} step {self.step} {buf.nbytes}B")
                out[a:b] = pl
            for s, _spec, _buf, _pl, _rng, req in self.sends:
                self.waiter.wait(req, None, s.peer, f"assemble frame {s.index}", self.step)
            return out if receiver else None
        except Refusal as e:
            self.broken = e.code
            cancel_receives([r[5] for r in self.recvs])  # never a send: see transport
            mark_broken(self.rank, e.code, [x[5] for x in self.sends])
            raise
        finally:
            self.step += 1


def assemble(comm, aplan: AssemblyPlan, pieces: dict, out=None, *, timeout=None):
    """One-shot assembly (builds an Assembler, so it duplicates the communicator: all ranks call)."""
    return Assembler(comm, aplan, timeout=timeout).run(pieces, out=out)
