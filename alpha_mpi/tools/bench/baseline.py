"""THE BASELINES: the library collectives alpha_mpi is measured against.

This is the only module of alpha_mpi where a collective touches data: MPI_Allreduce (whatever
algorithm MPICH / Open MPI picks, or the one forced through the environment, e.g.
MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=ring), where torch is importable torch.distributed's gloo
all_reduce, and for `bench allreduce --reduce-scatter` MPI_Reduce_scatter_block and the
fixed-root MPI_Reduce + MPI_Scatter. (The bare point-to-point floor is in floor.py.) Their
results are timed, never used: their summation order belongs to the library and changes with
the rank count and the message size.
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


def init_gloo(comm, backend: str = "gloo"):
    """torch.distributed over gloo (or `backend`, e.g. nccl) on localhost, ranks and world size
    from `comm` (once per process); returns torch.distributed. Rank 0 picks a free port and
    broadcasts it."""
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
        backend,
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


class MpiReduceScatterBlock:
    """comm.Reduce_scatter_block(send, recv, MPI.SUM): rank r ends with block r of m = ⌈n/p⌉
    values (the input padded with zeros to p*m, outside the timed region)."""

    name = "MPI_Reduce_scatter_block"

    def __init__(self, comm, send, block: int):
        p = comm.Get_size()
        self.comm, self.lo = comm, comm.Get_rank() * block
        self.send = np.zeros(p * block)
        self.send[: len(send)] = send
        self.recv = np.empty(block)

    def run(self):
        self.comm.Reduce_scatter_block(self.send, self.recv, op=MPI.SUM)
        return self.recv

    def refill(self):
        pass

    def close(self):
        pass


class MpiReduceThenScatter:
    """The fixed-root deterministic reduce-scatter production stacks use (vLLM): MPI_Reduce of
    the whole vector to rank 0 (one library order, fixed for one p and size), then MPI_Scatter of
    its blocks of m = ⌈n/p⌉ values."""

    name = "MPI_Reduce+Scatter"

    def __init__(self, comm, send, block: int):
        p = comm.Get_size()
        self.comm, self.lo = comm, comm.Get_rank() * block
        self.send = np.zeros(p * block)
        self.send[: len(send)] = send
        self.whole = np.empty(p * block) if comm.Get_rank() == 0 else None
        self.recv = np.empty(block)

    def run(self):
        self.comm.Reduce(self.send, self.whole, op=MPI.SUM, root=0)
        self.comm.Scatter(self.whole, self.recv, root=0)
        return self.recv

    def refill(self):
        pass

    def close(self):
        pass
