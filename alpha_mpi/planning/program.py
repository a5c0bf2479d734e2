"""The one executable form of every exchange: each rank's program over regions of buffers.

Every realization (tree, scatter, replicate, butterfly, halving), assembly by selection
(assembly_program.py) and the array reductions' summary exchange (array_program.py) is lowered
to this format and run by the one executor (execution/engine.py); the symbolic simulator
(planning/check.py) runs the realizations' programs in one process. A rank's program is a list
of ops:

    P3   post the receive of message 3 (into its receive region)
    S3   start the send of message 3 (its header carries the flags this rank has seen so far)
    W3   wait for message 3, check its header, take its flags
    D3   wait until the send of message 3 has completed (its region may be written again)
    E2   evaluate fused kernel program 2 (postfix over input regions, into an output region)
    C1   copy region pair 1
    F0   finiteness check of region 0 (sets the non-finite flag)
    M0   merge pair 0 of node summaries (the array reductions' exchange, planning/array_program.py)
    A0   the arrays' summary 0 of the caller's blocks into a state, a row and the length word
         (first, before any message op: it may stop the run, csrc/round/native.h an_summary)
    R0   the arrays' root check 0: the merged state's root values, where nothing needs a look

Buffers are named per rank: `out` (the result vector, the caller's `out` when given), `L<slot>`
(this rank's contribution for a slot: read only), the names in `RankProgram.bound` (other
memory of the caller that a front end binds per run: the arrays' blocks and their geometry
words), `w<i>` (work buffers the executor allocates once). A `framed` work buffer has room
for a frame header in front of it, so a message that carries the whole buffer travels as ONE
MPI message; any other message is a header message followed by a payload message straight from
/ into its region (no copy of user data).

Matching: the k-th message from rank a to rank b in a run has MPI tag 2k (header) and 2k + 1
(payload), so receives may be posted in any order. Hazards are the planner's job (`schedule`):
a receive is posted only once nothing else touches its region before its W, and a region is
written only after the sends from it have completed (D).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .._record import Record
from ..refusals import PlanRefusal
from .base import PlanBase

if TYPE_CHECKING:
    from ..model.coverage import Coverage
    from ..model.delivery import Delivery
    from ..model.layout import Layout
    from ..model.tree import Node
from .postfix import postfix_text

OP_KINDS = "PSWDECFMAR"
FLAG_SEQ = -1  # Message.seq of a flag-round frame (planning/flag_rounds.py)
_OP_RE = r"^([PSWDECFMAR])(\d+)$"  # compiled when text is parsed (re caches it), not at import
_set = object.__setattr__


def parse_or_refuse(regex: str, text: str, what: str):
    """The match of the pattern `regex` on `text` (stripped), refused as `step-parse-error` naming `what`."""
    m = re.match(regex, text.strip()) if isinstance(text, str) else None
    if not m:
        raise PlanRefusal("step-parse-error", f"cannot read {what} {text!r}")
    return m


# The records below are Records, not dataclasses: a program's first reduction defines them
# (_record.py: a frozen dataclass costs about 1 ms to define, the start-up budget is 20 ms).


class Region(Record):
    """`count` elements of buffer `buf` from element `offset` on."""

    __slots__ = ("buf", "offset", "count")

    def __init__(self, buf: str, offset: int, count: int) -> None:
        _set(self, "buf", buf)
        _set(self, "offset", offset)
        _set(self, "count", count)

    def overlaps(self, other: Region) -> bool:
        return (
            self.buf == other.buf
            and self.offset < other.offset + other.count
            and other.offset < self.offset + self.count
        )

    def sub(self, offset: int, count: int) -> Region:
        return Region(self.buf, self.offset + offset, count)

    def __str__(self):
        return f"{self.buf}[{self.offset}:{self.offset + self.count}]"


class BufferSpec(Record):
    __slots__ = ("name", "count", "framed")

    def __init__(self, name: str, count: int, framed: bool = False) -> None:
        _set(self, "name", name)
        _set(self, "count", count)
        _set(self, "framed", framed)


class Message(Record):
    """One planned frame: header (and payload) from `src` to `dst`.

    `index`: global within the program, the header's edge field; `phase`: one letter, see
    execution/frames.PHASE_CODE; `seq`: the seq-th message from src to dst in one run, its MPI
    tags are 2*seq, 2*seq + 1 (FLAG_SEQ: a frame of the flag rounds after a program,
    flag_rounds.py: the executor's flag tag, one such frame per ordered pair of ranks and run);
    `count`: payload elements (0: a header-only flag frame); `what`: what the payload holds
    (coordinate range, pieces), part of the header's layout digest."""

    __slots__ = ("index", "phase", "src", "dst", "seq", "count", "what")

    def __init__(self, index: int, phase: str, src: int, dst: int, seq: int, count: int, what: str) -> None:
        _set(self, "index", index)
        _set(self, "phase", phase)
        _set(self, "src", src)
        _set(self, "dst", dst)
        _set(self, "seq", seq)
        _set(self, "count", count)
        _set(self, "what", what)


class Eval(Record):
    # inputs: Regions, all of one count; program: postfix, i >= 0 pushes inputs[i], -1 adds the
    # two topmost (left first)
    __slots__ = ("inputs", "program", "output")

    def __init__(self, inputs: tuple, program: tuple, output: Region) -> None:
        _set(self, "inputs", inputs)
        _set(self, "program", program)
        _set(self, "output", output)

    def expression(self, names=None) -> str:
        return postfix_text(self.program, self.inputs, str if names is None else names)


class Merge(Record):
    """Join two summaries of pairwise-tree nodes into a third (csrc/kernel/pairwise.h ap_merge).

    Each of `a`, `b`, `out` is a (head, nodes) pair of Regions: the head is two int64 words
    (record count, flags), the nodes `capacity` records of 2 + k words. `n` is a one-word
    region holding the global length (written per call). The result's flags are a's, b's and
    the merge's own (overflow, invalid); a count of b out of range is an invalid merge."""

    __slots__ = ("a", "b", "out", "n", "k", "capacity")

    def __init__(self, a: tuple, b: tuple, out: tuple, n: Region, k: int, capacity: int) -> None:
        _set(self, "a", a)
        _set(self, "b", b)
        _set(self, "out", out)
        _set(self, "n", n)
        _set(self, "k", k)
        _set(self, "capacity", capacity)


class Summary(Record):
    """The arrays' local summary (an A op; csrc/round/native.h an_summary says what it reads
    and writes): the blocks `xs` (and `ys`, None for a sum) and the `geometry` words are
    buffers the caller binds per run (`RankProgram.bound`); the summary goes into the state
    (head, nodes), the coverage `row` (`tiles`: a tile's row, else a 1-D block's) and the
    global length word `n`; `result` gets the record count and the non-finite flag."""

    __slots__ = ("xs", "ys", "geometry", "state", "row", "n", "result", "k", "capacity", "tiles")

    def __init__(
        self,
        xs: tuple,
        ys: tuple | None,
        geometry: str,
        state: tuple,
        row: Region,
        n: Region,
        result: Region,
        k: int,
        capacity: int,
        tiles: bool,
    ) -> None:
        _set(self, "xs", xs)
        _set(self, "ys", ys)
        _set(self, "geometry", geometry)
        _set(self, "state", state)
        _set(self, "row", row)
        _set(self, "n", n)
        _set(self, "result", result)
        _set(self, "k", k)
        _set(self, "capacity", capacity)
        _set(self, "tiles", tiles)


class Root(Record):
    """The arrays' root check (an R op; csrc/round/native.h an_root): the root's k `values` and
    a `verdict` word (0: they are the result; 1: the caller looks) from the coverage `table`,
    the table that passed last time (`valid`: a usable word, then the table), the merged state
    `final` (a (head, nodes) pair) and the length word `n`."""

    __slots__ = ("table", "valid", "final", "n", "values", "verdict", "k")

    def __init__(
        self, table: Region, valid: Region, final: tuple, n: Region, values: Region, verdict: Region, k: int
    ) -> None:
        _set(self, "table", table)
        _set(self, "valid", valid)
        _set(self, "final", final)
        _set(self, "n", n)
        _set(self, "values", values)
        _set(self, "verdict", verdict)
        _set(self, "k", k)


class Op(Record):
    __slots__ = ("kind", "index")

    def __init__(self, kind: str, index: int) -> None:
        _set(self, "kind", kind)
        _set(self, "index", index)

    def __str__(self):
        return f"{self.kind}{self.index}"

    @staticmethod
    def parse(text: str) -> Op:
        m = parse_or_refuse(_OP_RE, text, "op (e.g. P3 S3 W3 D3 E2 C1 F0 M0 A0 R0)")
        return Op(m.group(1), int(m.group(2)))


class RankProgram(Record):
    """One rank's program. `slots`: the leaves this rank passes, left to right; `buffers`:
    BufferSpec of the work buffers; `messages`: index -> Message, for every message this rank
    sends or receives; `regions`: index -> Region it is sent from / received into; `copies`:
    (src Region, dst Region); `checks`: Regions; `result`: where the result lies at the end
    (None: delivery does not reach); `inputs`: slot -> element count of its `L<slot>` buffer
    where it is not the layout's total (assembly pieces, each of its own length), empty for the
    combine realizations; `merges`, `summaries`, `roots`: Merge, Summary, Root records (array
    reductions only); `bound`: names of the caller's buffers a front end binds per run
    (Summary's)."""

    __slots__ = tuple(
        "rank slots buffers messages regions evals copies checks ops result inputs merges summaries roots bound".split()
    )
    _norepr = ("messages", "regions", "inputs")

    def __init__(
        self,
        rank: int,
        slots: tuple,
        buffers: tuple,
        messages: dict,
        regions: dict | None = None,  # None: a new empty dict (dataclasses' default_factory)
        evals: tuple = (),
        copies: tuple = (),
        checks: tuple = (),
        ops: tuple = (),
        result: Region | None = None,
        inputs: dict | None = None,  # None: a new empty dict
        merges: tuple = (),
        summaries: tuple = (),
        roots: tuple = (),
        bound: tuple = (),
    ) -> None:
        _set(self, "rank", rank)
        _set(self, "slots", slots)
        _set(self, "buffers", buffers)
        _set(self, "messages", messages)
        _set(self, "regions", {} if regions is None else regions)
        _set(self, "evals", evals)
        _set(self, "copies", copies)
        _set(self, "checks", checks)
        _set(self, "ops", ops)
        _set(self, "result", result)
        _set(self, "inputs", {} if inputs is None else inputs)
        _set(self, "merges", merges)
        _set(self, "summaries", summaries)
        _set(self, "roots", roots)
        _set(self, "bound", bound)

    def sends(self):
        return [self.messages[o.index] for o in self.ops if o.kind == "S"]

    def receives(self):
        return [self.messages[o.index] for o in self.ops if o.kind == "W"]

    def text(self) -> str:
        return " ".join(map(str, self.ops)) if self.ops else "(idle)"


class Mode(str):
    """What a Program delivers: `Mode.ALLREDUCE` (every receiver ends with the whole result)
    or `Mode.REDUCE_SCATTER` (rank r ends with chunk r only). Tested by what it says
    (`.scatters`), never by its spelling; a str all the same, so it prints, compares, hashes
    and travels in identities and JSON as the words it always was."""

    __slots__ = ()
    ALLREDUCE: Mode
    REDUCE_SCATTER: Mode

    def __new__(cls, value: str) -> Mode:
        if value not in ("allreduce", "reduce-scatter"):
            raise ValueError(f"a Program's mode is 'allreduce' or 'reduce-scatter', got {value!r}")
        return super().__new__(cls, value)

    @property
    def scatters(self) -> bool:
        """Rank r ends with its chunk only (reduce-scatter)."""
        return str.__eq__(self, "reduce-scatter")

    @property
    def whole(self) -> bool:
        """Every receiver ends with the whole result (allreduce)."""
        return str.__eq__(self, "allreduce")


Mode.ALLREDUCE = Mode("allreduce")
Mode.REDUCE_SCATTER = Mode("reduce-scatter")


class Program(PlanBase):
    """A realization lowered to per-rank programs (built lazily per rank and cached).

    Every rank of a job builds the same Program and runs `rank(its rank)`; identities name the
    realization, so a peer running another realization or plan is refused by name. `builder`:
    rank -> RankProgram; `mode`: a str given is made a Mode; `chunks`: reduce-scatter's,
    chunks[r] = (start, stop) rank r ends with; `rounds`: sequential message rounds on the
    critical path.
    """

    __slots__ = ("builder", "mode", "chunks", "rounds", "details", "_ranks")
    _extra = ("_ranks",)  # rank -> RankProgram, built on first use
    _norepr = ("tree", "builder")  # PlanBase's and its own

    def __init__(
        self,
        realization: str,
        tree: Node,
        delivery: Delivery,
        layout: Layout,
        size: int,
        coverage: Coverage,
        topology: str,
        tree_order_id: str,
        layout_order_id: str,
        identity: str,
        receivers: frozenset[int],
        builder: object = None,
        mode: Mode = Mode.ALLREDUCE,
        chunks: tuple[tuple[int, int], ...] | None = None,
        rounds: int = 0,
        details: dict | None = None,  # None: a new empty dict (dataclasses' default_factory)
    ) -> None:
        PlanBase.__init__(
            self, realization, tree, delivery, layout, size, coverage, topology, tree_order_id,
            layout_order_id, identity, receivers,
        )  # fmt: skip
        _set(self, "builder", builder)
        _set(self, "mode", mode if type(mode) is Mode else Mode(mode))
        _set(self, "chunks", chunks)
        _set(self, "rounds", rounds)
        _set(self, "details", {} if details is None else details)
        _set(self, "_ranks", {})

    def rank(self, r: int) -> RankProgram:
        p = self._ranks.get(self.check_rank(r))
        if p is None:
            p = self._ranks[r] = self.builder(r)
        return p

    def slots_of(self, r: int) -> tuple:
        return self.rank(r).slots

    def chunk(self, r: int) -> tuple[int, int] | None:
        return None if self.chunks is None else self.chunks[r]

    def describe(self, ranks=None) -> str:
        lines = [
            f"realization   {self.realization} ({self.mode})   topology {self.topology}   "
            f"delivery {self.delivery!r}   layout {self.layout.key()}   ranks {self.size}   rounds {self.rounds}",
            *self.header_lines(),
            "schedule:",
        ]
        shown = range(self.size) if ranks is None else ranks
        for r in shown:
            lines.append(f"  r{r}: {self.rank(r).text()}")
        return "\n".join(lines)

    def to_dict(self, ranks=None) -> dict:
        shown = range(self.size) if ranks is None else ranks
        out = {**self.header_dict(), "mode": self.mode, "rounds": self.rounds}
        if self.chunks is not None:
            out["chunks"] = [list(c) for c in self.chunks]
        out.update(self.details)
        out["ranks"] = {str(r): self.rank(r).text() for r in shown}
        return out


__all__ = [
    "Mode",
    "Region",
    "BufferSpec",
    "Message",
    "Eval",
    "Merge",
    "Summary",
    "Root",
    "Op",
    "RankProgram",
    "Program",
    "OP_KINDS",
    "FLAG_SEQ",
]
