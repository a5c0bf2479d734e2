"""Train a tiny model alone and save at steps 2 and 4 (the crash test kills it while saving step 4)."""

import sys

from mpi4py import MPI

from alpha_mpi.checkpoint import Checkpointer
from alpha_mpi.learning import MLP, DataParallelLearner
from alpha_mpi.learning.data import SlotStream, synthetic

root, save_first = sys.argv[1], sys.argv[2] == "1"
data = synthetic(1, n=128, n_eval=8, inputs=6, classes=3)
learner = DataParallelLearner(MPI.COMM_SELF, MLP(6, 40, 3), slots=8, lr=1e-2, seed=1, partition="state")
cfg = {"slots": 8, "batch": 32, "seed": 1, "hidden": 40}
ck = Checkpointer(MPI.COMM_SELF, root, learner, cfg)
stream = SlotStream(128, 32, 8, 1)
for t in range(4):
    learner.train_step({s: (data.X[stream.indices(t, s)], data.y[stream.indices(t, s)]) for s in range(8)})
    if (t + 1 == 2 and save_first) or (t + 1 == 4 and not save_first):
        ck.save()
from alpha_mpi.checkpoint import store

print("saved", learner.step, "points", store._ops, flush=True)
