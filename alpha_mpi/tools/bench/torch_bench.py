"""`alpha-mpi bench torch`: step time of alpha_mpi.torch.DataParallel vs torch DDP (gloo).

Both train the same module (the digits CNN of examples/torch_cnn.py, or an MLP) from the same
initial weights with torch.optim.Adam on the same global batch and rank count, in one job,
interleaved in blocks, one intra-op thread per rank for both. A step is everything a training
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

import argparse
import json
import os
import socket
import statistics
import time

import numpy as np


def _models(torch):
    class DigitsCNN(torch.nn.Module):
        """The CNN of examples/torch_cnn.py: two 3x3 convolutions, a 2x2 max-pool, a linear layer."""

        def __init__(self, classes: int = 10):
            super().__init__()
            self.features = torch.nn.Sequential(
                torch.nn.Conv2d(1, 8, 3, padding=1),
                torch.nn.ReLU(),
                torch.nn.Conv2d(8, 16, 3, padding=1),
                torch.nn.ReLU(),
                torch.nn.MaxPool2d(2),
            )
            self.classifier = torch.nn.Linear(16 * 4 * 4, classes)

        def forward(self, x):
            return self.classifier(self.features(x.view(-1, 1, 8, 8)).flatten(1))

    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))

    return {"cnn": DigitsCNN, "mlp": mlp}


def _gloo(comm, torch):
    import torch.distributed as dist

    port = np.zeros(1, dtype=np.int64)
    if comm.Get_rank() == 0:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port[0] = s.getsockname()[1]
        s.close()
    comm.Bcast(port, root=0)  # harness bookkeeping through a buffer, never a pickle
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{int(port[0])}",
        rank=comm.Get_rank(),
        world_size=comm.Get_size(),
    )
    return dist


def cmd(comm, argv) -> int:
    """Run the benchmark (every rank); rank 0 prints the table, the ratio and both digests."""
    from ...learning.torch_model import require_torch

    torch = require_torch()
    from ...learning.data import SlotStream
    from ...torch import DataParallel, parameter_digest

    rank, size = comm.Get_rank(), comm.Get_size()
    p = argparse.ArgumentParser(prog="alpha-mpi bench torch", description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("cnn", "mlp"), default="cnn")
    p.add_argument("--steps", type=int, default=40, help="timed steps per learner (default 40)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--block", type=int, default=5, help="steps per interleaved block (default 5)")
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    X = torch.rand(1797, 64, generator=g)  # the shape of scikit-learn's digits
    y = torch.randint(0, 10, (1797,), generator=g)
    make = _models(torch)[a.model]
    torch.manual_seed(0)
    ours = make()
    torch.manual_seed(0)
    theirs = make()
    dp = DataParallel(ours, comm, slots=a.slots)
    opt_a = torch.optim.Adam(ours.parameters(), lr=a.lr)
    dist = _gloo(comm, torch)
    ddp = torch.nn.parallel.DistributedDataParallel(theirs)
    opt_d = torch.optim.Adam(theirs.parameters(), lr=a.lr)
    summed, mean = torch.nn.CrossEntropyLoss(reduction="sum"), torch.nn.CrossEntropyLoss()
    stream = SlotStream(len(y), a.batch, 1, 0)
    steps = {"alpha_mpi": 0, "DDP (gloo)": 0}
    times = {k: [] for k in steps}

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

    def block(key, k, record):
        for _ in range(k):
            comm.Barrier()  # harness synchronisation only; no data
            t0 = time.perf_counter()
            one(key)
            dt = time.perf_counter() - t0
            if record:
                worst = np.empty(1)
                comm.Allreduce(np.array([dt]), worst, op=_max())  # harness timing through a buffer
                times[key].append(float(worst[0]))

    for key in steps:
        block(key, a.warmup, False)
    while len(times["alpha_mpi"]) < a.steps:
        k = min(a.block, a.steps - len(times["alpha_mpi"]))
        for key in steps:
            block(key, k, True)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["alpha_mpi"] / med["DDP (gloo)"]
    digests = {"alpha_mpi": parameter_digest(ours), "DDP (gloo)": parameter_digest(theirs)}
    dist.destroy_process_group()
    if rank == 0:
        n = sum(q.numel() for q in ours.parameters())
        print(
            f"# alpha-mpi bench torch on {socket.gethostname()}, {size} ranks, {a.model} ({n} parameters, "
            f"float32), batch {a.batch}, {a.slots} slots, Adam, torch {torch.__version__}, 1 thread per rank"
        )
        print("# learner            median ms      min ms      max ms")
        for k, v in times.items():
            print(f"  {k:16s} {1e3 * med[k]:11.3f} {1e3 * min(v):11.3f} {1e3 * max(v):11.3f}")
        print(f"# step-time ratio alpha_mpi / DDP: {ratio:.3f}  (target <= 1.0)")
        print(f"# digest alpha_mpi after {steps['alpha_mpi']} steps: {digests['alpha_mpi']}")
        print(f"# digest DDP after {steps['DDP (gloo)']} steps:       {digests['DDP (gloo)']}")
        print("# (alpha_mpi's digest is the same on every rank count; DDP's depends on it)")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(
                    {
                        "ranks": size,
                        "model": a.model,
                        "median_s": med,
                        "ratio": ratio,
                        "digests": digests,
                        "samples": times,
                    },
                    f,
                    indent=2,
                )
    return 0


def _max():
    from mpi4py import MPI

    return MPI.MAX
