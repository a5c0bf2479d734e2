"""`alpha-mpi bench torch`: step time of alpha_mpi.torch.DataParallel vs torch DDP (gloo).

Both train the same module (torch_models.py: the digits CNN that examples/torch_cnn.py trains,
or an MLP) from the same initial weights with torch.optim.Adam on the same global batch and rank
count, in one job, interleaved in blocks, one intra-op thread per rank for both. A step is everything a training
step does: alpha_mpi: one forward and backward per owned slot, the ordered combine, the rounding
into .grad, opt.step(); DDP: one forward and backward over this rank's share of the batch with
gloo's bucketed allreduce overlapping the backward, opt.step(). Step time is the slowest rank's,
the ratio is of medians (< 1: alpha_mpi is faster).

DDP's ranks come from the MPI environment: rank 0 picks a free localhost port and sends it to
the others with a buffer broadcast (harness bookkeeping, no data), then
`init_process_group("gloo", tcp://127.0.0.1:PORT)`. At the end both parameter digests are
printed: alpha_mpi's is the same on every rank count, DDP's is not.
"""

from __future__ import annotations

import functools
import socket

from ...learning.data import SlotStream
from ...learning.torch_model import require_torch
from .._args import at_least, path
from .baseline import init_gloo
from .harness import RankParser, interleaved_steps, report_step_times
from .results import write_json


def _parser(rank):
    p = RankParser(rank, prog="alpha-mpi bench torch", description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("cnn", "mlp"), default="cnn")
    p.add_argument("--steps", type=at_least(1), default=40, help="timed steps per learner (default 40)")
    p.add_argument("--warmup", type=at_least(0), default=3)
    p.add_argument("--block", type=at_least(1), default=5, help="steps per interleaved block (default 5)")
    p.add_argument("--slots", type=at_least(1), default=8)
    p.add_argument("--batch", type=at_least(1), default=128)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--json", type=path, default=None)
    return p


def cmd(comm, argv) -> int:
    """Run the benchmark (every rank); rank 0 prints the table, the ratio and both digests."""
    torch = require_torch()
    from ...torch import DataParallel, parameter_digest
    from .torch_models import MODELS

    rank, size = comm.Get_rank(), comm.Get_size()
    a = _parser(rank).parse_args(argv)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    X = torch.rand(1797, 64, generator=g)  # the shape of scikit-learn's digits
    y = torch.randint(0, 10, (1797,), generator=g)
    make = MODELS[a.model]
    torch.manual_seed(0)
    ours = make()
    torch.manual_seed(0)
    theirs = make()
    dp = DataParallel(ours, comm, slots=a.slots)
    opt_a = torch.optim.Adam(ours.parameters(), lr=a.lr)
    dist = init_gloo(comm)
    ddp = torch.nn.parallel.DistributedDataParallel(theirs)
    opt_d = torch.optim.Adam(theirs.parameters(), lr=a.lr)
    summed, mean = torch.nn.CrossEntropyLoss(reduction="sum"), torch.nn.CrossEntropyLoss()
    stream = SlotStream(len(y), a.batch, 1, 0)
    steps = {"alpha_mpi": 0, "DDP (gloo)": 0}

    def one(key):
        idx = torch.from_numpy(stream.indices(steps[key], 0))
        if key == "alpha_mpi":
            dp.step(X[idx], y[idx], summed)
            opt_a.step()
            opt_a.zero_grad()
        else:
            mine = idx[rank * len(idx) // size : (rank + 1) * len(idx) // size]
            mean(ddp(X[mine]), y[mine]).backward()
            opt_d.step()
            opt_d.zero_grad()
        steps[key] += 1

    learners = {key: functools.partial(one, key) for key in steps}  # the whole step is timed
    times = interleaved_steps(comm, learners, warmup=a.warmup, count=a.steps, block=a.block)
    digests = {"alpha_mpi": parameter_digest(ours), "DDP (gloo)": parameter_digest(theirs)}
    dist.destroy_process_group()
    if rank == 0:
        n = sum(q.numel() for q in ours.parameters())
        title = (
            f"# alpha-mpi bench torch on {socket.gethostname()}, {size} ranks, {a.model} ({n} parameters, "
            f"float32), batch {a.batch}, {a.slots} slots, Adam, torch {torch.__version__}, 1 thread per rank"
        )
        med, ratio = report_step_times(title, times, "DDP")
        print(f"# digest alpha_mpi after {steps['alpha_mpi']} steps: {digests['alpha_mpi']}")
        print(f"# digest DDP after {steps['DDP (gloo)']} steps:       {digests['DDP (gloo)']}")
        print("# (alpha_mpi's digest is the same on every rank count; DDP's depends on it)")
        if a.json:
            doc = {"ranks": size, "model": a.model, "median_s": med, "ratio": ratio, "digests": digests}
            write_json(a.json, {**doc, "samples": times})
    return 0
