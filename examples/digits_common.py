"""Shared by torch_mlp.py and torch_cnn.py: scikit-learn's bundled digits, the training loop with
alpha_mpi.torch.DataParallel (or torch DDP for comparison), checkpoints, and the digest line.

Not an example to run by itself: run `mpiexec -n 4 python examples/torch_cnn.py`.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from mpi4py import MPI

from alpha_mpi.learning import SlotStream
from alpha_mpi.tools.bench.baseline import init_gloo  # the gloo set-up `alpha-mpi bench torch` uses
from alpha_mpi.torch import DataParallel, parameter_digest


def digits():
    """(X_train, y_train, X_eval, y_eval) float32/int64 tensors: 1797 8x8 images, 297 held out."""
    from sklearn.datasets import load_digits

    d = load_digits()
    X = torch.from_numpy((d.data / 16.0).astype(np.float32))
    y = torch.from_numpy(d.target.astype(np.int64))
    return X[297:], y[297:], X[:297], y[:297]


def parser(description: str, steps: int = 40):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--slots", type=int, default=8, help="logical micro-batch shards per step (default 8)")
    p.add_argument("--batch", type=int, default=128, help="global batch (default 128)")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument(
        "--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint-dir"
    )
    p.add_argument(
        "--stop-after",
        type=int,
        default=None,
        help="save a checkpoint after this step and exit (an interruption)",
    )
    p.add_argument(
        "--ddp",
        action="store_true",
        help="train with torch DistributedDataParallel (gloo) instead, for comparison",
    )
    return p


def run(make_model, description: str, argv=None) -> str:
    """Train make_model() as the command line says; rank 0 prints the progress and the digest."""
    a = parser(description).parse_args(argv)
    comm = MPI.COMM_WORLD
    say = print if comm.Get_rank() == 0 else (lambda *x, **k: None)
    torch.set_num_threads(1)
    Xtr, ytr, Xev, yev = digits()
    torch.manual_seed(a.seed)
    model = make_model()
    stream = SlotStream(len(ytr), a.batch, 1, a.seed)  # one global batch per step, seeded, resumable
    if a.ddp:
        return _run_ddp(model, a, comm, Xtr, ytr, Xev, yev, stream, say)
    dp = DataParallel(model, comm, slots=a.slots)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")  # a slot's loss is a sum over its samples
    config = {"slots": a.slots, "batch": a.batch, "seed": a.seed, "lr": a.lr}
    if a.resume and a.checkpoint_dir:
        where = dp.restore(a.checkpoint_dir, opt, config=config, missing_ok=True)
        if where:
            say(f"# resumed from {where} at step {dp.steps}")
    say(
        f"# {description}: {dp.n} parameters ({str(dp.dtype).replace('torch.', '')}), {a.slots} slots on "
        f"{comm.Get_size()} ranks, batch {a.batch}, Adam lr {a.lr:g}, layout order id {dp.layout_order_id[:16]}"
    )
    loss = float("nan")
    while dp.steps < a.steps:
        idx = torch.from_numpy(stream.indices(dp.steps, 0))
        loss = dp.step(Xtr[idx], ytr[idx], loss_fn)  # every rank: the same global batch
        opt.step()
        opt.zero_grad()
        if dp.steps % a.log_every == 0:
            say(f"step {dp.steps:4d}  loss {loss:.6f}")
        if a.checkpoint_dir and (
            (a.checkpoint_every and dp.steps % a.checkpoint_every == 0) or dp.steps == a.stop_after
        ):
            dp.save(a.checkpoint_dir, opt, config=config)
        if a.stop_after is not None and dp.steps == a.stop_after:
            say(f"# stopped after step {dp.steps} (checkpoint saved)")
            return dp.state_digest(opt)
    with torch.no_grad():
        acc = float((model(Xev).argmax(1) == yev).float().mean())
    d = dp.state_digest(opt)  # the whole state: parameters, Adam's moments and step, the seed
    say(f"final loss {loss:.6f}  eval accuracy {acc:.4f}")
    say(f"digest (params, buffers, optimizer, step, rng): {d}")
    return d


def _run_ddp(model, a, comm, Xtr, ytr, Xev, yev, stream, say) -> str:
    dist = init_gloo(comm)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    p, r = comm.Get_size(), comm.Get_rank()
    loss = torch.tensor(float("nan"))
    for t in range(a.steps):
        idx = torch.from_numpy(stream.indices(t, 0))
        mine = idx[r * len(idx) // p : (r + 1) * len(idx) // p]  # this rank's share of the global batch
        loss = loss_fn(ddp(Xtr[mine]), ytr[mine])
        loss.backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        acc = float((model(Xev).argmax(1) == yev).float().mean())
    d = parameter_digest(model)
    say(f"# torch DDP (gloo), {p} ranks, batch {a.batch} split {len(idx) // p} per rank")
    say(f"final loss (rank 0 share) {float(loss.detach()):.6f}  eval accuracy {acc:.4f}")
    say(f"ddp digest (params): {d}")
    dist.destroy_process_group()
    return d
