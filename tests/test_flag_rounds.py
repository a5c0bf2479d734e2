"""The flag rounds after a program (planning/flag_rounds.py; pure, one process): appended to
every realization they keep its result (the symbolic run), add ceil(log2 p) rounds of header-only
frames in which every rank hears, directly or through others, from every rank, with at most one
flag frame per ordered pair of ranks (they all travel on the executor's one flag tag)."""

import pytest

from alpha_mpi import DeliverTo, pairwise, plan
from alpha_mpi.planning.check import check
from alpha_mpi.planning.flag_rounds import FLAG_INDEX_BASE, distances, with_flag_rounds
from alpha_mpi.planning.program import FLAG_SEQ
from alpha_mpi.planning.realize import REALIZATIONS, applicable, realize


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 7, 8])
def test_flag_rounds_keep_every_realization_and_reach_every_rank(size):
    for delivery in (None, DeliverTo(size - 1)):
        tp = plan(pairwise(range(2 * size), size), delivery, 9, size=size)
        for name in REALIZATIONS:
            if applicable(tp)[name] is not None:
                continue
            base = realize(tp, name, segment=3)
            prog = with_flag_rounds(base)
            check(prog)  # every frame sent and received once, no deadlock, the declared tree
            k = len(distances(size))
            assert k == (size - 1).bit_length()
            assert prog.identity == base.identity and prog.rounds == base.rounds + k
            heard = {r: {r} for r in range(size)}  # whose flags rank r holds after each round
            pairs = set()
            for j in range(k):
                now = {r: set(h) for r, h in heard.items()}
                for r in range(size):
                    rp, rb = prog.rank(r), base.rank(r)
                    assert rp.ops[: len(rb.ops)] == rb.ops  # the program first, unchanged
                    flags = [m for i, m in rp.messages.items() if i >= FLAG_INDEX_BASE]
                    assert all(
                        m.seq == FLAG_SEQ and m.count == 0 and rp.regions[m.index] is None for m in flags
                    )
                    assert len(flags) == 2 * k
                    for m in flags:
                        if m.dst == r and m.what == f"flags|{j}":
                            now[r] |= heard[m.src]
                        if m.src == r:
                            pairs.add((m.src, m.dst))
                heard = now
            assert all(h == set(range(size)) for h in heard.values()), heard
            assert len(pairs) == size * k  # one flag frame per ordered pair at most
