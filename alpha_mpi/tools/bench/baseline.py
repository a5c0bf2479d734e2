"""THE BASELINES: the library allreduce collectives alpha_mpi is measured against.

This is the only module of alpha_mpi where a collective touches data: MPI_Allreduce (whatever
algorithm MPICH / Open MPI picks, or the one forced through the environment, e.g.
MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=ring) and, where torch is importable, torch.distributed's
gloo all_reduce. Their results are timed, never used: their summation order belongs to the
library and changes with the rank count and the message size.
"""

from __future__ import annotations

import os
import socket

import numpy as np
from mpi4py import MPI


class MpiAllreduce:
    """comm.Allreduce(send, recv, MPI.SUM) on float64 buffers (out of place, like alpha_mpi)."""

    name = "MPI_Allreduce"

    def __init__(self, comm, send, recv):
        self.comm, self.send, self.recv = comm, send, recv

    def run(self):
        self.comm.Allreduce(self.send, self.recv, op=MPI.SUM)
        return self.recv

    def refill(self):
        pass

    def close(self):
        pass


def mpi_algorithm() -> str:
    """The MPICH allreduce algorithm forced by the environment ('auto' when none is)."""
    return os.environ.get("MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM", "auto") or "auto"


_GLOO = {"group": None}


def init_gloo(comm):
    """torch.distributed over gloo on localhost, ranks and world size from `comm` (once per
    process); returns torch.distributed. Rank 0 picks a free port and broadcasts it."""
    import torch.distributed as dist

    if dist.is_initialized():
        return dist
    port = np.zeros(1, dtype=np.int64)
    if comm.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port[0] = s.getsockname()[1]
    comm.Bcast(port, root=0)  # harness-side set-up, not data; a buffer, never a pickle
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{int(port[0])}",
        rank=comm.Get_rank(),
        world_size=comm.Get_size(),
    )
    return dist


def gloo_available() -> bool:
    try:
        import torch.distributed as dist  # noqa: F401
    except Exception:
        return False
    return dist.is_available() and dist.is_gloo_available()


class GlooAllreduce:
    """torch.distributed.all_reduce (gloo, in place) on a tensor sharing memory with `recv`;
    `refill()` restores the input outside the timed region."""

    name = "gloo"

    def __init__(self, comm, send, recv):
        import torch

        self.dist = init_gloo(comm)
        self.send, self.recv = send, recv
        self.tensor = torch.from_numpy(recv)
        self.refill()

    def run(self):
        self.dist.all_reduce(self.tensor)
        return self.recv

    def refill(self):
        self.recv[...] = self.send

    def close(self):
        pass
