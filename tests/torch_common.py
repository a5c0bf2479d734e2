"""What the single-process torch tests share (imported after `pytest.importorskip("torch")`):
the declared-sum loss, one intra-op thread for every test, and the one-rank communicator."""

import pytest
import torch

SUM = torch.nn.CrossEntropyLoss(reduction="sum")


@pytest.fixture(autouse=True)
def one_thread():
    """A slot's bits depend on the thread count: every test runs with one, as DataParallel sets."""
    torch.set_num_threads(1)


def comm_self():
    """MPI.COMM_SELF (mpi4py imported when a test needs it)."""
    from mpi4py import MPI

    return MPI.COMM_SELF
