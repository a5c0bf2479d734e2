"""examples/inside_mpi4py.py (docs/mpi4py.md) runs as it is on 2 and 5 ranks: the same bits on
COMM_WORLD, on each half of a Split and on a Dup, with the user's own any-source any-tag receive
pending on COMM_WORLD meanwhile and getting the user's message. The script checks every rank
and exits 1 on any difference; this test launches it and reads its digest."""

import re

import pytest

from conftest import needs_mpiexec, run_example

pytestmark = needs_mpiexec


@pytest.mark.parametrize("ranks", [2, 5])
def test_the_example_runs_as_it_is(ranks):
    out = run_example(ranks, ["inside_mpi4py.py"], limit=180)
    assert "the same bits on COMM_WORLD, each half and a Dup" in out, out
    assert re.search(rf"^ranks {ranks}  digest [0-9a-f]{{16}}$", out, re.M), out


def test_the_digest_is_the_one_of_the_readme_example():
    """The same eight slots and values as examples/quickstart.py: the same bits, however placed."""
    digests = {
        name: re.search(r"digest ([0-9a-f]{16})", run_example(2, [name], limit=180)).group(1)
        for name in ("inside_mpi4py.py", "quickstart.py")
    }
    assert len(set(digests.values())) == 1, digests
