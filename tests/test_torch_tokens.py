"""`ModuleModel` with integer inputs (issue 44 item 7): token ids stay integers (int64), so a module
that starts with `nn.Embedding` trains through the numpy learner (before, they were cast to
float64 and torch raised a bare RuntimeError). Skips cleanly without torch."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from alpha_mpi.learning import DataParallelLearner, check_model  # noqa: E402
from alpha_mpi.torch import ModuleModel  # noqa: E402

from torch_common import comm_self, one_thread  # noqa: E402,F401 (one_thread: autouse)

VOCAB, DIM, SEQ, CLASSES = 20, 8, 6, 5


class TokenClassifier(torch.nn.Module):
    """Embedding -> mean over the sequence -> linear: (batch, SEQ) token ids -> (batch, CLASSES)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.head = torch.nn.Linear(DIM, CLASSES)

    def forward(self, ids):
        return self.head(self.embed(ids).mean(dim=1))


def tokens(n=64, seed=0, dtype=np.int64):
    """Token ids whose class is decided by the first token (learnable), tokens 15.. never used."""
    rng = np.random.default_rng(seed)
    X = rng.integers(0, 15, size=(n, SEQ)).astype(dtype)
    return X, (X[:, 0] % CLASSES).astype(np.int64)


def test_token_ids_stay_integers_and_the_embedding_gets_the_gradient_of_the_rows_used():
    model = ModuleModel(TokenClassifier())
    X, y = tokens(16)
    check_model(model, probe=(X, y))  # the protocol, twice the same bits
    p = model.init(1)
    g = np.empty(model.n_params)
    loss = model.loss_and_grad_sum(p, X, y, g)
    assert np.isfinite(loss) and loss > 0
    emb = g[: VOCAB * DIM].reshape(VOCAB, DIM)
    used = np.unique(X)
    assert np.abs(emb[used]).sum(axis=1).min() > 0 and not emb[15:].any()  # rows 15.. never looked up
    # the same numbers as torch itself in float64 on int64 ids
    net = TokenClassifier().double()
    with torch.no_grad():
        for q, (a, b) in zip(net.parameters(), model.offsets):
            q.copy_(torch.from_numpy(p[a:b]).view(q.shape))
    want = torch.nn.functional.cross_entropy(net(torch.from_numpy(X)), torch.from_numpy(y), reduction="sum")
    want.backward()
    assert loss == float(want.detach()) and np.array_equal(emb, net.embed.weight.grad.numpy())
    for dtype in (np.int32, np.uint8):  # any integer kind: the same ids, the same bits
        g2 = np.empty_like(g)
        assert model.loss_and_grad_sum(p, X.astype(dtype), y, g2) == loss and np.array_equal(g2, g)
    assert model.predict(p, X).shape == (16,)


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_an_embedding_module_trains_through_the_numpy_learner(optimizer):
    X, y = tokens(96)
    learner = DataParallelLearner(
        comm_self(), ModuleModel(TokenClassifier()), slots=4, optimizer=optimizer, lr=0.1, seed=2
    )
    first = None
    for _ in range(30):
        batch = {s: (X[s::4], y[s::4]) for s in learner.my_slots}
        loss, _ = learner.train_step(batch)
        first = loss if first is None else first
    assert loss < 0.7 * first, (first, loss)  # 1.65 -> 0.97 on this data
    acc = (learner.model.predict(learner.final_params(), X) == y).mean()
    assert acc > 0.4  # chance is 0.2; 0.58 on this data
