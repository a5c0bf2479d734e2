"""`ModuleModel` with token ids over MPI (issue 44 item 7): an `nn.Embedding` module through the
numpy learner's AdamW gives one digest on every rank count and partition mode. Skips cleanly
without torch."""

import pytest

torch = pytest.importorskip("torch")

from test_torch_tokens import TokenClassifier, tokens  # noqa: E402

from alpha_mpi.learning import DataParallelLearner  # noqa: E402
from alpha_mpi.torch import ModuleModel  # noqa: E402

from conftest import agree, groups  # noqa: E402


@pytest.mark.mpi(min_size=2)
def test_an_embedding_module_with_adamw_gives_one_digest_on_every_rank_count_and_mode():
    """The embedding model through the numpy learner's AdamW: the world, the first 2 and 4 ranks
    inside it, and every partition mode end in the bits of the run alone on COMM_SELF."""
    from mpi4py import MPI

    torch.set_num_threads(1)
    world = MPI.COMM_WORLD
    X, y = tokens(96)

    def go(comm, mode):
        learner = DataParallelLearner(
            comm,
            ModuleModel(TokenClassifier()),
            slots=8,
            optimizer="adamw",
            lr=0.05,
            weight_decay=0.1,
            partition=mode,
            seed=2,
            timeout=60,
        )
        for _ in range(5):
            learner.train_step({s: (X[s::8], y[s::8]) for s in learner.my_slots})
        return learner.state_digest()

    alone = go(MPI.COMM_SELF, "none")
    comms = [world, *groups(world)]
    for comm in comms:
        for mode in ("none", "state", "grads", "params"):
            got = go(comm, mode)
            agree(world, got == alone, f"{comm.Get_size()} ranks, {mode}: {got[:12]} vs {alone[:12]}")
    for comm in comms[1:]:
        comm.Free()
