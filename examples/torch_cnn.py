"""A small torch CNN on scikit-learn's bundled 8x8 digits with alpha_mpi.torch.DataParallel.

mpiexec -n 1 python examples/torch_cnn.py      # one `digest:` line on 1, 2 and 4 ranks
mpiexec -n 4 python examples/torch_cnn.py
mpiexec -n 4 python examples/torch_cnn.py --steps 20 --stop-after 10 --checkpoint-dir /tmp/ck
mpiexec -n 2 python examples/torch_cnn.py --steps 20 --resume --checkpoint-dir /tmp/ck   # same digest
"""

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


def factory(inputs: int = 64, classes: int = 10) -> torch.nn.Module:
    """The CNN for 8x8 images (inputs must be 64)."""
    if inputs != 64:
        raise ValueError(f"DigitsCNN reads 8x8 images (64 inputs), got {inputs}")
    return DigitsCNN(classes)


if __name__ == "__main__":
    from digits_common import run

    run(factory, "torch CNN on load_digits")
