"""A torch MLP on scikit-learn's bundled digits with alpha_mpi.torch.DataParallel.

    mpiexec -n 1 python -m mpi4py examples/torch_mlp.py      # the same `digest:` line ...
    mpiexec -n 2 python -m mpi4py examples/torch_mlp.py      # ... on 1, 2 and 4 ranks
    mpiexec -n 4 python -m mpi4py examples/torch_mlp.py
    mpiexec -n 2 python -m mpi4py examples/torch_mlp.py --ddp   # torch DDP: another digest on every rank count

Also a factory for `alpha-mpi train --model torch_mlp:factory` (run from examples/ or with
examples/ on PYTHONPATH): an nn.Module trained in binary64 with the C optimizers.

`python -m mpi4py` aborts the whole job when one rank raises (else its peers wait for the
peer bound, ALPHA_MPI_TIMEOUT); see examples/torch_preempt.py for preemption and docs/pytorch.md.
"""

import torch


def factory(inputs: int = 64, classes: int = 10, hidden: int = 128) -> torch.nn.Module:
    """(batch, inputs) -> (batch, classes) logits."""
    return torch.nn.Sequential(
        torch.nn.Linear(inputs, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, classes)
    )


if __name__ == "__main__":
    from digits_common import run

    run(factory, "torch MLP on load_digits")
