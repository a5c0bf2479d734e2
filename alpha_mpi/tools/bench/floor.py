"""THE FLOOR: the fastest allreduce this design could be in Python + mpi4py, timed beside it.

A bare recursive-doubling exchange: persistent requests (Send_init / Recv_init, made once), one
Startall + Waitall and one `np.add` per round, no headers, no checks, no kernel. Whatever the
engine spends above it (frame headers, identity checks, the fused evaluation, the finiteness
check, the flag vote) is the price of the declared order and its refusals; `auto / floor` in
the table is that price. Its summation order is recursive doubling's, not the declared tree's,
so its bits are timed, never used.

Any p: the ranks beyond the largest power of two 2^k first fold into rank r - 2^k (one message),
the first 2^k ranks run k rounds of recursive doubling, then send the result back (one message).
Only tools/bench makes raw MPI requests outside execution/ (a benchmark baseline).
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

TAG = 29  # COMM_WORLD is the harness's own: no user traffic shares it during a benchmark


class Floor:
    """Recursive doubling on `comm` over float64 vectors of len(send): `run()` leaves the sum in
    `recv`; `refill()` restores the input (outside the timed region)."""

    name = "floor"

    def __init__(self, comm, send: np.ndarray, recv: np.ndarray):
        self.send, self.recv = send, recv
        p, r = comm.Get_size(), comm.Get_rank()
        self.tmp = np.empty_like(recv)
        pof2 = 1 << (p.bit_length() - 1)
        self.pre, self.rounds, self.post = [], [], []  # (requests, whether to add tmp afterwards)
        if r >= pof2:  # fold into the partner below, take its result back
            self.pre.append(([comm.Send_init(recv, dest=r - pof2, tag=TAG)], False))
            self.post.append(([comm.Recv_init(recv, source=r - pof2, tag=TAG)], False))
        else:
            if r + pof2 < p:
                self.pre.append(([comm.Recv_init(self.tmp, source=r + pof2, tag=TAG)], True))
                self.post.append(([comm.Send_init(recv, dest=r + pof2, tag=TAG)], False))
            bit = 1
            while bit < pof2:
                peer = r ^ bit
                reqs = [
                    comm.Recv_init(self.tmp, source=peer, tag=TAG),
                    comm.Send_init(recv, dest=peer, tag=TAG),
                ]
                self.rounds.append((reqs, True))
                bit <<= 1
        self.refill()

    def run(self) -> np.ndarray:
        for reqs, add in self.pre + self.rounds + self.post:
            MPI.Prequest.Startall(reqs)
            MPI.Request.Waitall(reqs)
            if add:
                np.add(self.recv, self.tmp, out=self.recv)
        return self.recv

    def refill(self) -> None:
        self.recv[...] = self.send

    def close(self) -> None:
        for reqs, _ in self.pre + self.rounds + self.post:
            for q in reqs:
                q.Free()
        self.pre, self.rounds, self.post = [], [], []
