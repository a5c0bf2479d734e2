"""`alpha-mpi train --model blas_mlp:factory`: the built-in MLP's maths through numpy and BLAS
(alpha_mpi.learning.mlp.BlasMLP, machine-dependent), for tests that need a model whose bits
depend on the BLAS kernel."""

from alpha_mpi.learning.mlp import BlasMLP


def factory(inputs, classes):
    return BlasMLP(inputs, 700, classes)
