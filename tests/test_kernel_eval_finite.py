"""ak_tree_eval_finite (the engine's E op and the F op of its output in one kernel call): the
same bits as ak_tree_eval, and the same verdict as ak_first_nonfinite on the result, on both
kernel paths (chains and general trees), across its block boundaries; the refusals of
ak_tree_eval stay refusals (a program that does not fit, an output overlapping an input)."""

import numpy as np
import pytest

from alpha_mpi import kernel

from conftest import order_sensitive

ffi, lib = kernel.ffi, kernel.lib
B = lib.AK_EVAL_CHECK_BLOCK
CHAIN = [0, 1, -1, 2, -1, 3, -1]  # ((x0 + x1) + x2) + x3
TREE = [0, 1, -1, 2, 3, -1, -1]  # (x0 + x1) + (x2 + x3)


def _run(fn, out, xs, prog, *extra):
    ptrs = ffi.new("double *[]", [ffi.from_buffer("double[]", x) for x in xs])
    code = np.asarray(prog, dtype=np.int32)
    args = [
        ffi.from_buffer("double[]", out, True),
        ptrs,
        len(xs),
        out.size,
        ffi.from_buffer("int32_t[]", code),
        len(code),
    ]
    return fn(*args, *extra)


def _both(xs, prog, n):
    want, got = np.empty(n), np.empty(n)
    assert _run(lib.ak_tree_eval, want, xs, prog) == 0
    nf = ffi.new("int32_t *", 7)
    assert _run(lib.ak_tree_eval_finite, got, xs, prog, nf) == 0
    return want, got, nf[0]


@pytest.mark.parametrize("prog", [CHAIN, TREE], ids=["chain", "tree"])
@pytest.mark.parametrize("n", [0, 1, B - 1, B, B + 1, 2 * B + 5])
def test_same_bits_and_verdict_as_the_two_calls(prog, n):
    rng = np.random.default_rng(n)
    xs = [order_sensitive(rng, n) for _ in range(4)]
    want, got, nf = _both(xs, prog, n)
    assert np.array_equal(want.view(np.uint64), got.view(np.uint64)) and nf == 0
    # numpy adds element by element in binary64: the declared order, and the other one differs
    chain = ((xs[0] + xs[1]) + xs[2]) + xs[3]
    tree = (xs[0] + xs[1]) + (xs[2] + xs[3])
    declared, other = (chain, tree) if prog is CHAIN else (tree, chain)
    assert np.array_equal(got.view(np.uint64), declared.view(np.uint64))
    if n >= B:
        assert not np.array_equal(got.view(np.uint64), other.view(np.uint64))


@pytest.mark.parametrize("where", [0, B - 1, B, 2 * B + 4])
@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
def test_a_nonfinite_value_in_any_block_is_seen(where, poison):
    n = 2 * B + 5
    xs = [np.ones(n) for _ in range(4)]
    xs[2][where] = poison
    want, got, nf = _both(xs, TREE, n)
    assert nf == 1 and lib.ak_first_nonfinite(ffi.from_buffer("double[]", got), n) == where
    assert np.array_equal(want.view(np.uint64), got.view(np.uint64))  # evaluated to the end


def test_overflow_to_inf_from_finite_inputs_is_seen():
    n = B + 3
    xs = [np.full(n, 1.7e308) for _ in range(4)]
    _, _, nf = _both(xs, CHAIN, n)
    assert nf == 1


def test_an_output_overlapping_an_input_further_on_is_refused_like_tree_eval():
    buf = np.ones(3 * B)
    xs = [buf[B:], np.ones(2 * B), np.ones(2 * B), np.ones(2 * B)]
    out = buf[: 2 * B]  # overlaps x0 partially over the whole range, never within one block
    nf = ffi.new("int32_t *")
    assert _run(lib.ak_tree_eval, out, xs, TREE) == lib.AK_ERR_BAD_ARGUMENT
    assert _run(lib.ak_tree_eval_finite, out, xs, TREE, nf) == lib.AK_ERR_BAD_ARGUMENT
    assert _run(lib.ak_tree_eval_finite, out, xs, [0, 1, -1, -1], nf) == lib.AK_ERR_BAD_PROGRAM
    assert np.all(buf == 1.0)  # nothing written
