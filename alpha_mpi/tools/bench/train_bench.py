"""`alpha-mpi bench train`: step time of the declared-order learner vs the same loop on MPI_Allreduce, and
the embedded model's fixed-order kernels vs the same model computed by numpy/BLAS.

Three learners run in one job, interleaved in blocks, from the same data:

- `alpha_mpi`: what `alpha-mpi train` runs: the embedded MLP on alpha_mpi's fixed-order kernels
  (the same bits on every machine), the declared-order combine, the C Adam;
- `MPI_Allreduce`: the same slot gradients with the same model code and the same C Adam, but each
  rank's slots summed locally and then MPI_Allreduce (baseline.py): its summation order belongs to
  the MPI library. Ratio alpha_mpi / MPI_Allreduce: target <= 1 (the combine's cost);
- `numpy/BLAS model`: the same learner, combine and Adam with the model computed by numpy and
  single-thread BLAS (`BlasMLP`, machine-dependent bits). Ratio alpha_mpi / numpy/BLAS model:
  target <= 1.25 (what the machine-independent kernels cost).

The ratios are of median step times (< 1: alpha_mpi is faster). A learner's time includes
everything it does per step: the slots' forward and backward passes, the combine, the step-wide
refusal vote and the update.
"""

from __future__ import annotations

import functools
import socket

import numpy as np

from ...kernel import isa_path
from ...learning.learner import DataParallelLearner
from ...learning.mlp import BlasMLP
from ...learning.optim import OPTIMIZERS, make_optimizer
from ...learning.slicing import stream_batch
from ...learning.trainer import TrainConfig, build
from .._args import at_least, path
from . import baseline
from .harness import RankParser, check_outputs, interleaved_steps, report_step_times
from .results import write_json

BLAS_LABEL = "numpy/BLAS model"


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


def _batch(learner, stream, data) -> dict:
    return stream_batch(stream, learner.step, learner.my_slots, data.X, data.y)


def _parser(rank):
    p = RankParser(rank, prog="alpha-mpi bench train", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=at_least(1), default=60, help="timed steps per learner (default 60)")
    p.add_argument("--warmup", type=at_least(0), default=5)
    p.add_argument("--block", type=at_least(1), default=5, help="steps per interleaved block (default 5)")
    p.add_argument("--slots", type=at_least(1), default=8)
    p.add_argument("--batch", type=at_least(1), default=256)
    p.add_argument("--hidden", type=at_least(1), default=700)
    p.add_argument("--optimizer", choices=tuple(OPTIMIZERS), default="adam")
    p.add_argument("--topology", default="pairwise", help="slot tree (default pairwise, as the learners)")
    p.add_argument("--partition", choices=("none", "state", "grads", "params"), default="none")
    p.add_argument("--json", type=path, default=None)
    return p


def cmd(comm, argv) -> int:
    rank, size = comm.Get_rank(), comm.Get_size()
    a = _parser(rank).parse_args(argv)
    check_outputs(comm, [("--json", a.json, True)])
    lr = OPTIMIZERS[a.optimizer].default_lr
    cfg = TrainConfig(
        slots=a.slots,
        batch=a.batch,
        hidden=a.hidden,
        optimizer=a.optimizer,
        lr=lr,
        topology=a.topology,
        partition=a.partition,
        seed=0,
    )
    data, model, ordered, stream = build(comm, cfg)  # the learner `alpha-mpi train` runs, synthetic data
    base = AllreduceLoop(comm, model, slots=a.slots, optimizer=a.optimizer, lr=lr, seed=0)
    blas = DataParallelLearner(  # the same learner, the model by numpy/BLAS
        comm,
        BlasMLP(data.inputs, cfg.hidden, data.classes),
        slots=cfg.slots,
        topology=cfg.topology,
        optimizer=cfg.optimizer,
        lr=cfg.lr,
        partition=cfg.partition,
        seed=cfg.seed,
    )
    learners = {"alpha_mpi": ordered, "MPI_Allreduce": base, BLAS_LABEL: blas}

    steps = {k: v.train_step for k, v in learners.items()}
    # each step's batch is cut outside the timed region, from the same stream for both
    inputs = {k: functools.partial(_batch, v, stream, data) for k, v in learners.items()}
    times = interleaved_steps(comm, steps, warmup=a.warmup, count=a.steps, block=a.block, inputs=inputs)
    if rank == 0:
        title = (
            f"# alpha-mpi bench train on {socket.gethostname()}, {size} ranks, {model.n_params} parameters, "
            f"{a.slots} slots, batch {a.batch}, {a.optimizer}, topology {a.topology}, partition {a.partition}"
        )
        med, ratio = report_step_times(title, times, "MPI_Allreduce")
        kernels = med["alpha_mpi"] / med[BLAS_LABEL]
        print(
            f"# step-time ratio alpha_mpi / {BLAS_LABEL}: {kernels:.3f}  (target <= 1.25: the "
            f"fixed-order kernels, path {isa_path()}, vs numpy/BLAS)"
        )
        if a.json:
            doc = {
                "ranks": size,
                "params": model.n_params,
                "median_s": med,
                "ratio": ratio,
                "kernel_ratio": kernels,
                "isa_path": isa_path(),
                "samples": times,
            }
            write_json(a.json, doc)
    return 0
