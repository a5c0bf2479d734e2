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
from .frames import FLAG_REFUSED, FrameSpec, frame_buffer, payload, refusal_of
from .transport import TAG, Endpoint, cancel_receives, log, mark_broken


class Assembler(Endpoint):
    """Assembles one AssemblyPlan repeatedly. Build it on every rank of `comm`."""

    def __init__(
        self,
        comm: MPI.Comm,
        aplan: AssemblyPlan,
        *,
        timeout: float | None = None,
        contract: str = "",
        dup: bool = True,
    ) -> None:
        size = comm.Get_size()
        if aplan.size != size:
            raise PlanRefusal(
                "plan-rank-mismatch", f"assembly plan is for {aplan.size} ranks, communicator has {size}"
            )
        self.plan = aplan
        bad_bound = self._open(comm, timeout, dup)  # a bad timeout= is refused, as before
        if bad_bound is not None:
            raise bad_bound
        rank = self.rank
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

    def run(
        self, pieces: dict[tuple[int, int], np.ndarray], out: np.ndarray | None = None, flags: int = 0
    ) -> np.ndarray | None:
        """`pieces` maps (start, stop) -> float64 array for every range this rank owns.

        Returns the full vector on receivers, else None (an `out` array is then left untouched).
        `flags` (0 or 1) travels in this rank's frame headers; afterwards `self.flags` is the OR
        of this rank's and every received frame's flags: a one-bit vote riding on the data.
        `out`: a writeable float64 vector of n elements (where given, on any rank).

        Bad pieces on one rank do not leave the others waiting: that rank sends zeros in frames
        flagged with its rank and code, every rank completes the round, then it raises its own
        refusal and every rank its frames reached raises `peer-refused` naming it (a receiver's
        `out` is then unspecified). The next run works.
        """
        if self.broken is not None:
            raise Refusal("combiner-broken", f"an earlier assembly refused with [{self.broken}]")
        local = self._refusal_of(pieces, out, flags)
        if local is not None:  # the round still runs, on zeros, into a buffer it can write
            flags = 0
            out = out if self._out_ok(out) else None
            pieces = {(a, b): np.zeros(b - a) for a, b in self.own}
            flags |= FLAG_REFUSED
        self.flags = flags
        who = None
        try:
            for r in self.recvs:
                r[5].Start()
            for s, spec, buf, pl, (a, b), req in self.sends:
                np.copyto(pl, pieces[(a, b)])
                if local is None:
                    spec.write(buf, self.step, flags)
                else:
                    spec.write(buf, self.step, flags, refused=self.rank, code=local.code)
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
                got = spec.check(buf, self.step, status.Get_count(MPI.BYTE))
                if got & FLAG_REFUSED and who is None:
                    who = refusal_of(memoryview(buf))
                self.flags |= got
                if self.debug:
                    log(self.rank, f"recv <- {s.peer} edge {s.index} step {self.step} {buf.nbytes}B")
                out[a:b] = pl
            for s, _spec, _buf, _pl, _rng, req in self.sends:
                self.waiter.wait(req, None, s.peer, f"assemble frame {s.index}", self.step)
        except Refusal as e:
            self.broken = e.code
            cancel_receives([r[5] for r in self.recvs])  # never a send: see transport
            mark_broken(self.rank, e.code, [x[5] for x in self.sends])
            raise
        finally:
            self.step += 1
        if local is not None:
            raise local
        if who is not None:
            raise Refusal(
                "peer-refused",
                f"rank {who[0]} refused assembly step {self.step - 1} [{who[1]}]; nothing was assembled",
                peer=who[0],
                peer_code=who[1],
            )
        return out if receiver else None

    def _out_ok(self, out) -> bool:
        return out is None or (
            isinstance(out, np.ndarray)
            and out.dtype == np.float64
            and out.shape == (self.plan.n,)
            and out.flags.writeable
            and out.flags.c_contiguous
        )

    def _refusal_of(self, pieces, out, flags):
        """The Refusal this rank's arguments earn (None when they are what it owns, an `out` it
        can write the whole vector to, and a one-bit vote)."""
        if not self._out_ok(out):
            return Refusal("out-invalid", f"out must be a writeable float64 vector of {self.plan.n} elements")
        if flags not in (0, 1):
            return Refusal("usage", f"flags is a one-bit vote (0 or 1), got {flags!r}")
        if not isinstance(pieces, dict):
            return Refusal(
                "contribution-shape",
                f"pieces must be a dict (start, stop) -> array, got {type(pieces).__name__}",
            )
        missing = [r for r in self.own if r not in pieces]
        extra = [r for r in pieces if r not in self.own]
        if missing or extra:
            return Refusal(
                "contribution-missing" if missing else "contribution-unexpected",
                f"rank {self.rank} owns ranges {self.own}, got {list(pieces)}",
            )
        for (a, b), v in pieces.items():
            if not isinstance(v, np.ndarray) or v.dtype != np.float64 or v.shape != (b - a,):
                return Refusal(
                    "contribution-shape", f"range [{a}, {b}) needs a float64 vector of {b - a} values"
                )
        return None

    def free(self) -> None:
        """Free the persistent requests (and the duplicated communicator, if this made one)."""
        for x in self.recvs + self.sends:
            try:
                x[5].Free()
            except Exception:
                pass
        self.recvs, self.sends = [], []
        if self._owns_comm:
            self._owns_comm = False
            self.comm.Free()


def assemble(
    comm: MPI.Comm,
    aplan: AssemblyPlan,
    pieces: dict[tuple[int, int], np.ndarray],
    out: np.ndarray | None = None,
    *,
    timeout: float | None = None,
) -> np.ndarray | None:
    """One-shot assembly (builds an Assembler, so it duplicates the communicator: all ranks call)."""
    return Assembler(comm, aplan, timeout=timeout).run(pieces, out=out)
