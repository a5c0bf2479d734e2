"""Failure semantics of the one executor, on the latency and the bandwidth paths.

A refusal on one rank travels as a flag in that rank's frames: it still runs the whole program
(on zeros, never on its data), every rank completes the round, the refusing rank raises its own
code and every other rank `peer-refused` naming it; the next call works on every rank.
"""

import numpy as np
import pytest

from alpha_mpi import oracle, pairwise, plan, star
from alpha_mpi.execution import Allreducer
from alpha_mpi.execution import frames as fr
from alpha_mpi.planning.realize import applicable
from alpha_mpi.refusals import Refusal

from conftest import agree, bits, slot_data

TIMEOUT = 20


def _catch(fn):
    try:
        return fn(), None
    except Refusal as e:
        return None, e


def _cases(size):
    """(tree, n, realization) over both paths: small (one message per frame) and large."""
    out = []
    for n in (5, 20000):
        tp = plan(pairwise(range(2 * size), size), None, n, size=size)
        out += [(tp.tree, n, k) for k, v in applicable(tp).items() if v is None]
    return out


BAD = {
    "float32": lambda x: x.astype(np.float32),
    "short": lambda x: x[:-1].copy(),
    "tuple-int": lambda x: (x.astype(np.int64),),
    "not-array": lambda x: list(x),
}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("bad", sorted(BAD))
def test_one_rank_refusing_is_named_on_every_rank_and_the_next_call_works(world, bad):
    size, rank = world.Get_size(), world.Get_rank()
    culprit = size - 1
    for tree, n, name in _cases(size):
        a = Allreducer(world, tree, n, realization=name, timeout=TIMEOUT)
        data = slot_data(2 * size, n, seed=n)
        mine = {s: data[s] for s in a.slots}
        if rank == culprit:
            first = a.slots[0]
            mine = (
                dict(mine, **{first: BAD[bad](mine[first])})
                if False
                else {**mine, first: BAD[bad](mine[first])}
            )
        out = np.full(n, 2.5)
        _, err = _catch(lambda: a.run(mine, out=out))
        if rank == culprit:
            want = {
                "float32": "dtype-invalid",
                "short": "contribution-shape",
                "tuple-int": "dtype-invalid",
                "not-array": "dtype-invalid",
            }[bad]
            ok = err is not None and err.code == want
        else:
            ok = (
                err is not None
                and err.code == "peer-refused"
                and err.context["peer"] == culprit
                and err.context["peer_code"] in ("dtype-invalid", "contribution-shape")
            )
        agree(world, ok, f"{name} n={n} rank {rank}: {err}")
        if n < 8192:
            agree(world, np.all(out == 2.5), f"{name}: out left as it was")
        got, err = _catch(lambda: a.run({s: data[s] for s in a.slots}))
        want = np.array(oracle.evaluate(tree, {s: v.tolist() for s, v in data.items()}))
        agree(world, err is None and np.array_equal(bits(got), bits(want)), f"{name} next call: {err}")
        a.free()


OUTS = {
    "F-order 2-D": lambda n: np.zeros((2, n), order="F")[:1, :],  # (1, n), strided: not C-contiguous
    "float32": lambda n: np.zeros(n, dtype=np.float32),
    "wrong size": lambda n: np.zeros(n + 1),
    "read-only": lambda n: np.frombuffer(bytes(8 * n)),
    "a list": lambda n: [0.0] * n,
}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind", sorted(OUTS))
def test_a_bad_out_is_refused_by_name_and_travels_as_a_flag(world, kind):
    size, rank = world.Get_size(), world.Get_rank()
    for tree, n, name in _cases(size):
        a = Allreducer(world, tree, n, realization=name, timeout=TIMEOUT)
        data = slot_data(2 * size, n, seed=3)
        mine = {s: data[s] for s in a.slots}
        out = OUTS[kind](n) if rank == 0 else None
        _, err = _catch(lambda: a.run(mine, out=out))
        want = "out-invalid" if rank == 0 else "peer-refused"
        agree(world, err is not None and err.code == want, f"{kind} {name} rank {rank}: {err}")
        got, err = _catch(lambda: a.run(mine))
        agree(world, err is None and got is not None, f"{kind} {name}: next call {err}")
        a.free()


@pytest.mark.mpi(min_size=2)
def test_a_2d_c_order_out_is_written(world):
    size, rank = world.Get_size(), world.Get_rank()
    tree = star(range(size), size)
    a = Allreducer(world, tree, 12, timeout=TIMEOUT)
    out = np.zeros((3, 4))
    got = a.run({rank: np.full(12, 1.0)}, out=out)
    agree(world, got is out and np.all(out == size), "2-D out")


@pytest.mark.mpi(min_size=2)
def test_a_corrupted_payload_is_refused_when_the_check_is_on(world, monkeypatch):
    """ALPHA_MPI_PAYLOAD_CHECK=1: rank 1 flips a payload bit after its crc32 was written (small
    frames: the byte itself; large ones, whose payload travels apart: the crc field). The
    receiver refuses `frame-payload-corrupt`, every other rank `peer-refused` (the flag round
    after the run reaches the ranks no frame of the receiver reaches)."""
    import struct

    monkeypatch.setenv("ALPHA_MPI_PAYLOAD_CHECK", "1")
    size, rank = world.Get_size(), world.Get_rank()
    for tree, n, name in _cases(size):
        a = Allreducer(world, tree, n, realization=name, timeout=TIMEOUT)
        data = slot_data(2 * size, n, seed=5)
        mine = {s: data[s] for s in a.slots}
        assert a.executor.payload_check

        def flip(index, mv, n=n):
            if len(mv) > 128:
                mv[128 + 3] ^= 0x10
            else:
                struct.pack_into("<I", mv, 108, struct.unpack_from("<I", mv, 108)[0] ^ 1)
                fr.seal(mv)

        if rank == 1:
            a.executor.send_hook = flip
        _, err = _catch(lambda: a.run(mine))
        codes = world.allgather(None if err is None else err.code)  # test-side verdict
        agree(
            world,
            "frame-payload-corrupt" in codes
            and all(c in ("frame-payload-corrupt", "peer-refused") for c in codes),  # every rank (flag round)
            f"{name} n={n}: {codes}",
        )
        a.executor.send_hook = None
        got, err = _catch(lambda: a.run(mine))
        want = np.array(oracle.evaluate(tree, {s: v.tolist() for s, v in data.items()}))
        agree(world, err is None and np.array_equal(bits(got), bits(want)), f"{name} next call: {err}")
        a.free()
