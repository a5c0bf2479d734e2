"""Property tests: random valid trees plan and simulate clean; malformed ones are refused by name."""

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alpha_mpi import (
    Branch,
    DeliverTo,
    Leaf,
    OrderedMembers,
    ParticipantGroup,
    Refusal,
    ReplicateAll,
    plan,
    simulate,
)
from alpha_mpi.model import expression, leaf_sequence


def random_tree(rng, slots, size, bad_owner=None):
    """An arbitrary binary tree over `slots` in that left-to-right order, owners drawn at random."""
    nodes = [Leaf(s, rng.randrange(size)) for s in slots]
    while len(nodes) > 1:
        i = rng.randrange(len(nodes) - 1)
        nodes[i : i + 2] = [Branch(nodes[i], nodes[i + 1], rng.randrange(size))]
    return nodes[0]


@st.composite
def valid_cases(draw):
    n = draw(st.integers(1, 64))
    size = draw(st.integers(1, 16))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = random.Random(seed)
    slots = list(range(n))
    rng.shuffle(slots)
    tree = random_tree(rng, slots, size)
    leaf_owners = sorted({leaf.owner for leaf in leaf_sequence(tree)})
    deliver = draw(st.one_of(st.just(None), st.sampled_from(leaf_owners)))
    ordered = draw(st.booleans())
    return tree, size, deliver, slots, ordered


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_cases())
def test_random_valid_trees_plan_and_simulate_clean(case):
    tree, size, deliver, slots, ordered = case
    cov = OrderedMembers(slots) if ordered else ParticipantGroup(range(len(slots)))
    delivery = ReplicateAll() if deliver is None else DeliverTo(deliver)
    p = plan(tree, delivery, 3, size=size, coverage=cov)
    tr = simulate(p)
    want = expression(tree)
    assert set(tr.results) == set(p.receivers)
    assert all(v == want for v in tr.results.values())
    # Every frame that was planned was sent once and received once.
    assert sum(tr.sent_msgs) == sum(tr.recv_msgs) == len(p.edges)


KINDS = ("missing", "duplicate", "unknown", "owner", "order")
EXPECTED = {
    "missing": "coverage-missing-leaf",
    "duplicate": "coverage-duplicate-leaf",
    "unknown": "coverage-unknown-leaf",
    "owner": "owner-out-of-range",
    "order": "coverage-order-mismatch",
}


@settings(max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(KINDS), st.integers(2, 24), st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_malformed_trees_are_refused_by_name(kind, n, size, seed):
    rng = random.Random(seed)
    slots = list(range(n))
    rng.shuffle(slots)
    coverage = ParticipantGroup(range(n))
    if kind == "missing":
        slots.pop(rng.randrange(n))
    elif kind == "duplicate":
        i, j = rng.sample(range(n), 2)
        slots[i] = slots[j]
    elif kind == "unknown":
        slots[rng.randrange(n)] = n + rng.randrange(100)
    elif kind == "order":
        declared = list(slots)
        while declared == slots:
            rng.shuffle(declared)
        coverage = OrderedMembers(declared)
    tree = random_tree(rng, slots, size)
    if kind == "owner":
        # Put one node (leaf or branch) on a rank the communicator does not have.
        nodes = [tree]
        path = []
        while isinstance(nodes[-1], Branch) and rng.random() < 0.7:
            b = nodes[-1]
            side = rng.choice(("left", "right"))
            path.append((b, side))
            nodes.append(getattr(b, side))
        bad = nodes[-1]
        bad_owner = size + rng.randrange(4)
        node = Leaf(bad.slot, bad_owner) if isinstance(bad, Leaf) else Branch(bad.left, bad.right, bad_owner)
        for b, side in reversed(path):
            node = Branch(node, b.right, b.owner) if side == "left" else Branch(b.left, node, b.owner)
        tree = node
    try:
        plan(tree, None, 2, size=size, coverage=coverage)
    except Refusal as e:
        assert e.code == EXPECTED[kind], (kind, e.code, str(e))
    else:
        raise AssertionError(f"{kind} tree was planned: {expression(tree, placed=True)}")
