"""Symbolic run of a Program over every rank in one process (pure; no MPI): the one simulator.

Checks, for any program (every realization, assembly, the arrays' summary exchange): every
message is sent once and received once with the same description at both ends; no rank waits
forever (a receive completes at its W once the frame was sent; a send completes only once its
receiver reached that W: the engine matches and receives frames at W, size-safe, and P posts
nothing); no region is written (by an E, a C, an M or a W) while a send from it is in flight;
and the result: every receiver of a combine ends with exactly the declared tree's expression in
every coordinate of its result; every rank of an array exchange ends with every rank's
coverage row exactly once, in its exchange order, and the merge of every rank's summary.

Expressions are interned (a branch is the id of its (left, right) pair), so comparing a
receiver's value with the declared tree costs O(1), and memory stays linear in the tree: no
expression strings are built.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass, field

from ..model.tree import Leaf, postorder
from ..refusals import PlanRefusal
from .array_program import caller_writes, final_regions


@dataclass
class Cost:
    """Per-rank traffic of a program: messages and payload bytes sent, elements added."""

    size: int
    sends: list = field(default_factory=list)
    bytes_sent: list = field(default_factory=list)
    adds: list = field(default_factory=list)  # element additions evaluated
    rounds: int = 0

    @property
    def sends_per_rank_max(self) -> int:
        return max(self.sends, default=0)

    @property
    def bytes_per_rank_max(self) -> int:
        return max(self.bytes_sent, default=0)

    @property
    def adds_per_rank_max(self) -> int:
        return max(self.adds, default=0)

    # The JSON form (`alpha-mpi plan --cost --format json`): the maxima first, then per rank.
    FIELDS = (
        "sends_per_rank_max",
        "bytes_per_rank_max",
        "adds_per_rank_max",
        "rounds",
        "sends",
        "bytes_sent",
    )

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.FIELDS}


def count(program) -> Cost:
    """Traffic per rank, read from the rank programs (no simulation)."""
    c = Cost(program.size, rounds=program.rounds)
    for r in range(program.size):
        rp = program.rank(r)
        sends = [rp.messages[o.index] for o in rp.ops if o.kind == "S"]
        c.sends.append(len(sends))
        c.bytes_sent.append(sum(8 * m.count for m in sends))
        c.adds.append(sum((len(ev.inputs) - 1) * ev.output.count for ev in rp.evals))
    return c


class _Intern:
    def __init__(self):
        self.ids: dict = {}
        self.sets: dict = {}  # id -> the ranks whose summaries a merged state holds

    def leaf(self, slot):
        return self.ids.setdefault(("L", slot), len(self.ids))

    def add(self, a, b):
        return self.ids.setdefault((a, b), len(self.ids))

    def name(self, *key):
        """A value that is no expression: a coverage row, the global length."""
        return self.ids.setdefault(key, len(self.ids))

    def summaries(self, ranks: frozenset):
        i = self.ids.setdefault(("S", ranks), len(self.ids))
        self.sets[i] = ranks
        return i

    def merge(self, a, b, what):
        if a not in self.sets or b not in self.sets:
            _fail(f"{what} merges something that is not a summary")
        return self.summaries(self.sets[a] | self.sets[b])


def _fail(msg):
    raise PlanRefusal("plan-simulation-failed", msg)


class _Store:
    """One rank's buffers: per buffer a sorted list of disjoint intervals (offset, count, coord,
    expr) and the list of their offsets (for bisection)."""

    def __init__(self):
        self.iv: dict = {}
        self.starts: dict = {}

    def set(self, buf, intervals):
        self.iv[buf] = intervals
        self.starts[buf] = [o for o, _, _, _ in intervals]

    def write(self, region, pieces):
        """`pieces`: list of (offset within region, count, coord, expr)."""
        old = self.iv.get(region.buf, [])
        lo, hi = region.offset, region.offset + region.count
        i = max(0, bisect_right(self.starts.get(region.buf, []), lo) - 1)
        keep = old[:i]
        j = i
        while j < len(old) and old[j][0] < hi:
            o, c, crd, e = old[j]
            if o + c <= lo:
                keep.append(old[j])
            else:
                if o < lo:
                    keep.append((o, lo - o, crd, e))
                if o + c > hi:
                    keep.append((hi, o + c - hi, crd + (hi - o), e))
            j += 1
        new = [(lo + po, pc, crd, e) for po, pc, crd, e in pieces]
        merged = sorted(keep[i:] + new) if keep[i:] else new
        # Coalesce neighbours holding one expression over consecutive coordinates, so a result
        # gathered piece by piece reads back as one interval.
        out = keep[:i]
        for iv in merged + old[j:]:
            if (
                out
                and out[-1][0] + out[-1][1] == iv[0]
                and out[-1][2] + out[-1][1] == iv[2]
                and out[-1][3] == iv[3]
            ):
                o, c, crd, e = out[-1]
                out[-1] = (o, c + iv[1], crd, e)
            else:
                out.append(iv)
        self.set(region.buf, out)

    def read(self, region, what):
        """Pieces (offset within region, count, coord, expr) covering region, or fail."""
        lo, hi = region.offset, region.offset + region.count
        ivs = self.iv.get(region.buf, [])
        i = max(0, bisect_right(self.starts.get(region.buf, []), lo) - 1)
        out, pos = [], lo
        while i < len(ivs) and ivs[i][0] < hi:
            o, c, crd, e = ivs[i]
            i += 1
            if o + c <= lo:
                continue
            a, b = max(o, lo), min(o + c, hi)
            if a != pos:
                _fail(f"{what} reads {region} but [{pos}, {a}) holds no value")
            out.append((a - lo, b - a, crd + (a - o), e))
            pos = b
        if pos != hi:
            _fail(f"{what} reads {region} but [{pos}, {hi}) holds no value")
        return out


def _uniform(pieces, what):
    """(coord of element 0, expr) when the pieces are one expression over consecutive coordinates."""
    base, expr = pieces[0][2] - pieces[0][0], pieces[0][3]
    for off, _, crd, e in pieces:
        if e != expr or crd - off != base:
            _fail(f"{what}: the input mixes expressions or coordinates")
    return base, expr


def op_grid(ranks, pcs, message: str = "") -> str:
    """The rank x op grid, each rank's current op marked `*`, the rank the message names (or the
    first stuck one of a deadlock) marked `<-- ERROR HERE`; 32 ranks at most, around it."""
    m = re.search(r"\brank (\d+)|\br(\d+)@", message)
    failing = int(m.group(1) or m.group(2)) if m else None
    lo = 0 if failing is None else max(0, failing - 16)
    lines = []
    for r in range(lo, min(len(ranks), lo + 32)):
        cells = [("*" if i == pcs[r] else "") + str(o) for i, o in enumerate(ranks[r].ops)]
        tail = "  <-- ERROR HERE" if r == failing else ""
        lines.append(f"  r{r}: " + (" ".join(cells) if cells else "(idle)") + tail)
    return "\n".join(lines)


def check(program) -> Cost:
    """Run `program` symbolically on every rank; returns its Cost. Raises plan-simulation-failed."""
    p = program.size
    n = program.layout.total
    it = _Intern()
    ranks = [program.rank(r) for r in range(p)]
    stores = [_Store() for _ in range(p)]
    exchange = program.realization == "arrays"
    for r, rp in enumerate(ranks):
        for s in rp.slots:
            stores[r].set(f"L{s}", [(0, n, 0, it.leaf(s))])
        if exchange:  # what the caller writes before a run: its row, its summary, the length
            row, state, length = caller_writes(program, r)
            stores[r].write(row, [(0, row.count, 0, it.name("row", r))])
            for reg in state:
                stores[r].write(reg, [(0, reg.count, 0, it.summaries(frozenset([r])))])
            stores[r].write(length, [(0, 1, 0, it.name("length"))])
    pcs = [0] * p
    sent: dict = {}  # index -> pieces (snapshot)
    posted: set = set()
    received: set = set()
    inflight = [dict() for _ in range(p)]  # rank -> index -> region
    seen_msgs: dict = {}

    def guard(r, region, write, what):
        if write:
            for idx, reg in inflight[r].items():
                if reg.overlaps(region):
                    _fail(f"rank {r}: {what} writes {region} while message {idx} is still sent from {reg}")

    for r, rp in enumerate(ranks):
        for idx, m in rp.messages.items():
            other = seen_msgs.get(idx)
            if other is None:
                seen_msgs[idx] = m
            elif other != m:
                _fail(f"message {idx} is described differently by its two ends: {other} vs {m}")
            if r not in (m.src, m.dst) or m.src == m.dst:
                _fail(f"rank {r} lists message {idx} between {m.src} and {m.dst}")

    def step(r) -> bool:
        rp = ranks[r]
        st = stores[r]
        progressed = False
        while pcs[r] < len(rp.ops):
            op = rp.ops[pcs[r]]
            k, i = op.kind, op.index
            where = f"rank {r} op {op} (#{pcs[r]})"
            if k == "P":
                m = rp.messages[i]
                if m.dst != r or i in posted:
                    _fail(f"{where}: posts a message it does not receive, or twice")
                # P posts nothing (the engine matches and receives at W): the region is
                # written at W, so only W is guarded against sends still reading it
                posted.add(i)
            elif k == "S":
                m = rp.messages[i]
                if m.src != r or i in sent:
                    _fail(f"{where}: sends a message it does not own, or twice")
                reg = rp.regions.get(i)
                if (reg is None) != (m.count == 0) or (reg is not None and reg.count != m.count):
                    _fail(f"{where}: region {reg} does not fit message of {m.count} elements")
                if reg is not None:
                    guard(r, reg, False, where)
                    sent[i] = st.read(reg, where)
                    inflight[r][i] = reg
                else:
                    sent[i] = []
            elif k == "W":
                m = rp.messages[i]
                if i not in posted or m.dst != r:
                    _fail(f"{where}: waits for a message never posted here")
                if i not in sent:
                    return progressed  # blocked
                reg = rp.regions.get(i)
                if reg is not None:
                    guard(r, reg, True, where)
                    if reg.count != m.count:
                        _fail(f"{where}: receives {m.count} elements into {reg}")
                    st.write(reg, sent[i])
                received.add(i)
            elif k == "D":
                m = rp.messages[i]
                if m.src != r or i not in sent:
                    _fail(f"{where}: completes a send it never started")
                if i not in received:
                    # blocked until the receiver has matched it: receives are matched at W
                    # (size-safe Improbe + receive, execution/waits.py), not posted at P
                    return progressed
                inflight[r].pop(i, None)
            elif k == "E":
                ev = rp.evals[i]
                vals = []
                for reg in ev.inputs:
                    if reg.count != ev.output.count:
                        _fail(f"{where}: input {reg} and output {ev.output} differ in length")
                    guard(r, reg, False, where)
                    vals.append(_uniform(st.read(reg, where), where))
                guard(r, ev.output, True, where)
                coords = {c for c, _ in vals}
                if len(coords) != 1:
                    _fail(f"{where}: adds values of different coordinates {sorted(coords)[:4]}")
                stack = []
                for o in ev.program:
                    if o == -1:
                        b_, a_ = stack.pop(), stack.pop()
                        stack.append(it.add(a_, b_))
                    else:
                        stack.append(vals[o][1])
                if len(stack) != 1:
                    _fail(f"{where}: program leaves {len(stack)} values")
                st.write(ev.output, [(0, ev.output.count, vals[0][0], stack[0])])
            elif k == "C":
                src, dst = rp.copies[i]
                guard(r, src, False, where)
                guard(r, dst, True, where)
                pieces = st.read(src, where)
                st.write(dst, pieces)
            elif k == "F":
                reg = rp.checks[i]
                guard(r, reg, False, where)
                st.read(reg, where)
            elif k == "M":
                mg = rp.merges[i]
                states = []
                for head, nodes in (mg.a, mg.b):
                    parts = {_uniform(st.read(x, where), where)[1] for x in (head, nodes)}
                    if len(parts) != 1:
                        _fail(f"{where}: a state's head and nodes hold different summaries")
                    states.append(parts.pop())
                st.read(mg.n, where)
                merged = it.merge(*states, where)
                for reg in mg.out:
                    guard(r, reg, True, where)
                    st.write(reg, [(0, reg.count, 0, merged)])
            elif k == "A":  # the arrays' summary: the caller's writes (written before the run too)
                sm = rp.summaries[i]
                row, state, length = caller_writes(program, r)
                if (sm.row, sm.state, sm.n) != (row, state, length):
                    _fail(f"{where}: the summary writes elsewhere than the exchange reads it")
                for reg in (row, *state, length):
                    guard(r, reg, True, where)
            elif k == "R":  # the arrays' root check: compares the table, takes the merged state
                rt = rp.roots[i]  # (what they hold is checked after the run: _exchange_result)
                st.read(rt.n, where)
                for reg in (rt.values, rt.verdict):
                    guard(r, reg, True, where)
                    st.write(reg, [(0, reg.count, 0, it.name("root", r))])
            else:
                _fail(f"{where}: unknown op")
            pcs[r] += 1
            progressed = True
        return progressed

    try:
        while any(pcs[r] < len(ranks[r].ops) for r in range(p)):
            if not any([step(r) for r in range(p)]):
                stuck = [f"r{r}@{ranks[r].ops[pcs[r]]}" for r in range(p) if pcs[r] < len(ranks[r].ops)]
                _fail(f"deadlock: every unfinished rank waits ({', '.join(stuck[:8])})")
        if set(sent) != received:
            _fail(f"messages sent but never received: {sorted(set(sent) - received)[:8]}")
        for r in range(p):
            if inflight[r]:
                _fail(f"rank {r} ends with sends still in flight: {sorted(inflight[r])[:8]}")
    except PlanRefusal as e:
        raise PlanRefusal(
            "plan-simulation-failed", e.message + "\n" + op_grid(ranks, pcs, e.message)
        ) from None

    if exchange:
        _exchange_result(program, stores, it)
        return count(program)
    # The declared tree's expression id.
    ids = {}
    for node in postorder(program.tree):
        ids[id(node)] = (
            it.leaf(node.slot) if isinstance(node, Leaf) else it.add(ids[id(node.left)], ids[id(node.right)])
        )
    want = ids[id(program.tree)]
    for r, rp in enumerate(ranks):
        expect_result = (r in program.receivers) or program.mode.scatters
        if rp.result is None:
            if expect_result and (not program.mode.scatters or program.chunks[r][1] > program.chunks[r][0]):
                _fail(f"rank {r} should end with the result but its program names none")
            continue
        if program.mode.scatters:
            lo, hi = program.chunks[r]
        else:
            lo, hi = 0, n
        if rp.result.count != hi - lo:
            _fail(f"rank {r}'s result region {rp.result} does not span coordinates [{lo}, {hi})")
        if hi > lo:
            for off, c, crd, e in stores[r].read(rp.result, f"rank {r}'s result"):
                if e != want or crd != lo + off:
                    _fail(
                        f"rank {r} ends with another expression than the declared tree at coordinates "
                        f"[{lo + off}, {lo + off + c})"
                    )
    return count(program)


def _exchange_result(program, stores, it) -> None:
    """Every rank of an array exchange holds every rank's row (row j: the rank j places after
    it in exchange order) and the merge of every rank's summary."""
    order = program.details["order"]
    size = program.size
    every = it.summaries(frozenset(range(size)))
    table, state = final_regions(program)
    row_words = table.count // size
    for r in range(size):
        v = order.index(r)
        for j in range(size):
            row = table.sub(j * row_words, row_words)
            crd, e = _uniform(stores[r].read(row, f"rank {r}'s row {j}"), f"rank {r}'s row {j}")
            want = order[(v + j) % size]
            if e != it.name("row", want) or crd != 0:
                _fail(f"rank {r} ends with another row than rank {want}'s at row {j}")
        for reg in state:
            if _uniform(stores[r].read(reg, f"rank {r}'s state"), f"rank {r}'s state")[1] != every:
                _fail(f"rank {r} ends without the summary of every rank")


__all__ = ["Cost", "check", "count", "op_grid"]
