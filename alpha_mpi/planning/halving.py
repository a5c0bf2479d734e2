"""The `halving` realization: reduce-scatter by recursive halving, then allgather, any p (pure).

One chunking of the vector serves every node of the top: the bisection of [0, n) (each range
split at lo + ceil((hi - lo) / 2)); a node's *holders* hold its value on the ranges of one depth
of that bisection, holder j on range j. Per node of the top (ranktop.py), bottom up:
- two sides whose holders are at one depth (a complete block's halves, say) meet pairwise:
  holder j of the left side keeps the lower half of their common range, holder j of the right
  side the upper half; each sends the other half and adds left + right on the half it keeps
  (recursive halving: a complete block of 2^k ranks has 2^k holders at depth k);
- sides at two depths: the side with the finer chunking keeps its holders; each holder of the other
  side sends it the piece of its value on each finer range inside its own, and it adds left +
  right there. The cross round combines chunk by chunk, in the declared operand order.
Allreduce: the root's holders (a complete block) allgather by recursive doubling; ranks that
hold no chunk receive the whole result from the holders that sent the fewest bytes. The
reduce-scatter mode stops after the first half (rank r keeps chunks[r], empty where it holds
none), then dissemination rounds of header-only frames carry every rank's flags to all.
"""

from __future__ import annotations

from collections.abc import Callable

from ..model.layout import Layout
from .builder import Lowering, RankBuilder, frame_cost
from .butterfly import Transfer, operand_value, slots_of
from .combine_plan import Plan
from .program import Eval, Message, RankProgram
from .ranktop import Load, RankTop, halving_shape, top_of, why_not

NAME = "halving"


def applies(tp: Plan, mode: str = "allreduce") -> str | None:
    """A rank-partitioned top (ranktop.py), in both modes."""
    return why_not(tp.tree, tp.size, NAME)


def lower(tp: Plan, mode: str, receivers: frozenset, segment: int) -> Lowering:
    top = top_of(tp.tree, tp.size, NAME)
    builder, rounds, chunks = lower_halving(top, tp.layout, tp.size, receivers, mode)
    return Lowering(builder, rounds, chunks, "chunks=" + ",".join(f"{a}:{b}" for a, b in chunks))


def estimate(tp: Plan, cal, mode: str = "allreduce") -> float:
    """A holder moves its share of the vector out each way; chunkless ranks get the whole."""
    p, nb = tp.size, tp.layout.nbytes
    depth, rs_rounds = halving_shape(top_of(tp.tree, p, NAME))
    part = nb * (1 - 0.5**depth)
    frames = sum(frame_cost(nb / 2**j, cal) for j in range(1, depth + 1))  # one way: halves, quarters, ...
    if mode == "allreduce":
        late = (1 << depth) < len(tp.receivers)
        rounds = rs_rounds + depth + late
        return rounds * cal.alpha + (2 * part + nb * late) * cal.beta + part * cal.gamma + 2 * frames
    return (rs_rounds + (p - 1).bit_length()) * cal.alpha + part * (cal.beta + cal.gamma) + frames


def halves(lo: int, hi: int) -> tuple[tuple[int, int], tuple[int, int]]:
    mid = lo + (hi - lo + 1) // 2
    return (lo, mid), (mid, hi)


def bisection(n: int) -> Callable[[int, int], tuple[int, int]]:
    """(path, depth) -> the range: bit j of path picks the upper half at depth j + 1."""
    cache = {(0, 0): (0, n)}

    def rng(path: int, depth: int) -> tuple[int, int]:
        got = cache.get((path, depth))
        if got is None:
            low, high = halves(*rng(path & ((1 << (depth - 1)) - 1), depth - 1))
            got = cache[(path, depth)] = high if (path >> (depth - 1)) & 1 else low
        return got

    return rng


class HalvingSchedule:
    """The job's transfers (pieces of node values) and each rank's events."""

    def __init__(self, size: int):
        self.transfers: list = []
        self.events: list = [[] for _ in range(size)]
        self.bytes = Load(size)
        self.rounds = 0

    def send(self, rnd: int, src: int, dst: int, phase: str, key: int, lo: int, hi: int) -> None:
        x = Transfer(len(self.transfers), rnd, src, dst, (phase, key, lo, hi))
        self.transfers.append(x)
        self.events[src].append((rnd, 1, x.index, "send", x))
        self.events[dst].append((rnd, 2, x.index, "recv", x))
        self.bytes.add(src, hi - lo)
        self.rounds = max(self.rounds, rnd + 1)

    def eval(self, time: int, rank: int, what: tuple) -> None:
        self.events[rank].append((time, 0, -1, "eval", what))


