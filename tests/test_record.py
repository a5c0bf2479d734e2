"""Records (alpha_mpi/_record.py) keep the frozen dataclasses' semantics they replace."""

import copy
import pickle

import pytest

from alpha_mpi._record import FrozenInstanceError
from alpha_mpi.planning.program import Merge, Op, RankProgram, Region


def test_a_record_refuses_assignment_and_deletion_like_a_frozen_dataclass():
    r = Region("x", 0, 4)
    with pytest.raises(FrozenInstanceError):
        r.count = 5
    with pytest.raises(AttributeError):  # FrozenInstanceError is an AttributeError, as dataclasses'
        del r.buf
    with pytest.raises(AttributeError):
        r.other = 1  # no field of that name, no __dict__ either
    assert r == Region("x", 0, 4) and r.count == 4


def test_equality_and_hash_go_by_class_and_fields_in_order():
    assert Op("S", 3) == Op("S", 3) and hash(Op("S", 3)) == hash(Op("S", 3))
    assert Op("S", 3) != Op("W", 3) and Op("S", 3) != Op("S", 4)
    assert Op("S", 3) != ("S", 3)  # not a tuple
    assert Region("a", 1, 2) != Op("a", 1)
    assert len({Op("S", 3), Op("S", 3), Op("W", 3)}) == 2


def test_repr_names_the_fields_and_leaves_out_the_hidden_ones():
    assert repr(Region("x", 0, 4)) == "Region(buf='x', offset=0, count=4)"
    rp = RankProgram(1, (1,), (), {7: None})
    text = repr(rp)
    assert text.startswith("RankProgram(rank=1, slots=(1,), buffers=(), evals=()")
    assert "messages" not in text and "regions" not in text and "inputs" not in text


def test_defaults_are_fresh_and_replace_keeps_the_rest():
    a, b = RankProgram(0, (), (), {}), RankProgram(0, (), (), {})
    assert a.regions == {} and a.regions is not b.regions and a.inputs is not b.inputs
    ops = (Op("S", 0),)
    c = a.replace(ops=ops)
    assert c.ops == ops and c.rank == 0 and c.messages is a.messages and a.ops == ()
    m = Merge((Region("h", 0, 2),), (Region("h", 2, 2),), (Region("h", 4, 2),), Region("n", 0, 1), 1, 3)
    assert m.replace(k=2) == Merge(m.a, m.b, m.out, m.n, 2, 3) != m
    with pytest.raises(TypeError):
        a.replace(nonsense=1)


def test_a_record_pickles_and_copies_by_its_fields():
    r = RankProgram(2, (2, 3), (), {1: None}, ops=(Op("W", 1),), result=Region("o", 0, 1))
    for twin in (pickle.loads(pickle.dumps(r)), copy.copy(r), copy.deepcopy(r)):
        assert twin == r and twin is not r and twin.ops == (Op("W", 1),)


def test_plans_keep_their_equality_and_their_caches_stay_out_of_the_fields():
    from alpha_mpi.model import pairwise
    from alpha_mpi.planning import plan
    from alpha_mpi.planning.realize import realize

    tree = pairwise(range(3), 3)
    a, b = plan(tree, layout=2), plan(tree, layout=2)
    a.slots_of(1)  # fills a cache slot on a only
    assert a == b and hash(a) == hash(b) and a.replace(root_rank=1) != a  # a tree Plan: by its fields
    assert "_slots_by_rank" not in a._fields and "tree=" not in repr(a)
    p = realize(tree, "butterfly", layout=2)
    q = p.replace(rounds=p.rounds)
    assert p == p and p != q  # a Program: by identity (q has the same fields)
    p.rank(0)
    assert q._ranks == {} and q.rank(0) == p.rank(0)  # replace gives a fresh cache, the same programs
    assert "tree=" not in repr(p) and "builder=" not in repr(p) and "_ranks" not in repr(p)
    with pytest.raises(FrozenInstanceError):
        p.rounds = 3
