"""Train a tiny model alone and save at steps 2 and 4 (the crash test kills it while saving step 4).

    ckpt_saver.py ROOT FIRST [CRASH_AT]

CRASH_AT=k sets the store's explicit test hook (`alpha_mpi.checkpoint.store.hooks.point`) to
SIGKILL this process at the k-th publication filesystem operation.
"""

import os
import signal
import sys

from mpi4py import MPI

from alpha_mpi.checkpoint import Checkpointer, store
from alpha_mpi.learning import MLP, DataParallelLearner
from alpha_mpi.learning.data import SlotStream, synthetic

root, save_first = sys.argv[1], sys.argv[2] == "1"
crash_at = int(sys.argv[3]) if len(sys.argv) > 3 else None
if crash_at is not None:
    store.hooks.point = lambda what, k: os.kill(os.getpid(), signal.SIGKILL) if k == crash_at else None
data = synthetic(1, n=128, n_eval=8, inputs=6, classes=3)
learner = DataParallelLearner(MPI.COMM_SELF, MLP(6, 40, 3), slots=8, lr=1e-2, seed=1, partition="state")
cfg = {"slots": 8, "batch": 32, "seed": 1, "hidden": 40}
with Checkpointer(MPI.COMM_SELF, root, learner, cfg) as ck:
    stream = SlotStream(128, 32, 8, 1)
    for t in range(4):
        learner.train_step(
            {s: (data.X[stream.indices(t, s)], data.y[stream.indices(t, s)]) for s in range(8)}
        )
        if (t + 1 == 2 and save_first) or (t + 1 == 4 and not save_first):
            ck.save()
print("saved", learner.step, "points", store.hooks.count, flush=True)
