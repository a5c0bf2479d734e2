"""The `butterfly` realization: recursive doubling over a rank-partitioned top, any p (pure).

Every rank ends holding the value of every node of the top above its operand, computed in the
declared operand order (IEEE addition is commutative bit for bit, so a rank that meets its
partner's value on the left still adds left then right): the same bits everywhere.

Per node of the top (ranktop.py), bottom up:
- a complete block's two halves exchange pairwise: position j of the left half meets position
  j of the right half, both add left + right (the classic recursive doubling; round k pairs the
  positions differing in bit k);
- a node joining a complete block Big (2^m ranks, rounds 0..m-1) with a side S no larger, S
  finishes early (round t_S): it *injects* its value into Big's positions [0, 2^e),
  e = min(m, t_S + 1), and Big's own exchange messages carry it on (piggybacked in the same
  frame: position i < 2^k appends it in round k), so every Big rank holds it after round m-1
  without extra messages (when S finishes one round before Big, it injects into half the
  positions and that half forwards in round m: at most 2 messages per S rank); then Big's value
  goes to S in one round. ceil(log2 p) rounds on a pairwise tree over p ranks, at most
  ceil(log2 p) + 2 sends per rank (tests/test_any_rank_count.py checks every p up to 300);
- any other node: a direct cross round, each side's value to every rank of the other, sent by
  the least loaded ranks of that side.
Ranks holding no operand receive the result in one more round (when delivery reaches them).
"""

from __future__ import annotations

from collections.abc import Callable

from ..model.layout import Layout
from ..model.tree import Leaf, Node, leaf_sequence
from .builder import Lowering, RankBuilder, allreduce_only, frame_cost, is_split
from .combine_plan import Plan
from .operands import lower_expression
from .program import Eval, Message, RankProgram
from .ranktop import Load, RankTop, butterfly_rounds, node_times, top_of, why_not

NAME = "butterfly"


def applies(tp: Plan, mode: str = "allreduce") -> str | None:
    """A rank-partitioned top (ranktop.py), in allreduce mode."""
    return allreduce_only(NAME, mode) or why_not(tp.tree, tp.size, NAME)


def lower(tp: Plan, mode: str, receivers: frozenset, segment: int) -> Lowering:
    builder, rounds = lower_butterfly(top_of(tp.tree, tp.size, NAME), tp.layout, tp.size, receivers)
    return Lowering(builder, rounds)


def estimate(tp: Plan, cal, mode: str = "allreduce") -> float:
    """Each round moves and adds the whole payload, in one frame (the piggybacked rounds carry
    two: ignored)."""
    top, nb = top_of(tp.tree, tp.size, NAME), tp.layout.nbytes
    late = any(r in tp.receivers for r in top.extra)
    return butterfly_rounds(top, late) * (cal.alpha + nb * cal.beta + nb * cal.gamma + frame_cost(nb, cal))


class Transfer:
    """One planned message while the schedule is built (parts may still be appended)."""

    __slots__ = ("index", "round", "src", "dst", "parts")

    def __init__(self, index, rnd, src, dst, parts):
        self.index, self.round, self.src, self.dst, self.parts = index, rnd, src, dst, parts


class Schedule:
    """The whole job's butterfly: transfers, and per rank its events (time, order, what)."""

    def __init__(self, size: int):
        self.transfers: list = []
        self.events: list = [[] for _ in range(size)]
        self.load = Load(size)
        self.exchange: dict = {}  # (round, src) -> the complete-block exchange transfer
        self.rounds = 0

    def send(self, rnd: int, src: int, dst: int, parts: list) -> Transfer:
        x = Transfer(len(self.transfers), rnd, src, dst, parts)
        self.transfers.append(x)
        self.events[src].append((rnd, 1, x.index, "send", x))
        self.events[dst].append((rnd, 2, x.index, "recv", x))
        self.load.add(src)
        self.rounds = max(self.rounds, rnd + 1)
        return x

    def eval(self, time: int, rank: int, out: int, left: int, right: int) -> None:
        self.events[rank].append((time, 0, -1, "eval", (out, left, right)))


