"""Independent oracle for alpha_mpi.arrays: the pairwise tree over global indices in plain
Python floats. It imports nothing from alpha_mpi and shares no code with the kernel, the
planner or the exchange; it follows the definition and nothing else:

    node [lo, hi): size 1 -> the term at lo; else split at m = lo + 2^floor(log2(size - 1))
    and add value[lo, m) + value[m, hi), left operand first. Root [0, n); n = 0 gives 0.0.
    Terms: x_i (sum) or x_i * y_i (dot; Python float multiplication rounds once, no FMA).
"""

import math


def pairwise(terms, lo=0, hi=None):
    hi = len(terms) if hi is None else hi
    if hi - lo == 0:
        return 0.0
    if hi - lo == 1:
        return terms[lo]
    m = lo + (1 << ((hi - lo - 1).bit_length() - 1))
    return pairwise(terms, lo, m) + pairwise(terms, m, hi)


def oracle_sum(x):
    return pairwise([float(v) for v in x])


def oracle_dot(x, y):
    return pairwise([float(a) * float(b) for a, b in zip(x, y)])


def oracle_norm2(x):
    return math.sqrt(oracle_dot(x, x))


def sequential_sum(terms):
    """Left to right, (((t0 + t1) + t2) + ...): the order a plain loop uses."""
    acc = 0.0
    for t in terms:
        acc = acc + t
    return acc
