"""Refusals over MPI: mismatched peers, tampered frames, bad contributions, non-finite values.

Every case uses its own Combiner (its own duplicated communicator) with a short timeout, so a
refused run cannot leave stale frames for the next test, and no rank waits more than seconds.
"""

import struct

import numpy as np
import pytest
from test_frames import FIELDS

from alpha_mpi import Branch, DeliverTo, Leaf, Refusal, ReplicateAll, hierarchy, plan, star
from alpha_mpi.execution import Combiner
from alpha_mpi.execution import frames as fr
from alpha_mpi.planning.flag_rounds import distances

from conftest import agree, slot_data

SHORT = 2.0


def run_and_catch(c, contributions):
    try:
        return c.run(contributions), None
    except Refusal as e:
        return None, e.code


def build_and_catch(build):
    try:
        return build(), None
    except Refusal as e:
        return None, e.code


@pytest.mark.mpi(min_size=2)
def test_star_peer_refuses_frames_from_a_hierarchy_peer(world):
    """A star on rank 0, a hierarchy elsewhere: the build agreement refuses on every rank (no
    frame moves), and the next build on every rank works."""
    size, rank = world.Get_size(), world.Get_rank()
    slots = 2 * size
    tree = star(range(slots), size) if rank == 0 else hierarchy(range(slots), size, 2)
    p = plan(tree, ReplicateAll(), 16, size=size)
    _, code = build_and_catch(lambda: Combiner(world, p, timeout=SHORT))
    agree(world, code == "executor-identity-mismatch", f"rank {rank} got {code}")
    good = plan(star(range(slots), size), ReplicateAll(), 16, size=size)
    c = Combiner(world, good, timeout=SHORT)
    data = slot_data(slots, 16)
    got, code = run_and_catch(c, {s: data[s] for s in good.slots_of(rank)})
    agree(world, code is None and got is not None, f"rank {rank}: next build: {code}")
    c.free()


def tamper(field):
    """A send hook that changes one header field of every frame this rank sends (CRC made valid)."""

    def hook(index, mv):
        off, fmt, _ = FIELDS[field]
        (old,) = struct.unpack_from("<" + fmt, mv, off)
        new = bytes(b ^ 0x5A for b in old) if isinstance(old, bytes) else old + 1
        struct.pack_into("<" + fmt, mv, off, new)
        fr.seal(mv)

    return hook


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("field", sorted(FIELDS))
def test_tampered_header_is_refused_before_any_arithmetic(world, field):
    size, rank = world.Get_size(), world.Get_rank()
    tree = Branch(Leaf(0, 0), Leaf(1, 1), 0)
    # rank 1 sends one frame and waits for no data; the flag rounds after the run (always run for
    # DeliverTo) tell it rank 0 refused (it used to return as after a clean call: issue 45)
    p = plan(tree, DeliverTo(0), 8, size=size)
    c = Combiner(world, p, timeout=SHORT)
    if rank == 1:
        hook = tamper(field)
        c.send_hook = lambda i, mv: hook(i, mv) if len(mv) > fr.HEADER else None  # its data frame only
    data = slot_data(2, 8)
    out = np.full(8, -1.5)
    try:
        c.run({s: data[s] for s in p.slots_of(rank)}, out=out)
        code = None
    except Refusal as e:
        code = e.code
    if rank == 0:
        # Rank 0 evaluates s0 + s1 straight into `out`: untouched means no arithmetic ran.
        ok = code == FIELDS[field][2] and np.all(out == -1.5)
        agree(world, ok, f"{field}: {code}, out touched={not np.all(out == -1.5)}")
    else:
        agree(world, code == "peer-refused", f"rank {rank}: {code}")


