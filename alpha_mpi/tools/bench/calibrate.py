"""`alpha-mpi bench calibrate`: measure the α, β, γ of `auto`'s cost model on this machine.

    mpiexec -n 2 alpha-mpi bench calibrate --out calibration.json
    export ALPHA_MPI_CALIBRATION=$PWD/calibration.json      # then every rank reads the same file

α (seconds per message round) and α0 (seconds per run, whatever the rounds): one-element runs of
alpha_mpi's executor with two realizations of the pairwise tree that differ in rounds (butterfly
and tree: reduce up, deliver down): α is the difference of their times per extra round, α0 what
the butterfly run costs beyond its rounds (the call into the executor). α_msg (seconds per
further message in a round): a one-element exchange between ranks 0 and 1 through mpi4py's
buffer Sendrecv alone, the MPI cost of one message with mpi4py's call around it (an upper bound). β (seconds
per byte moved): a large exchange between ranks 0 and 1 (mpi4py buffer Sendrecv). γ (seconds per
byte added): the kernel's add of two large vectors. Each figure is the median of --iters runs,
the worst over ranks. The harness times with Barrier and reduces its timings with buffer
collectives (never data of a combine).
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ... import kernel
from ...execution import Allreducer
from ...model import pairwise
from .._args import path
from .harness import RankParser, check_outputs, slowest, statistic, timed
from .results import write_json


def _median(f, iters, comm):
    """The median of `iters` timed runs of f() on this rank, the worst over ranks."""
    return slowest(comm, statistic([timed(comm, f)[0] for _ in range(iters)], "median"))


def cmd(comm, argv) -> int:
    rank, p = comm.Get_rank(), comm.Get_size()
    parser = RankParser(rank, prog="alpha-mpi bench calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=path, required=True, metavar="FILE", help="write the calibration JSON here (rank 0)"
    )
    parser.add_argument("--iters", type=int, default=200, help="runs per figure (default 200)")
    parser.add_argument("--mib", type=int, default=8, help="MiB moved / added for β and γ (default 8)")
    try:
        a = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    check_outputs(comm, [("--out", a.out, True)])
    if p < 2:
        if rank == 0:
            print("alpha-mpi bench calibrate: run it under mpiexec -n 2 or more (it measures messages)")
        return 2
    tree = pairwise(range(p), p)
    few, many = (Allreducer(comm, tree, 1, realization=r) for r in ("butterfly", "tree"))
    x = np.ones(1)
    for _ in range(10):
        few.run({rank: x})
        many.run({rank: x})
    t_few = _median(lambda: few.run({rank: x}), a.iters, comm)
    t_many = _median(lambda: many.run({rank: x}), a.iters, comm)
    extra = max(1, many.plan.rounds - few.plan.rounds)
    alpha = max(0.0, t_many - t_few) / extra
    alpha0 = max(0.0, t_few - few.plan.rounds * alpha)
    n = (a.mib << 20) // 8
    buf, got = np.ones(n), np.empty(n)
    peer = {0: 1, 1: 0}.get(rank)

    def exchange():
        if peer is not None:
            comm.Sendrecv(buf, dest=peer, recvbuf=got, source=peer)

    beta = _median(exchange, max(5, a.iters // 20), comm) / (8 * n)
    one, one_got = np.ones(1), np.empty(1)

    def message():
        if peer is not None:
            comm.Sendrecv(one, dest=peer, recvbuf=one_got, source=peer)

    alpha_msg = _median(message, a.iters, comm)
    y = np.ones(n)
    gamma = _median(lambda: kernel.add(got, buf, y), max(5, a.iters // 20), comm) / (8 * n)
    doc = {
        "alpha0": alpha0,
        "alpha": alpha,
        "alpha_msg": alpha_msg,
        "beta": beta,
        "gamma": gamma,
        "ranks": p,
        "host": MPI.Get_processor_name(),
        "mpi": MPI.Get_library_version().splitlines()[0].strip(),
        "measured_with": f"butterfly ({few.plan.rounds} rounds) and tree ({many.plan.rounds} rounds)",
    }
    if rank == 0:
        write_json(a.out, doc, "--out")
        print(
            f"alpha0 {alpha0 * 1e6:.2f} us/run   alpha {alpha * 1e6:.2f} us/round   alpha_msg {alpha_msg * 1e6:.2f} us/message   "
            f"beta {beta * 1e9:.3f} ns/B   gamma {gamma * 1e9:.3f} ns/B  -> {a.out}"
        )
    few.free()
    many.free()
    return 0
