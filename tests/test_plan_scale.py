"""Planning at scale (issue 42 item 5): the per-rank programs and the traffic counts are those
the earlier O(p²) planner produced, and building every rank's program costs O(p) in all.

`plan_golden.json` holds, per case (topology, slots, ranks, delivery, layout, mode) and
realization, a digest of every rank's whole program (ops, messages, regions, evaluations,
copies, checks, buffers, slots, result) and of the program's `count`, written by the planner
as it was before this change (each rank's `tree` program scanned every group of the plan):

    PYTHONPATH=<a checkout of that planner> python tests/test_plan_scale.py --write

The functions below use only the public planning API, so the same file writes the golden data
from the old planner and checks the new one against it.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from alpha_mpi.model import DeliverTo, Layout, ReplicateAll, build
from alpha_mpi.planning import plan
from alpha_mpi.planning.check import count
from alpha_mpi.planning.realize import applicable, realize

GOLDEN = Path(__file__).with_name("plan_golden.json")
TOPOLOGIES = ("pairwise", "star", "hierarchy:2", "hierarchy:3")


def cases():
    """(name, topology, slots, ranks, delivery, elements, mode) for every small shape."""
    for p in (1, 2, 3, 4, 5, 7, 8, 13, 16, 33, 64):
        for topology in TOPOLOGIES:
            for slots in sorted({p, 2 * p + 1}):
                for deliver in (None, p - 1):
                    for elements in (1, 5):
                        for mode in ("allreduce", "reduce-scatter"):
                            if mode == "reduce-scatter" and deliver is not None:
                                continue
                            name = f"{topology}/s{slots}/p{p}/d{deliver}/n{elements}/{mode}"
                            yield name, topology, slots, p, deliver, elements, mode


def _program_text(rp) -> str:
    """Everything a rank's program holds, in a fixed order."""
    parts = [
        f"rank {rp.rank} slots {rp.slots} result {rp.result}",
        "ops " + rp.text(),
        "buffers " + repr(rp.buffers),
        "messages " + repr(sorted(rp.messages.items())),
        "regions " + repr(sorted(rp.regions.items())),
        "evals " + repr(rp.evals),
        "copies " + repr(rp.copies),
        "checks " + repr(rp.checks),
        "inputs " + repr(sorted(rp.inputs.items())),
        "merges " + repr(rp.merges),
    ]
    return "\n".join(parts)


def fingerprints(topology, slots, p, deliver, elements, mode) -> dict:
    """realization -> a digest of every rank's program and of the program's Cost."""
    tree = build(topology, slots, p)
    delivery = ReplicateAll() if deliver is None else DeliverTo(deliver)
    tp = plan(tree, delivery, Layout.vector(elements), size=p)
    out = {}
    for name, why in sorted(applicable(tp, mode).items()):
        if why is not None:
            continue
        prog = realize(tp, name, mode=mode)
        h = hashlib.sha256()
        for r in range(p):
            h.update(_program_text(prog.rank(r)).encode() + b"\0")
        h.update(json.dumps(count(prog).to_dict(), sort_keys=True).encode())
        out[name] = h.hexdigest()[:24]
    return out


def _golden() -> dict:
    return json.loads(GOLDEN.read_text())


def test_the_golden_file_covers_every_realization():
    seen = {name for case in _golden().values() for name in case}
    assert seen == {"tree", "scatter", "replicate", "butterfly", "halving"}


def _compare(p):
    golden = _golden()
    checked = 0
    for name, *args in cases():
        if args[2] != p:
            continue
        assert fingerprints(*args) == golden[name], name
        checked += 1
    assert checked and checked == sum(1 for k in golden if f"/p{p}/" in k)


@pytest.mark.parametrize("p", (1, 2, 3, 4, 5, 7, 8, 13, 16))
def test_programs_and_counts_are_those_of_the_quadratic_planner(p):
    _compare(p)


@pytest.mark.parametrize("p", (33, 64))
def test_programs_and_counts_at_33_and_64_ranks(p):
    # slow (tests/kinds.py): replicate's and scatter's programs hold O(p) each
    _compare(p)


class _Counting(tuple):
    """A plan's groups that count how many of them are visited."""

    visits = 0

    def __iter__(self):
        for g in tuple.__iter__(self):
            _Counting.visits += 1
            yield g


def test_building_every_ranks_tree_program_visits_each_group_a_bounded_number_of_times():
    # The quadratic planner visited p groups per rank: 65,536 visits here, against a few p now.
    p = 256
    tp = plan(build("pairwise", p, p), ReplicateAll(), Layout.vector(1), size=p)
    object.__setattr__(tp, "groups", _Counting(tp.groups))
    _Counting.visits = 0
    prog = realize(tp, "tree")
    c = count(prog)
    assert c.sends_per_rank_max >= 1 and len(tp.groups) >= p
    assert _Counting.visits <= 8 * len(tp.groups), _Counting.visits


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    data = {name: fingerprints(*args) for name, *args in cases()}
    lines = [f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(data.items())]
    GOLDEN.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    print(f"wrote {len(data)} cases to {GOLDEN}")


def test_scheduling_a_rank_with_thousands_of_sends_in_flight_stays_linear(monkeypatch):
    # A chain of 2,000 slots on 4 ranks: the hub's rank keeps every leaf's send in flight. The
    # earlier schedule compared each write with every send in flight (millions of overlaps).
    from alpha_mpi.planning.program import Region

    calls = [0]
    overlaps = Region.overlaps

    def counted(self, other):
        calls[0] += 1
        return overlaps(self, other)

    monkeypatch.setattr(Region, "overlaps", counted)
    tp = plan(build("hierarchy:100000000", 2000, 4), ReplicateAll(), Layout.vector(1), size=4)
    prog = realize(tp, "tree")
    ops = sum(len(prog.rank(r).ops) for r in range(4))
    assert ops >= 2000 and calls[0] <= 20 * ops, (calls[0], ops)
