"""The script a DDP user writes, on alpha_mpi.torch: a Dataset, a DataLoader whose batch sampler is
`SlotSampler` (each rank loads only its slots of every global batch), `dp.step_local`,
torch.optim.SGD with momentum and a StepLR schedule, epochs with `set_epoch`, dropout in the model.

    mpiexec -n 1 python -m mpi4py examples/torch_dataloader.py     # the same `digest (...):` line ...
    mpiexec -n 2 python -m mpi4py examples/torch_dataloader.py     # ... on 1, 2 and 4 ranks
    mpiexec -n 4 python -m mpi4py examples/torch_dataloader.py --workers 2 --bucket-mb 0.01

With DDP and DistributedSampler the same script prints another digest on every rank count.
`--device cuda` runs the slot passes on the GPU (rank % device count); its digest is the same on
every rank count of that GPU model. The data are synthetic (made from a seed), so the example
needs nothing but torch; each rank says how many samples its Dataset served.
"""

import argparse

import torch
from mpi4py import MPI

from alpha_mpi.torch import DataParallel, SlotSampler


class Points(torch.utils.data.Dataset):
    """n points in 20 dimensions, labelled by which of 4 seeded centres is nearest; counts reads."""

    def __init__(self, n=2000, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.X = torch.randn(n, 20, generator=g)
        centres = torch.randn(4, 20, generator=g)
        self.y = torch.cdist(self.X, centres).argmin(1)
        self.reads = 0

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        self.reads += 1  # in the worker processes' copies too, with --workers > 0
        return self.X[i], self.y[i]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--slots", type=int, default=8, help="the most ranks the job will ever run on")
    p.add_argument("--batch", type=int, default=64, help="global batch (default 64)")
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers (default 0)")
    p.add_argument("--bucket-mb", type=float, default=None, help="overlap the combine (default off)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    a = p.parse_args()
    comm = MPI.COMM_WORLD
    device = torch.device("cpu")
    if a.device == "cuda":
        device = torch.device("cuda", comm.Get_rank() % torch.cuda.device_count())
    torch.manual_seed(comm.Get_rank())  # ranks may initialise differently: rank 0's weights win
    model = torch.nn.Sequential(
        torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(64, 4)
    ).to(device)
    dp = DataParallel(model, comm, slots=a.slots, seed=1, bucket_mb=a.bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=20, gamma=0.5)
    dp.register("sched", sched)  # saved and restored with dp.save / dp.restore
    data = Points()
    sampler = SlotSampler(data, dp, batch_size=a.batch, shuffle=True, seed=2, drop_last=False)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler, num_workers=a.workers)
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")  # a slot's SUM: the combine divides once
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        for X, y in loader:
            loss = dp.step_local(X, y, loss_fn)
            opt.step()
            opt.zero_grad()
            sched.step()
        if comm.Get_rank() == 0:
            print(f"epoch {epoch}: {len(sampler)} steps, last loss {loss:.4f}", flush=True)
    if a.workers == 0:  # with workers, their copies of the Dataset counted the reads
        print(f"rank {comm.Get_rank()} read {data.reads} samples in {a.epochs} epochs of {len(data)}")
    if comm.Get_rank() == 0:
        print(f"digest (params, buffers, optimizer, step, rng): {dp.state_digest(opt)}")


if __name__ == "__main__":
    main()
