"""`auto` costs what its choice costs: after construction nothing of the choice remains, so an
Allreducer built with realization="auto" runs the very program, op table and per-call path of
the same realization asked for by name (the per-call cost is the lead's benchmark to show)."""

import numpy as np
import pytest

from alpha_mpi import pairwise
from alpha_mpi.execution import Allreducer

from conftest import agree, bits, slot_data


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("n", [1, 128, 1 << 17])
def test_auto_runs_the_program_of_its_choice_by_name(world, n):
    size = world.Get_size()
    tree = pairwise(range(2 * size), size)
    auto = Allreducer(world, tree, n, realization="auto", timeout=30)
    named = Allreducer(world, tree, n, realization=auto.realization, timeout=30)
    same = (
        auto.plan.identity == named.plan.identity
        and auto.executor.rp.text() == named.executor.rp.text()
        and auto.executor.compiled.ops == named.executor.compiled.ops
        and type(auto.executor) is type(named.executor)
    )
    data = slot_data(2 * size, n, seed=n)
    mine = {s: data[s] for s in auto.slots}
    a, b = auto.run(mine), named.run(mine)
    agree(world, same and np.array_equal(bits(a), bits(b)), f"auto({auto.realization}) vs by name")
    auto.free()
    named.free()