@pytest.mark.mpi(min_size=2)
def test_another_payload_length_is_refused_when_building(world):
    size, rank = world.Get_size(), world.Get_rank()
    tree = Branch(Leaf(0, 0), Leaf(1, 1), 0)
    n = 8 if rank == 0 else 9
    p = plan(tree, DeliverTo(0), n, size=size)
    _, code = build_and_catch(lambda: Combiner(world, p, timeout=SHORT))
    agree(world, code == "executor-identity-mismatch", f"rank {rank}: {code}")


@pytest.mark.mpi(min_size=2)
def test_out_of_step_peer_is_refused(world):
    size, rank = world.Get_size(), world.Get_rank()
    tree = Branch(Leaf(0, 0), Leaf(1, 1), 0)
    p = plan(tree, DeliverTo(0), 4, size=size)
    c = Combiner(world, p, timeout=SHORT)
    if rank == 1:
        c.prepare().step = (
            5  # as if rank 1 had run five more combines (the frame step lives in the prepared run)
        )
    _, code = run_and_catch(c, {s: np.ones(4) for s in p.slots_of(rank)})
    # rank 0 finds rank 1's data frame of another step; in the flag rounds after the run (always
    # run for DeliverTo) rank 1 and every rank it sends to find a frame of another step; every
    # other rank names a refusing peer
    stepped = {0, 1} | {(1 + d) % size for d in distances(size)}
    want = "frame-step-mismatch" if rank in stepped else "peer-refused"
    agree(world, code == want, f"rank {rank}: {code}")


@pytest.mark.mpi(min_size=2)
def test_contribution_refusals_are_local_and_named(world):
    size, rank = world.Get_size(), world.Get_rank()
    p = plan(star(range(size), size), None, 4, size=size)
    c = Combiner(world, p, timeout=SHORT)
    cases = [
        ({}, "contribution-missing"),
        ({rank: np.ones(4), size + 3: np.ones(4)}, "contribution-unexpected"),
        ({rank: np.ones(5)}, "contribution-shape"),
        ({rank: np.ones(4, dtype=np.float32)}, "dtype-invalid"),
    ]
    for contributions, want in cases:
        _, code = run_and_catch(c, contributions)
        agree(world, code == want, f"{want}: {code}")
    # The channel stayed clean: a good run still works afterwards.
    got, code = run_and_catch(c, {rank: np.full(4, float(rank))})
    agree(world, code is None and got[0] == float(sum(range(size))), f"after refusals: {code}")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
def test_non_finite_contribution_refuses_on_every_receiver(world, poison):
    size, rank = world.Get_size(), world.Get_rank()
    slots = 2 * size
    p = plan(hierarchy(range(slots), size, 2), None, 64, size=size)
    c = Combiner(world, p, timeout=10)
    data = slot_data(slots, 64)
    bad_slot = slots - 1
    data[bad_slot][17] = poison
    _, code = run_and_catch(c, {s: data[s] for s in p.slots_of(rank)})
    owner = p.slots_of(rank)
    want = "non-finite-contribution" if bad_slot in owner else "non-finite-combined"
    agree(world, code == want, f"rank {rank}: {code}, wanted {want}")
    # Communication completed, so the same combiner runs the next step cleanly.
    clean = slot_data(slots, 64, seed=1)
    got, code = run_and_catch(c, {s: clean[s] for s in p.slots_of(rank)})
    agree(world, code is None and got is not None, f"next step: {code}")


@pytest.mark.mpi(min_size=2)
def test_overflowing_sum_is_refused_as_non_finite_combined(world):
    size, rank = world.Get_size(), world.Get_rank()
    p = plan(star(range(size), size), None, 3, size=size)
    c = Combiner(world, p, timeout=10)
    _, code = run_and_catch(c, {rank: np.full(3, 1.7e308)})
    agree(world, code == "non-finite-combined", f"rank {rank}: {code}")


@pytest.mark.mpi(min_size=2)
def test_plan_for_another_size_is_refused(world):
    with pytest.raises(Refusal) as e:
        Combiner(world, plan(star(range(3), 1), None, 1, size=world.Get_size() + 1))
    assert e.value.code == "plan-rank-mismatch"
