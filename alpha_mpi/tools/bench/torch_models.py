"""The torch modules `alpha-mpi bench torch` times, shared with examples/torch_cnn.py (which
trains the same CNN): the digits CNN and an MLP, both for 8x8 images flattened to 64 inputs.

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


MODELS = {"cnn": DigitsCNN, "mlp": digits_mlp}
