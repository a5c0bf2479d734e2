"""Misaligned float64 blocks and contributions through every front end (issue 45 item 2).

`np.frombuffer(b, offset=1)` views reach the arrays (1-D blocks, N-d tiles, the one-C-call
path a repeated call takes), the Allreducer and allreduce() as contributions: each is copied
before C reads it, and the bits are the oracle's (on data where another order gives other bits).
A misaligned `out` is refused by name (`out-invalid`) on its rank and the refusal reaches every
rank; the next call works. Under the sanitizer stage (.ci/sanitize.sh) UBSan would report any
misaligned read that is left.
"""

import numpy as np
import pytest
from array_oracle import oracle_dot, oracle_sum

from alpha_mpi import arrays, oracle, star
from alpha_mpi.execution import Allreducer, allreduce

from conftest import agree, bits, misaligned, order_sensitive, refusal_code


def _blocks(rank, size, n):
    cuts = [(n * r) // size for r in range(size + 1)]
    return cuts[rank], cuts[rank + 1]


def _f(v):
    return int(bits(np.array([v]))[0])


@pytest.mark.mpi(min_size=2)
def test_misaligned_array_blocks_give_the_oracle_bits_every_call(world):
    size, rank = world.Get_size(), world.Get_rank()
    n = 3001
    rng = np.random.default_rng(45)
    x, y = order_sensitive(rng, n), order_sensitive(rng, n)
    lo, hi = _blocks(rank, size, n)
    mx, my = misaligned(x[lo:hi], 1), misaligned(y[lo:hi], 5)
    want_s, want_d = _f(oracle_sum(x.tolist())), _f(oracle_dot(x.tolist(), y.tolist()))
    got = []
    for _ in range(3):  # the second and third calls with the same objects: the remembered path
        got.append((_f(arrays.sum(world, mx, lo, n)), _f(arrays.dot(world, mx, my, lo, n))))
    d2 = [_f(v) for v in arrays.dots(world, [(mx, my), (mx, mx)], lo, n)]
    ok = all(g == (want_s, want_d) for g in got) and d2 == [want_d, _f(oracle_dot(x.tolist(), x.tolist()))]
    agree(world, ok, f"rank {rank}: {got} {d2} want {(want_s, want_d)}")


@pytest.mark.mpi(min_size=2)
def test_a_misaligned_tile_gives_the_oracle_bits(world):
    size, rank = world.Get_size(), world.Get_rank()
    ny, nx = 4 * size, 37
    g = order_sensitive(np.random.default_rng(7), ny * nx).reshape(ny, nx)
    rows = slice(4 * rank, 4 * rank + 4)
    tile = misaligned(g[rows], 3)
    strided = misaligned(np.ascontiguousarray(g[rows, :]).repeat(2, axis=1), 1)[
        :, ::2
    ]  # not aligned, strided
    want = _f(oracle_sum(g.ravel().tolist()))
    got = [_f(arrays.sum(world, t, (4 * rank, 0), (ny, nx))) for t in (tile, tile, strided)]
    agree(world, got == [want] * 3, f"rank {rank}: {got} want {want}")


@pytest.mark.mpi(min_size=2)
def test_misaligned_contributions_to_an_allreducer_and_allreduce_give_the_oracle_bits(world):
    size, rank = world.Get_size(), world.Get_rank()
    n = 777
    tree = star(range(size), size)
    data = {s: order_sensitive(np.random.default_rng([45, s]), n) for s in range(size)}
    want = bits(np.array(oracle.evaluate(tree, {s: v.tolist() for s, v in data.items()})))
    mine = misaligned(data[rank], 1 + rank % 7)
    a = Allreducer(world, tree, n)
    got = [bits(a({rank: mine})) for _ in range(2)]
    got.append(bits(a({rank: (misaligned(data[rank][:400], 2), misaligned(data[rank][400:], 6))})))
    got.append(bits(allreduce(world, tree, {rank: mine})))
    ok = all(np.array_equal(g, want) for g in got)
    agree(world, ok, f"rank {rank}: {[np.array_equal(g, want) for g in got]} ({a.realization})")
    a.free()


@pytest.mark.mpi(min_size=2)
def test_a_misaligned_out_is_refused_by_name_on_every_rank_and_the_next_call_works(world):
    size, rank = world.Get_size(), world.Get_rank()
    n = 64
    tree = star(range(size), size)
    data = {s: order_sensitive(np.random.default_rng([46, s]), n) for s in range(size)}
    want = bits(np.array(oracle.evaluate(tree, {s: v.tolist() for s, v in data.items()})))
    a = Allreducer(world, tree, n)
    out = misaligned(np.zeros(n)) if rank == size - 1 else np.zeros(n)
    code = refusal_code(lambda: a({rank: data[rank]}, out=out))
    again = a({rank: data[rank]})
    expect = "out-invalid" if rank == size - 1 else "peer-refused"
    agree(world, code == expect and np.array_equal(bits(again), want), f"rank {rank}: {code}")
    a.free()
