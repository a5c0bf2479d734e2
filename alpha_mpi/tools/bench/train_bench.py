"""`alpha-mpi bench train`: step time of the declared-order learner vs the same loop on MPI_Allreduce.

The baseline computes the same slot gradients with the same model code and the same C Adam, but
sums each rank's slots locally and then calls MPI_Allreduce (alpha_mpi/tools/bench/baseline.py): its
summation order belongs to the MPI library. Both run in one job, interleaved in blocks, and the
ratio of median step times is printed (< 1: alpha_mpi is faster). The ordered learner's time
includes everything it does per step: the combine, the step-wide refusal vote and the update.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import time

import numpy as np

from ...learning import MLP, DataParallelLearner
from ...learning.data import SlotStream, synthetic
from ...learning.optim import make_optimizer
from . import baseline


class AllreduceLoop:
    """The baseline learner: identical except for how gradients are summed across ranks."""

    def __init__(self, comm, model, *, slots, optimizer, lr, seed):
        self.comm, self.model = comm, model
        size, rank = comm.Get_size(), comm.Get_rank()
        n = self.n = model.n_params
        self.my_slots = [s for s in range(slots) if s * size // slots == rank]
        self.params = model.init(seed)
        self._p_next = np.empty(n)
        self.opt = make_optimizer(optimizer, n, lr=lr)
        self.local = np.zeros(n + 2)
        self.reduced = np.zeros(n + 2)
        self.grad = np.zeros(n)
        self.allreduce = baseline.MpiAllreduce(comm, self.local, self.reduced)
        self.step = 0

    def train_step(self, batch):
        n = self.n
        self.local[:] = 0.0
        for s in self.my_slots:
            X, y = batch[s]
            self.local[n + 1] += self.model.loss_and_grad_sum(self.params, X, y, self.grad)
            self.local[:n] += self.grad
            self.local[n] += len(y)
        self.allreduce.run()
        g = self.reduced[:n] / self.reduced[n]
        self.opt.propose(self.params, g, self._p_next)
        self.opt.commit()
        self.params, self._p_next = self._p_next, self.params
        self.step += 1
        return self.reduced[n + 1] / self.reduced[n]


def cmd(comm, argv) -> int:
    rank, size = comm.Get_rank(), comm.Get_size()
    p = argparse.ArgumentParser(prog="alpha-mpi bench train", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="timed steps per learner (default 60)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--block", type=int, default=5, help="steps per interleaved block (default 5)")
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--hidden", type=int, default=700)
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    p.add_argument("--topology", default="pairwise", help="slot tree (default pairwise, as the learners)")
    p.add_argument("--partition", choices=("none", "state", "grads", "params"), default="none")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    data = synthetic(0)
    model = MLP(data.inputs, a.hidden, data.classes)
    lr = 2e-3 if a.optimizer == "adam" else 0.05
    ordered = DataParallelLearner(
        comm,
        model,
        slots=a.slots,
        topology=a.topology,
        optimizer=a.optimizer,
        lr=lr,
        partition=a.partition,
        seed=0,
    )
    base = AllreduceLoop(comm, model, slots=a.slots, optimizer=a.optimizer, lr=lr, seed=0)
    stream = SlotStream(len(data.y), a.batch, a.slots, 0)
    times = {"alpha_mpi": [], "MPI_Allreduce": []}

    def block(learner, key, k, record):
        for _ in range(k):
            t = learner.step
            batch = {
                s: (data.X[stream.indices(t, s)], data.y[stream.indices(t, s)]) for s in learner.my_slots
            }
            comm.Barrier()  # harness synchronisation only; no data
            t0 = time.perf_counter()
            learner.train_step(batch)
            dt = time.perf_counter() - t0
            if record:  # the slowest rank's step; harness timing through a buffer, never a pickle
                worst = np.empty(1)
                comm.Allreduce(np.array([dt]), worst, op=_max())
                times[key].append(float(worst[0]))

    block(ordered, "alpha_mpi", a.warmup, False)
    block(base, "MPI_Allreduce", a.warmup, False)
    while len(times["alpha_mpi"]) < a.steps:
        k = min(a.block, a.steps - len(times["alpha_mpi"]))
        block(ordered, "alpha_mpi", k, True)
        block(base, "MPI_Allreduce", k, True)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["alpha_mpi"] / med["MPI_Allreduce"]
    if rank == 0:
        print(
            f"# alpha-mpi bench train on {socket.gethostname()}, {size} ranks, {model.n_params} parameters, "
            f"{a.slots} slots, batch {a.batch}, {a.optimizer}, topology {a.topology}, partition {a.partition}"
        )
        print("# learner            median ms      min ms      max ms")
        for k, v in times.items():
            print(f"  {k:16s} {1e3 * med[k]:11.3f} {1e3 * min(v):11.3f} {1e3 * max(v):11.3f}")
        print(f"# step-time ratio alpha_mpi / MPI_Allreduce: {ratio:.3f}  (target <= 1.0)")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(
                    {
                        "ranks": size,
                        "params": model.n_params,
                        "median_s": med,
                        "ratio": ratio,
                        "samples": times,
                    },
                    f,
                    indent=2,
                )
    return 0


def _max():
    from mpi4py import MPI

    return MPI.MAX
