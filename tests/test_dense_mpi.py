"""The fixed-order dense kernels across ranks (at any size >= 2, MPICH and Open MPI alike): ranks
whose kernels run on different ISA paths train the built-in MLP to the bits of one rank alone;
an ISA path one rank cannot run (ALPHA_MPI_ISA) is refused when the learner is built, on every
rank by name, and the next learner trains.
"""

import pytest

from alpha_mpi import kernel
from alpha_mpi.kernel import dense
from alpha_mpi.learning import MLP, DataParallelLearner, digest
from alpha_mpi.learning.data import SlotStream, synthetic
from alpha_mpi.refusals import Refusal

from conftest import agree

DATA = synthetic(6, n=240, n_eval=8, inputs=12, classes=4)


def trained(comm, steps=4):
    """The digest after `steps` steps of a small MLP on `comm` (6 uneven slots)."""
    lr = DataParallelLearner(comm, MLP(12, 20, 4), slots=6, seed=3, lr=1e-2, timeout=60)
    stream = SlotStream(len(DATA.y), 40, 6, 3)
    for t in range(steps):
        lr.train_step({s: (DATA.X[stream.indices(t, s)], DATA.y[stream.indices(t, s)]) for s in lr.my_slots})
    return digest(lr.final_params())


@pytest.fixture
def restore_isa_path():
    before = kernel.isa_path()
    yield
    kernel.select_isa_path(before)


@pytest.mark.mpi(min_size=2)
def test_ranks_on_different_isa_paths_train_the_bits_of_one_rank(world, restore_isa_path):
    from mpi4py import MPI

    alone = trained(MPI.COMM_SELF)  # on this CPU's fastest path
    paths = kernel.isa_paths()
    mine = kernel.select_isa_path(paths[world.Get_rank() % len(paths)])  # generic on rank 0
    agree(world, trained(world) == alone, f"path {mine}")


@pytest.mark.mpi(min_size=2)
def test_an_isa_path_one_rank_lacks_is_refused_on_every_rank(world, monkeypatch, restore_isa_path):
    rank, odd = world.Get_rank(), world.Get_size() - 1
    if rank == odd:
        monkeypatch.setenv(dense.ISA_ENV, "avx1024")
        monkeypatch.setattr(dense, "_env_read", False)  # as in a fresh process: read it again
    try:
        DataParallelLearner(world, MLP(12, 20, 4), slots=6, timeout=60)
        e = None
    except Refusal as exc:
        e = exc
    if rank == odd:
        ok = e is not None and e.code == "kernel-isa-unavailable" and "ALPHA_MPI_ISA=avx1024" in e.message
    else:
        ok = e is not None and e.code == "peer-refused" and e.context.get("peer") == odd
    agree(world, ok, repr(e))
    monkeypatch.undo()
    from mpi4py import MPI

    agree(world, trained(world) == trained(MPI.COMM_SELF), "the next learner")
