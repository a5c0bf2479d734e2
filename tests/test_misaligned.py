"""float64 (and float32, int32) arrays off their alignment never reach C as typed pointers
(issue 45 item 2): `np.frombuffer(b, offset=1)` is a valid numpy array whose elements C would
read through a misaligned `double *` (undefined behaviour: UBSan reports it, strict-alignment
CPUs fault). Inputs are copied, outputs refused by name. The sanitizer stage (.ci/sanitize.sh)
runs these under UBSan, where a misaligned read is a report that fails the stage; here the
bits are compared with the oracle and the refusals named.
"""

import numpy as np
import pytest
from array_oracle import oracle_sum

from alpha_mpi import kernel
from alpha_mpi.arrays import local
from alpha_mpi.refusals import KernelRefusal

from conftest import bits, misaligned, order_sensitive


def test_the_helper_makes_misaligned_views_with_the_same_values():
    x = order_sensitive(np.random.default_rng(1), 33)
    assert np.array_equal(bits(misaligned(x)), bits(x))


def test_kernel_inputs_are_copied_and_give_the_aligned_bits():
    rng = np.random.default_rng(2)
    xs = [order_sensitive(rng, 257) for _ in range(3)]
    want = np.empty(257)
    kernel.fold(want, xs)
    got = np.empty(257)
    kernel.fold(got, [misaligned(x) for x in xs])
    assert np.array_equal(bits(got), bits(want))
    left, right = misaligned(xs[0]), misaligned(xs[1], 3)
    out = np.empty(257)
    kernel.add(out, left, right)
    assert np.array_equal(bits(out), bits(xs[0] + xs[1]))
    bad = xs[2].copy()
    bad[200] = np.nan
    assert kernel.first_nonfinite(misaligned(bad, 5)) == 200
    got = np.empty(257)
    kernel.tree_eval(got, [misaligned(x) for x in xs], misaligned(np.array([0, 1, -1, 2, -1], np.int32), 2))
    assert np.array_equal(bits(got), bits(want))


@pytest.mark.parametrize("fn", ["add", "fold", "widen", "round"])
def test_a_misaligned_kernel_output_is_refused_by_name(fn):
    x = np.arange(1.0, 9.0)
    out = misaligned(np.zeros(8))
    with pytest.raises(KernelRefusal) as e:
        if fn == "add":
            kernel.add(out, x, x)
        elif fn == "fold":
            kernel.fold(out, [x, x])
        elif fn == "widen":
            kernel.widen_binary32(out, x.astype(np.float32))
        else:
            kernel.round_binary64(misaligned(np.zeros(8, np.float32), 1), x)
    assert e.value.code == "kernel-bad-argument" and "aligned" in e.value.message


def test_binary32_widening_copies_a_misaligned_input():
    x32 = (np.arange(1, 40) / 7).astype(np.float32)
    out = np.empty(x32.size)
    kernel.widen_binary32(out, misaligned(x32, 2))
    assert np.array_equal(bits(out), bits(x32.astype(np.float64)))


def test_the_local_pairwise_value_of_a_misaligned_block_is_the_oracles():
    x = order_sensitive(np.random.default_rng(3), 1000)
    assert bits(np.array([local.tree_value(misaligned(x))]))[0] == bits(np.array([oracle_sum(x.tolist())]))[0]
