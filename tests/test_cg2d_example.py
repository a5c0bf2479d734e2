"""examples/cg2d.py: CG on a Cartesian communicator with 2-D tiles and a halo exchange. The
residual history digest with alpha_mpi.arrays.dot is the same for the tilings 1x1, 2x1, 1x2,
2x2, 3x1 and 1x3 on 1-4 ranks (and equals the row-strip CG of examples/cg.py on a square grid),
while the comm.Allreduce version's changes with the tiling.

Launches its own mpiexec per tiling, each under a hard `timeout` (seconds each)."""

import re

from conftest import needs_mpiexec, run_example

pytestmark = needs_mpiexec

TILINGS = [(1, 1), (2, 1), (1, 2), (3, 1), (1, 3), (2, 2)]
LINE = r"reduce=(\w+) iterations=\d+ residual=\S+ digest=([0-9a-f]{16})"


def digests(p, *args):
    out = run_example(p, ["cg2d.py", *args])
    found = dict(re.findall(LINE, out))
    assert found, out
    return found, out


def test_one_digest_for_every_tiling():
    runs = {
        dims: digests(dims[0] * dims[1], "--grid", "37x53", "--dims", f"{dims[0]}x{dims[1]}")
        for dims in TILINGS
    }
    alpha = {d: found["alpha"] for d, (found, _) in runs.items()}
    mpi = {d: found["mpi"] for d, (found, _) in runs.items()}
    shown = "\n".join(out for _, out in runs.values())
    assert len(set(alpha.values())) == 1, f"alpha digests differ across tilings: {alpha}\n{shown}"
    # The point of the example: the usual Allreduce of partial dots depends on the tiling.
    assert len(set(mpi.values())) > 1, f"the data must make the Allreduce order visible: {mpi}\n{shown}"
    tiles = re.search(r"# tiles \(offset, shape\): (.*)", runs[(2, 2)][1]).group(1)
    assert tiles.count("(") == 8 and "(0, 26)" in tiles and "(18, 0)" in tiles, tiles  # 2x2, uneven


def test_the_tiled_solve_is_the_row_strip_solve():
    """The same problem, the same element-wise arithmetic: on a square grid the 2-D tiled CG and
    the 1-D row-strip CG of examples/cg.py print one alpha digest (N-d tiles reduce the
    flattened vector, bit for bit)."""
    tiled, _ = digests(4, "--grid", "24x24", "--dims", "2x2", "--reduce", "alpha")
    out = run_example(3, ["cg.py", "--grid", "24", "--reduce", "alpha"])  # uneven row strips
    strips = dict(re.findall(LINE, out))
    assert tiled["alpha"] == strips["alpha"]
