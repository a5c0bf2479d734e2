"""The state digest over MPI: the same on every rank, rank count and partition mode (the sharded
optimizer arrays are assembled by selection before hashing), and it tells a run whose Adam moments
differ on one rank's range from the clean run."""

import numpy as np
import pytest

from alpha_mpi.learning import MLP, MODES, DataParallelLearner
from alpha_mpi.learning.data import SlotStream, synthetic

from conftest import agree

DATA = synthetic(4, n=160, n_eval=8, inputs=5, classes=3)


def run(comm, partition, steps=3):
    lr = DataParallelLearner(comm, MLP(5, 4, 3), slots=8, lr=1e-2, partition=partition)
    stream = SlotStream(len(DATA.y), 40, 8, 0)
    for t in range(steps):
        lr.train_step({s: (DATA.X[stream.indices(t, s)], DATA.y[stream.indices(t, s)]) for s in lr.my_slots})
    return lr


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("partition", MODES)
def test_the_state_digest_is_the_one_rank_run_s_in_every_partition_mode(world, partition):
    from mpi4py import MPI

    alone = run(MPI.COMM_SELF, "none").state_digest()
    lr = run(world, partition)
    agree(world, lr.state_digest() == alone, f"{partition}: another state digest")
    if partition != "none":  # one word of the last range's optimizer state, changed on its owner
        if world.Get_rank() == lr.ranges[-1][0]:
            lr.opt.m[-1] = np.nextafter(lr.opt.m[-1], np.inf)
        agree(world, lr.state_digest() != alone, f"{partition}: a changed moment went unseen")
