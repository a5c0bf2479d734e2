"""A torch training script that survives preemption: dropout, AdamW + StepLR, checkpoints, and
SIGUSR1/SIGTERM handled with alpha_mpi.Preemption (save, exit 99, resume on any rank count).

    mpiexec -n 4 python -m mpi4py examples/torch_preempt.py --steps 400 --checkpoint-dir ck --resume
    # ... kill -USR1 <mpiexec pid>: every rank stops after the same step, saves, exits 99
    mpiexec -n 2 python -m mpi4py examples/torch_preempt.py --steps 400 --checkpoint-dir ck --resume
    # continues from the checkpoint and prints the digest an uninterrupted run prints

    ALPHA_TRAIN_CMD="python -m mpi4py examples/torch_preempt.py" ALPHA_NP=4 jobs/mpirun-train.sh
    sbatch --export=ALL,ALPHA_TRAIN_CMD="python -m mpi4py examples/torch_preempt.py" jobs/train.sbatch

`python -m mpi4py` makes an uncaught exception on one rank abort the whole job at once (without
it the other ranks would wait for the peer bound, ALPHA_MPI_TIMEOUT); a script that cannot be
started that way calls `alpha_mpi.abort_on_exception()` first. The job scripts append
`--steps --checkpoint-dir --checkpoint-every --resume` (the options of digits_common.parser).
"""

from __future__ import annotations

import torch
from mpi4py import MPI

import alpha_mpi
from alpha_mpi.learning import PREEMPTED, SlotStream
from alpha_mpi.torch import DataParallel


def factory(inputs: int = 64, classes: int = 10, hidden: int = 64) -> torch.nn.Module:
    """(batch, inputs) -> (batch, classes) logits, with dropout."""
    return torch.nn.Sequential(
        torch.nn.Linear(inputs, hidden),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.2),
        torch.nn.Linear(hidden, classes),
    )


def main(argv=None, each_step=None) -> int:
    """Train as the command line says; returns the exit status (0, or 99 when preempted).
    `each_step(step)`: called after every step (tests use it to make a rank fail)."""
    from digits_common import digits, parser

    a = parser("torch MLP with dropout, AdamW + StepLR, preemptible", steps=60).parse_args(argv)
    comm = MPI.COMM_WORLD
    say = print if comm.Get_rank() == 0 else (lambda *x, **k: None)
    torch.set_num_threads(1)
    Xtr, ytr, Xev, yev = digits()
    torch.manual_seed(a.seed)
    model = factory()
    with alpha_mpi.Preemption() as pre:
        dp = DataParallel(model, comm, slots=a.slots, seed=a.seed, preemption=pre)
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=20, gamma=0.5)
        dp.register("scheduler", sched)  # its state is in checkpoints and in the state digest
        loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")
        config = {"slots": a.slots, "batch": a.batch, "seed": a.seed, "lr": a.lr}
        if a.resume and a.checkpoint_dir:
            where = dp.restore(a.checkpoint_dir, opt, scheduler=sched, config=config, missing_ok=True)
            if where:
                say(f"# resumed from {where} at step {dp.steps}")
        stream = SlotStream(len(ytr), a.batch, 1, a.seed)
        say(f"# {dp.n} parameters, {a.slots} slots on {comm.Get_size()} ranks, batch {a.batch}")
        loss = float("nan")
        while dp.steps < a.steps:
            idx = torch.from_numpy(stream.indices(dp.steps, 0))
            model.train()
            loss = dp.step(Xtr[idx], ytr[idx], loss_fn)
            opt.step()
            opt.zero_grad()
            sched.step()
            if each_step is not None:
                each_step(dp.steps)
            if dp.steps % a.log_every == 0:
                say(f"step {dp.steps:4d}  loss {loss:.6f}  lr {sched.get_last_lr()[0]:g}")
            due = a.checkpoint_every and dp.steps % a.checkpoint_every == 0
            if a.checkpoint_dir and (due or pre.agreed):
                dp.save(a.checkpoint_dir, opt, scheduler=sched, config=config)
            if pre.agreed:  # the same step on every rank: the flag travelled in the combine
                say(f"# stopped by signal after step {dp.steps}, checkpoint saved")
                say(
                    f"# state digest (params, buffers, optimizer, step, rng) at step {dp.steps}: {dp.state_digest(opt)}"
                )
                return PREEMPTED
        if a.checkpoint_dir:
            dp.save(a.checkpoint_dir, opt, scheduler=sched, config=config)
    model.eval()
    with torch.no_grad():
        acc = float((model(Xev).argmax(1) == yev).float().mean())
    say(f"final loss {loss:.6f}  eval accuracy {acc:.4f}")
    say(f"digest (params, buffers, optimizer, step, rng): {dp.state_digest(opt)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
