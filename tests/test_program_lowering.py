"""The assembly and array-exchange lowerings (pure, one process): every message is sent once and
received once with the same description at both ends, and each rank's program does what the
protocol says (receives exactly the pieces it lacks; one merge per round; rows land where the
exchange puts them)."""

import pytest

from alpha_mpi import DeliverTo, plan_assembly
from alpha_mpi.arrays import pairwise as T
from alpha_mpi.planning.array_program import TABLE, lower_summary_exchange, rounds, schedule
from alpha_mpi.planning.assembly_program import lower_assembly
from alpha_mpi.planning.program import Op


def _matched(prog):
    """{index: Message} after checking every message is sent by its src and received by its dst,
    once each, with equal descriptions; and every op reads back from its string form."""
    sent, got = {}, {}
    for r in range(prog.size):
        rp = prog.rank(r)
        for op in rp.ops:
            assert Op.parse(str(op)) == op
            if op.kind in "SW":
                m = rp.messages[op.index]
                side = sent if op.kind == "S" else got
                assert op.index not in side, f"message {op.index} twice at one end"
                assert (m.src if op.kind == "S" else m.dst) == r
                side[op.index] = m
    assert sent == got
    pairs = {}
    for m in sent.values():  # tags: the k-th message of a pair in a run has seq k
        pairs.setdefault((m.src, m.dst), []).append(m.seq)
    assert all(sorted(s) == list(range(len(s))) for s in pairs.values())
    return sent


@pytest.mark.parametrize("size", [1, 2, 3, 5])
@pytest.mark.parametrize("target", [None, 0, -1])
def test_assembly_program_receives_exactly_what_each_receiver_lacks(size, target):
    n = 13 * size
    pieces = [(i % size, 3 * i, 3 * i + 3) for i in range(n // 3)] + [(0, 3 * (n // 3), n)] * (n % 3 > 0)
    ap = plan_assembly(pieces, n, size, None if target is None else DeliverTo(target % size))
    prog = lower_assembly(ap)
    msgs = _matched(prog)
    for r in range(size):
        rp = prog.rank(r)
        mine = {i for i, (o, _, _) in enumerate(ap.pieces) if o == r}
        assert set(rp.slots) == mine
        assert rp.inputs == {i: ap.pieces[i][2] - ap.pieces[i][1] for i in mine}
        received = sorted(m.what for m in msgs.values() if m.dst == r)
        if r in ap.receivers:
            want = sorted(f"range:{a}:{b}" for i, (o, a, b) in enumerate(ap.pieces) if o != r)
            assert received == want and rp.result is not None and rp.result.count == n
        else:
            assert received == [] and rp.result is None
        assert not rp.evals  # selection only: no arithmetic


@pytest.mark.parametrize("size", range(1, 10))
def test_array_exchange_program_matches_the_schedule(size):
    k, cap = 2, T.CAPACITY
    prog = lower_summary_exchange(
        size,
        None,
        k=k,
        capacity=cap,
        row_words=T.ROW_WORDS,
        topology="pairwise-array",
        tree_order_id="o",
        identity="i",
    )
    msgs = _matched(prog)
    assert len(msgs) == size * rounds(size)
    for r in range(size):
        rp = prog.rank(r)
        own = schedule(size, r)
        assert len(rp.merges) == len(own) == sum(op.kind == "M" for op in rp.ops)
        for rd in own:
            out = [
                m
                for m in msgs.values()
                if m.src == r and m.what.startswith(f"pairwise-array-round:{rd.index}:")
            ]
            assert [m.dst for m in out] == [rd.send_to]
            assert out[0].count == T.frame_words(size, rd.index, k)
        # the received rows land at row 2^i of the table, as the exchange's Bruck rotation says
        lands = sorted(b.offset for a, b in rp.copies if b.buf == TABLE)
        assert lands == [T.ROW_WORDS << rd.index for rd in own]
    assert prog.details["foreign_frames_pair"]


def test_a_programs_mode_is_an_object_tested_by_what_it_says():
    from alpha_mpi import pairwise, plan
    from alpha_mpi.planning.program import Mode
    from alpha_mpi.planning.realize import realize

    tp = plan(pairwise(range(4), 4), layout=8, size=4)
    whole, parts = realize(tp, "tree"), realize(tp, "scatter", mode="reduce-scatter")
    assert type(whole.mode) is Mode and whole.mode.whole and not whole.mode.scatters
    assert type(parts.mode) is Mode and parts.mode.scatters and not parts.mode.whole
    # the same words as before wherever it is printed or compared (identities, JSON, describe)
    assert parts.mode == "reduce-scatter" and f"{whole.mode}" == "allreduce"
    assert parts.to_dict()["mode"] == "reduce-scatter"
    with pytest.raises(ValueError):
        Mode("allgather")
