"""`Preemption`: stop a data-parallel run at the same step on every rank after SIGUSR1/SIGTERM.

Slurm sends SIGUSR1 (`--signal=USR1@T`) before the time limit and SIGTERM on preemption; a
launcher (mpiexec, srun) forwards it to every rank, but not at the same moment: one rank may see
it a step before another. So the signal only sets a local flag (`requested`); the flag travels as
a payload word in the next gradient combine (DataParallelLearner.train_step's `stop=`,
alpha_mpi.torch.DataParallel's `preemption=`), added over the slot tree like the gradients, so
after that step every rank knows whether any rank was signalled (`agreed`). No extra round, no
MPI collective. The script then saves a checkpoint and exits with `PREEMPTED` (99), which
`jobs/train.sbatch` and `jobs/mpirun-train.sh` read as "requeue / run again to resume":

    with alpha_mpi.Preemption() as pre:
        dp = alpha_mpi.torch.DataParallel(net, comm, slots=8, preemption=pre)
        while dp.steps < steps:
            dp.step(X, y, loss_fn); opt.step(); opt.zero_grad()
            if pre.agreed:
                dp.save(ckpt, opt)
                pre.exit()                      # SystemExit(99) on every rank, at the same step

`alpha-mpi train` uses the same object.
"""

from __future__ import annotations

import signal
from types import TracebackType

__all__ = ["Preemption", "PREEMPTED", "SIGNALS"]

PREEMPTED = 99
"""Exit status of a run stopped on a signal after saving a checkpoint (job scripts requeue on it)."""

SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
"""The signals a Preemption handles: Slurm's warning (SIGUSR1) and preemption (SIGTERM)."""


class Preemption:
    """A local stop request set by `signals`, and the agreed stop the combine delivers.

    `install()` (or `with Preemption() as pre:`) sets the handlers; `restore()` (or leaving the
    block) puts the previous ones back. `requested`: a signal arrived on this rank. `agreed`:
    set by the learner or DataParallel after a step whose combine carried any rank's request;
    the same on every rank after the same step. `exit()` raises SystemExit(PREEMPTED)."""

    def __init__(self, signals: tuple[int, ...] = SIGNALS) -> None:
        self.signals = tuple(signals)
        self.requested = False
        self.agreed = False
        self._old: dict[int, object] = {}

    @property
    def set(self) -> bool:
        """`requested` (the name trainer.StopFlag had)."""
        return self.requested

    def install(self) -> Preemption:
        """Handle `signals` (in the main thread; elsewhere Python allows no handler: skipped)."""
        for sig in self.signals:
            try:
                self._old[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread
                pass
        return self

    def _handler(self, signum, frame) -> None:
        self.requested = True

    def request(self) -> None:
        """Ask for a stop from code (what a signal does)."""
        self.requested = True

    def restore(self) -> None:
        """Put back the handlers that were there before `install`."""
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    def exit(self) -> None:
        """Raise SystemExit(PREEMPTED): the job scripts' "checkpoint saved, run again" status."""
        raise SystemExit(PREEMPTED)

    def __enter__(self) -> Preemption:
        return self.install()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.restore()