def plan_halving(top: RankTop, n: int, size: int, receivers: frozenset, mode: str):
    """(schedule, chunks) of halving over `top` (see the module docstring)."""
    sc = HalvingSchedule(size)
    rng = bisection(n)
    held: dict = {}  # key -> (holders by path, depth, time)
    for t in top.nodes:
        if t.is_operand:
            held[t.key] = ([t.rank], 0, 0)
            continue
        a, b = t.left, t.right
        (ha, da, ta), (hb, db, tb) = held[a.key], held[b.key]
        if da == db:  # one depth on both sides (a complete block's halves): split each range
            s = len(ha)
            for j in range(s):
                low, high = rng(j, da + 1), rng(j + s, da + 1)
                sc.send(ta, ha[j], hb[j], "h", a.key, *high)
                sc.send(tb, hb[j], ha[j], "h", b.key, *low)
                sc.eval(max(ta, tb + 1), ha[j], (t.key, a.key, b.key, *low))
                sc.eval(max(tb, ta + 1), hb[j], (t.key, a.key, b.key, *high))
            held[t.key] = (ha + hb, da + 1, max(ta, tb) + 1)
            continue
        keep_a = da > db  # the finer chunking keeps its holders
        (ht, dt, tt), (hu, du, tu), u = (
            (held[a.key], held[b.key], b) if keep_a else (held[b.key], held[a.key], a)
        )
        mask = (1 << du) - 1
        when = max(tt, tu + 1)
        for q, h in enumerate(ht):
            lo, hi = rng(q, dt)
            sc.send(tu, hu[q & mask], h, "h", u.key, lo, hi)
            sc.eval(when, h, (t.key, a.key, b.key, lo, hi))
        held[t.key] = (ht, dt, when)
    holders, depth, end = held[top.root.key]
    root = top.root.key
    chunk = {h: rng(q, depth) for q, h in enumerate(holders)}
    chunks = tuple(chunk.get(r, (n, n)) for r in range(size))
    for h in holders:
        sc.eval(end, h, ("check", *chunk[h]))
    if mode == "reduce-scatter":
        k, d = 0, 1
        while d < size:  # dissemination: round k sends to r + 2^k, receives from r - 2^k
            for r in range(size):
                sc.send(end + k, r, (r + d) % size, "f", root, 0, 0)
            k, d = k + 1, 2 * d
        return sc, chunks
    for j, k in enumerate(range(depth - 1, -1, -1)):  # allgather: recursive doubling
        for q, h in enumerate(holders):
            sc.send(end + j, h, holders[q ^ (1 << k)], "u", root, *rng(q & ((2 << k) - 1), k + 1))
    late = [r for r in range(size) if r in receivers and r not in chunk]
    for dst, src in zip(late, sc.bytes.pick(holders, len(late))):
        sc.send(end + depth, src, dst, "d", root, 0, n)
    return sc, chunks


def _messages(sc: HalvingSchedule, key: str) -> list:
    seq: dict = {}
    out = [None] * len(sc.transfers)
    for x in sorted(sc.transfers, key=lambda x: (x.round, x.index)):
        k = seq.get((x.src, x.dst), 0)
        seq[(x.src, x.dst)] = k + 1
        phase, _, lo, hi = x.parts
        out[x.index] = Message(x.index, phase, x.src, x.dst, k, hi - lo, f"{key}|{phase}{x.round}:{lo}:{hi}")
    return out


def lower_halving(
    top: RankTop, layout: Layout, size: int, receivers: frozenset[int], mode: str
) -> tuple[Callable[[int], RankProgram], int, tuple[tuple[int, int], ...]]:
    """(rank -> RankProgram, rounds, chunks) of halving over `top`."""
    n = layout.total
    sc, chunks = plan_halving(top, n, size, receivers, mode)
    msgs = _messages(sc, layout.key())
    root = top.root.key

    def build(r: int) -> RankProgram:
        b = RankBuilder(r, n)
        op = top.operand.get(r)
        whole = mode == "allreduce" and r in receivers
        acc = b.out() if whole else b.work(n)
        value: dict = {}  # key -> (lo, hi, Region holding that range of the node's value)

        def region(key, lo, hi):
            if key == root:
                return acc.sub(lo, hi - lo)
            vlo, _, reg = value[key]
            return reg.sub(lo - vlo, hi - lo)

        if op is not None:
            v = operand_value(b, op.node, n, framed=False)
            value[top.leaf_key[r]] = (0, n, v)
            if top.leaf_key[r] == root:  # the root is this rank's own operand
                b.copy(v, acc)
        for _, _, _, kind, what in sorted(sc.events[r], key=lambda e: e[:3]):
            if kind == "eval":
                if what[0] == "check":
                    if what[2] > what[1]:
                        b.check(acc.sub(what[1], what[2] - what[1]))
                    continue
                out, left, right, lo, hi = what
                if hi > lo:
                    ins = (region(left, lo, hi), region(right, lo, hi))
                    b.eval(Eval(ins, (0, 1, -1), acc.sub(lo, hi - lo)))
                value[out] = (lo, hi, acc.sub(lo, hi - lo))
                continue
            m = msgs[what.index]
            _, key, lo, hi = what.parts
            if kind == "send":
                b.send(m, region(key, lo, hi) if hi > lo else None)
            elif key == root:
                b.recv(m, acc.sub(lo, hi - lo) if hi > lo else None)
            else:
                got = b.recv(m, None)
                value[key] = (lo, hi, got)
        lo, hi = chunks[r]
        if mode == "reduce-scatter":
            return b.build(slots_of(None if op is None else op.node), acc.sub(lo, hi - lo))
        return b.build(slots_of(None if op is None else op.node), acc if whole else None)

    return build, sc.rounds, chunks


__all__ = ["NAME", "applies", "lower", "estimate", "lower_halving", "plan_halving", "bisection", "halves"]
