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


class Fussy:
    """A registered object; `fail` makes its load_state_dict raise after changing itself half-way
    (what a restore must undo or never let happen)."""

    def __init__(self, fail=True):
        self.n, self.fail = 0, fail

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, d):
        self.n = d["n"]
        if self.fail:
            raise ValueError("not my kind of state")
