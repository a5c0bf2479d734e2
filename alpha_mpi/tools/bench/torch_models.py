"""The torch modules `alpha-mpi bench torch` times, shared with examples/torch_cnn.py (which
trains the same CNN): the digits CNN and an MLP, both for 8x8 images flattened to 64 inputs, and
a transformer encoder over padded token sequences with 5.3M parameters and a label per token (a
model a user would train: its step is compute and communication, not per-slot overhead, and its
loss is a mean over real tokens), each with its synthetic data and its losses (`LOSSES`: what
alpha_mpi's rows declare, what DDP's rows call).

Needs torch (pip install alpha_mpi[torch]); imported only by the commands that use it.
"""

from __future__ import annotations

import torch


class DigitsCNN(torch.nn.Module):
    """Two 3x3 convolutions (8 and 16 channels), a 2x2 max-pool, a linear classifier: ~3.7k parameters."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(8, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
        )
        self.classifier = torch.nn.Linear(16 * 4 * 4, classes)

    def forward(self, x):
        """x: (batch, 64) flattened 8x8 images -> (batch, classes) logits."""
        return self.classifier(self.features(x.view(-1, 1, 8, 8)).flatten(1))


def digits_mlp(inputs: int = 64, classes: int = 10, hidden: int = 128) -> torch.nn.Module:
    """Linear-ReLU-Linear, (batch, inputs) -> (batch, classes) logits (examples/torch_mlp.py's)."""
    return torch.nn.Sequential(
        torch.nn.Linear(inputs, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, classes)
    )


class TextEncoder(torch.nn.Module):
    """Token embedding (8192 x 256) + learned positions, 4 pre-norm transformer encoder layers
    (4 heads, feed-forward 1024, dropout 0.1), a linear classifier of every token: 5,263,370
    float32 parameters for sequences of 16 tokens."""

    def __init__(self, vocab=8192, d=256, layers=4, heads=4, ff=1024, seq=16, classes=10, dropout=0.1):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.randn(seq, d) * 0.02)
        layer = torch.nn.TransformerEncoderLayer(d, heads, ff, dropout, batch_first=True, norm_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, classes)

    def forward(self, x):
        """x: (batch, seq) token ids -> (batch, seq, classes) logits."""
        return self.head(self.norm(self.encoder(self.embed(x) + self.pos)))


def digits_data(seed: int = 0):
    """Random (1797, 64) inputs in [0, 1) and labels 0..9: the shape of scikit-learn's digits."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(1797, 64, generator=g), torch.randint(0, 10, (1797,), generator=g)


IGNORE = -100  # the label of a padded token


def token_data(seed: int = 0, n: int = 4096, seq: int = 16, vocab: int = 8192):
    """Random token sequences of seq/2 to seq real tokens, padded (token 0, label -100); the
    label of a real token is a fixed function of it and the one before (learnable)."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randint(1, vocab, (n, seq), generator=g)
    y = (X + X.roll(1, dims=1)) % 10
    real = torch.randint(seq // 2, seq + 1, (n, 1), generator=g)
    pad = torch.arange(seq).expand(n, seq) >= real
    X[pad], y[pad] = 0, IGNORE
    return X, y


def token_pair(logits, y):
    """alpha_mpi's token loss: (the sum of the real tokens' losses, their count), the mass."""
    loss = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE, reduction="sum"
    )
    return loss, (y != IGNORE).sum()


def token_mean(logits, y):
    """DDP's token loss: the mean over this rank's real tokens (what a DDP script calls)."""
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE)


_SUMMED, _MEAN = torch.nn.CrossEntropyLoss(reduction="sum"), torch.nn.CrossEntropyLoss()

MODELS = {"cnn": DigitsCNN, "mlp": digits_mlp, "transformer": TextEncoder}
DATA = {"cnn": digits_data, "mlp": digits_data, "transformer": token_data}
LOSSES = {
    "cnn": (_SUMMED, _MEAN),
    "mlp": (_SUMMED, _MEAN),
    "transformer": (token_pair, token_mean),
}
"""model -> (the loss alpha_mpi's rows declare, the loss DDP's row calls): samples are the
mass of the images, real tokens the mass of the transformer."""
