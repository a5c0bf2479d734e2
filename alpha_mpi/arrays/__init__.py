"""Decomposition-independent reductions of distributed float64 vectors (for solvers).

    from alpha_mpi import arrays
    r = arrays.dot(comm, x_local, y_local, offset, n)      # the same float on every rank

`x_local` is this rank's contiguous block [offset, offset + len) of a global vector of length
n; blocks are disjoint and cover [0, n), any sizes, any order, empty blocks allowed. The result
is the pairwise binary tree over the global indices (csrc/kernel/pairwise.h), so its bits depend on
the data and n only: 1, 2, 3 or 1000 ranks, even or uneven blocks, all give the same bits.
An N-d tile (offset and shape as tuples) reduces the flattened C-order array the same way:

    r = arrays.dot(cart, u[1:-1, 1:-1], v_tile, (y0, x0), (NY, NX))   # any tiling, same bits

- `sum`, `dot`, `norm2`, `dots` (k inner products in one exchange): alpha_mpi.arrays.api
- the tree, the exchange's frames and the coverage verdicts, as pure functions: .pairwise; the
  exchange's schedule (`schedule`) and Program: alpha_mpi.planning.array_program
- N-d tiles: their runs, verdicts and frame sizes (pure): .tiles; one tile call: .tile_call
- the exchange over MPI (point-to-point frames, bounded waits): .exchange
- a call whose arguments are those of earlier checked calls (a solver's loop): one C call, .fast
"""

from ..planning.array_program import schedule  # noqa: F401
from .api import dot, dots, norm2, reset, sum  # noqa: F401,A004
from .pairwise import simulate, summary_ranges  # noqa: F401

__all__ = ["sum", "dot", "norm2", "dots", "reset", "schedule", "simulate", "summary_ranges"]
