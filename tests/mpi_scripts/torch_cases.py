"""Cases of issue 20 run on COMM_WORLD; each prints `case NAME: RESULT` on rank 0, where RESULT is
a parameter digest (or the refusal code, agreed on every rank). tests/test_torch_script_mpi.py
runs this under mpiexec -n 1, 2 and 4 and requires every case's line to be the same on all.

    python tests/mpi_scripts/torch_cases.py [CASE ...]
    python tests/mpi_scripts/torch_cases.py sched --stop-after 3 --ckpt DIR   # save and stop
    python tests/mpi_scripts/torch_cases.py sched --resume --ckpt DIR         # continue
"""

import argparse
import sys

import numpy as np
import torch
from mpi4py import MPI

from alpha_mpi.learning import DataParallelLearner, digest, slice_batch
from alpha_mpi.refusals import Refusal
from alpha_mpi.torch import DataParallel, parameter_digest, summed

COMM = MPI.COMM_WORLD
SLOTS = 4
SUM = torch.nn.CrossEntropyLoss(reduction="sum")


def data(n=48, d=12, c=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, d, generator=g), torch.randint(0, c, (n,), generator=g)


X, Y = data()


def say(name, result):
    if COMM.Get_rank() == 0:
        print(f"case {name}: {result}", flush=True)


def mlp(p_drop=0.0):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(12, 16), torch.nn.ReLU()]
    layers += [torch.nn.Dropout(p_drop)] if p_drop else []
    return torch.nn.Sequential(*layers, torch.nn.Linear(16, 5))


class Noisy(torch.nn.Module):
    """torch.randn in forward: additive noise on the hidden layer."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(12, 16), torch.nn.Linear(16, 5)

    def forward(self, x):
        h = torch.relu(self.a(x))
        return self.b(h + 0.5 * torch.randn(h.shape))


def augment_then(net):
    """A data augmentation step inside the slot: random feature shift and multiplicative jitter."""

    class Aug(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x):
            shift = int(torch.randint(0, x.shape[1], ()))
            x = torch.roll(x, shift, dims=1) * (1 + 0.1 * torch.rand(x.shape))
            return self.net(x)

    return Aug()


def train(net, steps=4, **kw):
    dp = DataParallel(net, COMM, slots=SLOTS, timeout=60, **kw)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(steps):
        dp.step(X, Y, SUM)
        opt.step()
        opt.zero_grad()
    return parameter_digest(net)


class Sometimes(torch.nn.Module):
    """A module whose `extra` layer is used on even steps only (the script sets `t`)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.extra = torch.nn.Linear(12, 16), torch.nn.Linear(16, 5), torch.nn.Linear(16, 5)
        self.t = 0

    def forward(self, x):
        h = torch.relu(self.a(x))
        return self.b(h) + (self.extra(h) if self.t % 2 == 0 else 0)


def case_unused():
    net = Sometimes()
    dp = DataParallel(net, COMM, slots=SLOTS, timeout=60)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.1)
    nones = []
    for t in range(5):
        net.t = t
        dp.step(X, Y, SUM)
        nones.append(net.extra.weight.grad is None)
        opt.step()
        opt.zero_grad()
    assert nones == [False, True, False, True, False], nones
    return parameter_digest(net)


def case_accumulate(style):
    net = mlp(0.2)
    dp = DataParallel(net, COMM, slots=SLOTS, timeout=60)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    thirds = [(X[i::3], Y[i::3]) for i in range(3)]
    for _ in range(2):
        if style == "flag":
            for k, (x, y) in enumerate(thirds):
                dp.step(x, y, SUM, accumulate=k > 0)
        else:  # DDP's pattern: no_sync for all but the last micro-batch, the update
            with dp.no_sync():
                for x, y in thirds[:2]:
                    dp.step(x, y, SUM)
            dp.step(*thirds[2], SUM)
        opt.step()
        opt.zero_grad()
    return parameter_digest(net)


def refused(fn):
    try:
        fn()
    except Refusal as e:
        return f"refused {e.code}"
    return "accepted"


def case_autocast():
    dp = DataParallel(mlp(), COMM, slots=SLOTS, timeout=60)

    def go():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            dp.step(X, Y, SUM)

    out = refused(go)
    dp.step(X, Y, SUM)  # the next call works
    return out


def case_mean_lambda():
    dp = DataParallel(mlp(), COMM, slots=SLOTS, timeout=60)
    out = refused(lambda: dp.step(X, Y, lambda o, t: torch.nn.functional.cross_entropy(o, t)))
    dp.step(X, Y, summed(lambda o, t: torch.nn.functional.cross_entropy(o, t, reduction="sum")))
    return out


class NumpyDropout:
    """A numpy softmax regression with input dropout drawn from the slot's rng."""

    n_params = 12 * 5

    def init(self, seed):
        return np.random.default_rng([seed, 7]).normal(0, 0.1, self.n_params)

    def loss_and_grad_sum(self, params, X, y, grad_out, rng=None):
        W = params.reshape(12, 5)
        Xd = X * (rng.random(X.shape) >= 0.3) / 0.7
        z = Xd @ W
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        loss = -np.log(p[np.arange(len(y)), y]).sum()
        p[np.arange(len(y)), y] -= 1
        grad_out[:] = (Xd.T @ p).reshape(-1)
        return float(loss)


def case_numpy_rng():
    lr = DataParallelLearner(COMM, NumpyDropout(), slots=SLOTS, lr=1e-2, seed=3, timeout=60)
    Xn, yn = X.double().numpy(), Y.numpy()
    for _ in range(4):
        lr.train_step(slice_batch(Xn, yn, SLOTS, lr.my_slots))
    return digest(lr.final_params())


def case_sched(a):
    """AdamW + StepLR, optionally saved and stopped after --stop-after, or resumed."""
    net = mlp(0.2)
    dp = DataParallel(net, COMM, slots=SLOTS, timeout=60, seed=5)
    opt = torch.optim.AdamW(net.parameters(), lr=2e-2, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    if a.resume:
        dp.restore(a.ckpt, opt, scheduler=sched)
    while dp.steps < 6:
        dp.step(X, Y, SUM)
        opt.step()
        opt.zero_grad()
        sched.step()
        if dp.steps == a.stop_after:
            dp.save(a.ckpt, opt, scheduler=sched)
            return f"stopped at {dp.steps}"
    return parameter_digest(net) + f" lr {opt.param_groups[0]['lr']!r}"


CASES = {
    "dropout": lambda a: train(mlp(0.3)),
    "no-dropout": lambda a: train(mlp(0.0)),
    "randn": lambda a: train(Noisy()),
    "augment": lambda a: train(augment_then(mlp())),
    "accumulate-flag": lambda a: case_accumulate("flag"),
    "accumulate-no-sync": lambda a: case_accumulate("no_sync"),
    "unused": lambda a: case_unused(),
    "autocast": lambda a: case_autocast(),
    "mean-lambda": lambda a: case_mean_lambda(),
    "numpy-rng": lambda a: case_numpy_rng(),
    "sched": case_sched,
}


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("cases", nargs="*", default=[c for c in CASES if c != "sched"])
    p.add_argument("--ckpt")
    p.add_argument("--stop-after", type=int)
    p.add_argument("--resume", action="store_true")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    for name in a.cases:
        say(name, CASES[name](a))


if __name__ == "__main__":
    sys.exit(main())