def plan_schedule(top: RankTop, size: int, receivers: frozenset) -> Schedule:
    """Every rank's transfers and evaluations (see the module docstring)."""
    sc = Schedule(size)
    done = node_times(top, lambda t, ta, tb: _join(sc, t, ta, tb))
    end = done[top.root.key]
    late = [r for r in top.extra if r in receivers]
    for dst, src in zip(late, sc.load.pick(top.root.ranks, len(late))):
        sc.send(end, src, dst, [top.root.key])
    return sc


def _join(sc: Schedule, t, ta: int, tb: int) -> int:
    """Plan branch `t` of operands done at ta, tb (its messages and evaluations); returns its time."""
    a, b = t.left, t.right
    if t.complete:
        for j in range(a.size):
            ra, rb = a.ranks[j], b.ranks[j]
            sc.exchange[(ta, ra)] = sc.send(ta, ra, rb, [a.key])
            sc.exchange[(tb, rb)] = sc.send(tb, rb, ra, [b.key])
            sc.eval(ta + 1, ra, t.key, a.key, b.key)
            sc.eval(ta + 1, rb, t.key, a.key, b.key)
        return ta + 1
    if (a.complete and a.size >= b.size) or (b.complete and b.size > a.size):
        if a.complete and a.size >= b.size:
            return _piggyback(sc, t, a, b, ta, tb)
        return _piggyback(sc, t, b, a, tb, ta)
    for src_side, dst_side, when in ((a, b, ta), (b, a, tb)):
        for dst, src in zip(dst_side.ranks, sc.load.pick(src_side.ranks, dst_side.size)):
            sc.send(when, src, dst, [src_side.key])
    for r in a.ranks:
        sc.eval(max(ta, tb + 1), r, t.key, a.key, b.key)
    for r in b.ranks:
        sc.eval(max(tb, ta + 1), r, t.key, a.key, b.key)
    return max(ta, tb) + 1


def _piggyback(sc: Schedule, t, big, small, m: int, ts: int) -> int:
    """Join complete block `big` (rounds 0..m-1) and `small` (done at ts); returns t's time."""
    e = min(m, ts + 1)
    # small finishing one round before big would inject into all 2^m positions (up to 4
    # messages per small rank): inject into half, and that half forwards in round m instead.
    forward = ts == m - 1 and m > 0
    reach = 1 << (e - 1 if forward else e)
    for i, src in enumerate(sc.load.pick(small.ranks, reach)):
        sc.send(ts, src, big.ranks[i], [small.key])
    for k in range(e, m):  # position i < 2^k carries small's value on to position i + 2^k
        for i in range(1 << k):
            sc.exchange[(k, big.ranks[i])].parts.append(small.key)
    for i in range(reach if forward else 0):
        sc.send(m, big.ranks[i], big.ranks[i + reach], [small.key])
    for i, r in enumerate(big.ranks):
        sc.eval(m + 1 if forward and i >= reach else max(m, ts + 1), r, t.key, t.left.key, t.right.key)
    for dst, src in zip(small.ranks, sc.load.pick(big.ranks, small.size)):
        sc.send(m, src, dst, [big.key])
    for r in small.ranks:
        sc.eval(max(m + 1, ts), r, t.key, t.left.key, t.right.key)
    return max(m + 1, ts + 1)


def messages(sc: Schedule, n: int, key: str, phase: str = "x") -> list:
    """The transfers as Messages: the k-th message of a pair (in round order) has seq k."""
    seq: dict = {}
    out = [None] * len(sc.transfers)
    for x in sorted(sc.transfers, key=lambda x: (x.round, x.index)):
        k = seq.get((x.src, x.dst), 0)
        seq[(x.src, x.dst)] = k + 1
        what = f"{key}|{phase}{x.round}:" + "+".join(map(str, x.parts))
        out[x.index] = Message(x.index, phase, x.src, x.dst, k, n * len(x.parts), what)
    return out


def operand_value(b: RankBuilder, node: Node, n: int, framed: bool):
    """Region holding a rank's operand value: the contribution itself, or its pre-evaluation."""
    if isinstance(node, Leaf):
        return b.leaf(node.slot, n)
    dest = b.work(n, framed=framed)
    for ev in lower_expression(
        node, lambda nd: b.leaf(nd.slot, n) if isinstance(nd, Leaf) else None, dest, lambda c: b.work(c)
    ):
        b.eval(ev)
    return dest


