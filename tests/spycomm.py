"""A communicator proxy that refuses every data collective and every pickling method.

The combine suite runs on it: if any code path used MPI_Allreduce & co. or a lower-case
(pickle-based) mpi4py method, the test fails with the name of the call.
"""

FORBIDDEN = {
    # data collectives, blocking and non-blocking, and persistent/neighbourhood variants
    "Allreduce",
    "Iallreduce",
    "Reduce",
    "Ireduce",
    "Bcast",
    "Ibcast",
    "Allgather",
    "Iallgather",
    "Allgatherv",
    "Iallgatherv",
    "Gather",
    "Igather",
    "Gatherv",
    "Igatherv",
    "Scatter",
    "Iscatter",
    "Scatterv",
    "Iscatterv",
    "Alltoall",
    "Ialltoall",
    "Alltoallv",
    "Ialltoallv",
    "Alltoallw",
    "Ialltoallw",
    "Scan",
    "Iscan",
    "Exscan",
    "Iexscan",
    "Reduce_scatter",
    "Ireduce_scatter",
    "Reduce_scatter_block",
    "Ireduce_scatter_block",
    "Allreduce_init",
    "Bcast_init",
    "Reduce_init",
    "Neighbor_allgather",
    "Neighbor_alltoall",
    # pickle-based point-to-point and collectives
    "send",
    "recv",
    "isend",
    "irecv",
    "ssend",
    "issend",
    "bsend",
    "ibsend",
    "sendrecv",
    "mprobe",
    "improbe",
    "bcast",
    "gather",
    "scatter",
    "allgather",
    "alltoall",
    "reduce",
    "allreduce",
    "scan",
    "exscan",
    "barrier",
    "ibarrier",
}


class CollectiveUsed(AssertionError):
    pass


class SpyComm:
    def __init__(self, comm):
        self._comm = comm
        self.calls = []

    def __getattr__(self, name):
        if name in FORBIDDEN:
            raise CollectiveUsed(
                f"alpha_mpi called comm.{name}: data must move by planned point-to-point only"
            )
        attr = getattr(self._comm, name)
        if name in ("Dup", "Clone", "Create", "Split"):

            def wrapped(*a, **k):
                self.calls.append(name)
                return SpyComm(attr(*a, **k))

            return wrapped
        if name == "Idup":

            def wrapped_idup(*a, **k):
                self.calls.append(name)
                comm, req = attr(*a, **k)
                return SpyComm(comm), req

            return wrapped_idup
        if callable(attr):

            def recorded(*a, **k):
                self.calls.append(name)
                if name in ("Recv_init", "Irecv", "Recv", "Improbe", "Mprobe", "Iprobe", "Probe"):
                    at = 0 if name.endswith("probe") else 1  # (source, tag, ...) or (buf, source, ...)
                    src = k.get("source", a[at] if len(a) > at else None)
                    if src is None or src < 0:
                        raise CollectiveUsed(f"comm.{name} without a named source")
                return attr(*a, **k)

            return recorded
        return attr
