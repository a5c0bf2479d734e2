"""One outcome per call on every rank (issue 45 item 3): no rank returns as after a clean call
while its peers refuse that call, and mistakes that used to end in `peer-timeout` are named.

- DeliverTo: the ranks off the delivery's path only send; the flag rounds after the program
  (planning/flag_rounds.py: always run for a delivery to one rank) tell them the call's outcome.
- Two Allreducers used in a different order on one rank, or one rebuilt on one rank: named
  `executor-identity-mismatch` on every rank within a second (engine_walk: a wait that sees the
  awaited peer's first message belong to another executor or round), never the whole bound.

Each test fails on 3af55f0, where the senders returned None and the mistakes waited out the bound.
"""

import numpy as np
import pytest

from alpha_mpi import DeliverTo, Refusal, hierarchy, oracle, plan, star
from alpha_mpi.execution import Allreducer, Combiner
from alpha_mpi.execution import frames as fr

from conftest import agree, bits, slot_data

# A generous bound: a mistake must be named long before it (never by waiting it out).
BOUND = 120.0
PROMPT = 1.0  # seconds within which every rank names it (the target)


def _want(tree, data):
    return np.array(oracle.evaluate(tree, {s: v.tolist() for s, v in data.items()}))


def _outcome(fn):
    """(result, code, context) of fn()."""
    try:
        return fn(), None, {}
    except Refusal as e:
        return None, e.code, e.context


# -- DeliverTo: the ranks that only send learn the outcome ----------------------------------------
TREES = {"star": lambda s, p: star(range(s), p), "hierarchy": lambda s, p: hierarchy(range(s), p, 2)}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("topology", sorted(TREES))
@pytest.mark.parametrize("fault", ["target-input", "sender-input", "nan", "frame"])
def test_deliver_to_a_refused_call_is_refused_on_every_rank_and_the_next_call_works(world, topology, fault):
    """DeliverTo(0): a refusal anywhere (the target's bad input, the last rank's bad input or
    NaN, a frame of another plan from the last rank) is named on every rank, the ranks that only
    send included (they used to return None as after a clean call); the next call gives the
    target the oracle's bits and every other rank None (a frame of another plan breaks the
    executor where it lands: no next call then)."""
    size, rank = world.Get_size(), world.Get_rank()
    last = size - 1
    n = 33
    tree = TREES[topology](size, size)
    p = plan(tree, DeliverTo(0), n, size=size)
    c = Combiner(world, p, timeout=BOUND)
    data = slot_data(size, n, seed=45)
    mine = {s: data[s] for s in p.slots_of(rank)}
    bad = dict(mine)
    if fault == "target-input" and rank == 0:
        bad = {s: v[:-1] for s, v in mine.items()}
    elif fault == "sender-input" and rank == last:
        bad = {s: v.astype(np.float32) for s, v in mine.items()}
    elif fault == "nan" and rank == last:
        bad = {s: np.where(np.arange(n) == 3, np.nan, v) for s, v in mine.items()}
    elif fault == "frame" and rank == last:

        def tamper(index, mv):
            if len(mv) > fr.HEADER:  # a data frame (the flag rounds' frames carry no payload)
                mv[40] ^= 0x5A  # the plan identity: another plan's frame
                fr.seal(mv)

        c.send_hook = tamper
    _, code, ctx = _outcome(lambda: c.run(bad))
    want = {
        "target-input": ("contribution-shape", "peer-refused", 0),
        "sender-input": ("dtype-invalid", "peer-refused", last),
        "nan": ("non-finite-contribution", "non-finite-combined", None),
        "frame": (None, "peer-refused", None),
    }[fault]
    at = {"target-input": 0, "sender-input": last, "nan": last}.get(fault)
    if fault == "frame":  # the rank that received it names the frame; every other rank names that rank
        found = str(code).startswith("frame-") or str(ctx.get("peer_code")).startswith("frame-")
        agree(world, code is not None and found, f"{topology} frame: rank {rank} got {code} {ctx}")
        c.free()  # a frame of another plan breaks the executor where it landed: no next call
        return
    if rank == at:
        ok = code == want[0]
    else:
        ok = code == want[1] and (want[2] is None or ctx.get("peer") == want[2])
    agree(world, ok, f"{topology} {fault}: rank {rank} got {code} {ctx}")
    c.send_hook = None
    got, code, _ = _outcome(lambda: c.run(mine))
    if rank == 0:
        ok = code is None and np.array_equal(bits(got), bits(_want(tree, data)))
    else:
        ok = code is None and got is None
    agree(world, ok, f"{topology} {fault}: the next call on rank {rank}: {code}")
    c.free()


@pytest.mark.mpi(min_size=2)
def test_deliver_to_through_allreducer_names_a_peers_refusal_on_the_senders(world):
    """The same through the Allreducer's tree and scatter realizations (each may deliver to one
    rank): a bad input on the target is `peer-refused` on every other rank."""
    size, rank = world.Get_size(), world.Get_rank()
    n, target = 40, 0  # the hub: every other rank only sends
    tree = star(range(size), size)
    data = slot_data(size, n, seed=7)
    for name in ("tree", "scatter"):
        a = Allreducer(world, tree, n, DeliverTo(target), realization=name, timeout=BOUND)
        mine = {s: data[s] for s in a.plan.slots_of(rank)}
        bad = {s: v[:3] for s, v in mine.items()} if rank == target else mine
        _, code, ctx = _outcome(lambda: a.run(bad))
        ok = (
            code == "contribution-shape"
            if rank == target
            else code == "peer-refused" and ctx["peer"] == target
        )
        agree(world, ok, f"{name}: rank {rank} got {code}")
        got = a.run(mine)
        ok = np.array_equal(bits(got), bits(_want(tree, data))) if rank == target else got is None
        agree(world, ok, f"{name}: the next call on rank {rank}")
        a.free()