class _Pool:
    """Work buffers of large payloads, reused once the values they hold are dead (a buffer of
    2 log p values would be too much memory at 16 MiB); `schedule` then orders the reuse (a
    send completes before its buffer is written, a receive is posted after its last reader).
    Small payloads travel in framed buffers whose one header is its message's: never reused."""

    def __init__(self, b: RankBuilder, events: list, reuse: bool):
        self.b, self.reuse = b, reuse
        self.last: dict = {}  # value key -> index of the event that uses it last
        for i, (_, _, _, kind, what) in enumerate(events):
            if kind == "eval":
                self.last[what[1]] = self.last[what[2]] = i
            elif kind == "send":
                for k in what.parts:
                    self.last[k] = i
        self.free: dict = {}  # count -> buffers ready for reuse
        self.holds: dict = {}  # buffer name -> (region, live keys)

    def take(self, count: int, keys: tuple, received: bool = False):
        if not self.reuse:
            return None if received else self.b.work(count, framed=not is_split(count))
        spare = self.free.get(count)
        region = spare.pop(0) if spare else self.b.work(count)  # the longest free: least waiting
        if keys:
            self.holds[region.buf] = (region, set(keys))
        return region

    def release(self, region) -> None:
        if self.reuse:
            self.free.setdefault(region.count, []).append(region)

    def retire(self, i: int, value: dict) -> None:
        """Free the buffers whose every value was used for the last time by event i."""
        if not self.reuse:
            return
        for name, (region, keys) in list(self.holds.items()):
            if all(self.last.get(k, -1) <= i for k in keys):
                del self.holds[name]
                self.release(region)


def slots_of(node: Node | None) -> tuple:
    return () if node is None else tuple(leaf.slot for leaf in leaf_sequence(node))


def lower_butterfly(
    top: RankTop, layout: Layout, size: int, receivers: frozenset[int]
) -> tuple[Callable[[int], RankProgram], int]:
    """(rank -> RankProgram, rounds) of the butterfly over `top`."""
    n = layout.total
    sc = plan_schedule(top, size, receivers)
    msgs = messages(sc, n, layout.key())
    root = top.root.key
    split = is_split(n)

    def build(r: int) -> RankProgram:
        b = RankBuilder(r, n)
        op = top.operand.get(r)
        res = b.out() if r in receivers else None
        events = sorted(sc.events[r], key=lambda e: e[:3])
        pool = _Pool(b, events, split)
        value: dict = {}
        if op is not None:
            value[top.leaf_key[r]] = operand_value(b, op.node, n, framed=not split)
        for i, (_, _, _, kind, what) in enumerate(events):
            if kind == "eval":
                out, left, right = what
                dest = (res or b.work(n)) if out == root else pool.take(n, (out,))
                b.eval(Eval((value[left], value[right]), (0, 1, -1), dest))
                value[out] = dest
            elif kind == "send":
                m = msgs[what.index]
                if len(what.parts) == 1:
                    b.send(m, value[what.parts[0]])
                else:  # a piggybacked frame: the parts side by side in one buffer
                    frame = pool.take(m.count, ())
                    for j, k in enumerate(what.parts):
                        b.copy(value[k], frame.sub(j * n, n))
                    b.send(m, frame)
                    pool.release(frame)
            else:
                m = msgs[what.index]
                into = res if what.parts == [root] and res is not None else None
                got = b.recv(m, into if into is not None else pool.take(m.count, tuple(what.parts), True))
                for j, k in enumerate(what.parts):
                    value[k] = into if into is not None else got.sub(j * n, n)
            pool.retire(i, value)
        final = value.get(root)
        if final is not None:
            if res is not None and final != res:  # one rank: the root is its own operand
                b.copy(final, res)
                final = res
            b.check(final)
        return b.build(slots_of(None if op is None else op.node), res)

    return build, sc.rounds


__all__ = [
    "NAME",
    "applies",
    "lower",
    "estimate",
    "lower_butterfly",
    "plan_schedule",
    "messages",
    "operand_value",
    "slots_of",
    "Schedule",
]
