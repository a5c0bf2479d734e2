"""A small torch CNN on scikit-learn's bundled 8x8 digits with alpha_mpi.torch.DataParallel.

mpiexec -n 1 python -m mpi4py examples/torch_cnn.py      # one `digest:` line on 1, 2 and 4 ranks
mpiexec -n 4 python -m mpi4py examples/torch_cnn.py
mpiexec -n 4 python -m mpi4py examples/torch_cnn.py --steps 20 --stop-after 10 --checkpoint-dir /tmp/ck
mpiexec -n 2 python -m mpi4py examples/torch_cnn.py --steps 20 --resume --checkpoint-dir /tmp/ck   # same digest

The CNN (two 3x3 convolutions with 8 and 16 channels, a 2x2 max-pool, a linear classifier) is
defined once, in alpha_mpi/tools/bench/torch_models.py, because `alpha-mpi bench torch` times
the same module against torch DDP. Any nn.Module works here: see `factory`.

`python -m mpi4py` aborts the whole job when one rank raises (else its peers wait for the
peer bound, ALPHA_MPI_TIMEOUT); see examples/torch_preempt.py for preemption and docs/pytorch.md.
"""

import torch

from alpha_mpi.tools.bench.torch_models import DigitsCNN


def factory(inputs: int = 64, classes: int = 10) -> torch.nn.Module:
    """The CNN for 8x8 images (inputs must be 64)."""
    if inputs != 64:
        raise ValueError(f"DigitsCNN reads 8x8 images (64 inputs), got {inputs}")
    return DigitsCNN(classes)


if __name__ == "__main__":
    from digits_common import run

    run(factory, "torch CNN on load_digits")
