"""Building one rank's program: buffers, messages and logical ops, then `schedule` (pure)."""

from __future__ import annotations

from collections.abc import Callable

from .._record import Record
from .posting import schedule
from .program import BufferSpec, Eval, Message, Op, RankProgram, Region

_set = object.__setattr__  # Records set their fields through it (frozen: _record.py)

# Payloads of at least this many elements (64 KiB) travel as a header message plus a payload
# message straight from / into their region (no copy of user data); smaller ones go through a
# framed buffer (one message, one small copy), where a second message would cost more latency
# than the copy. Both ends of a message decide alike: the rule depends only on its size.
SPLIT_MIN_ELEMENTS = 8192


def is_split(count: int) -> bool:
    return count >= SPLIT_MIN_ELEMENTS


def frame_cost(nbytes: float, cal) -> float:
    """What one frame of `nbytes` of payload costs beyond moving its bytes (the cost model,
    planning/cost.py): a small one is copied into a framed buffer to be sent and out of one when
    it arrives (two passes over it, charged like an add per byte: γ), a large one travels as a
    header message and a payload message (one further message: α_msg)."""
    return cal.alpha_msg if is_split(int(nbytes) // 8) else 2 * nbytes * cal.gamma


class RankBuilder:
    """Accumulates one rank's program. Regions name buffers: `out`, `L<slot>`, `w<i>`."""

    def __init__(self, rank: int, n: int):
        self.rank, self.n = rank, n
        self.buffers: list = []
        self.messages: dict = {}
        self.regions: dict = {}
        self.evals: list = []
        self.copies: list = []
        self.checks: list = []
        self.logical: list = []
        self._header_user: dict = {}  # framed buffer -> the one message whose header sits in front of it

    # -- buffers ----------------------------------------------------------------------------
    def work(self, count: int, framed: bool = False) -> Region:
        name = f"w{len(self.buffers)}"
        self.buffers.append(BufferSpec(name, count, framed))
        return Region(name, 0, count)

    def framed(self, region: Region) -> bool:
        """True if `region` starts a framed buffer (a header fits in front of it)."""
        if region is None or region.offset != 0 or not region.buf.startswith("w"):
            return False
        return self.buffers[int(region.buf[1:])].framed

    def _one_message(self, msg: Message, region: Region | None) -> bool:
        """True if `msg` may travel as one message with its header in front of `region`: a
        small payload at the start of a framed buffer whose header no other message uses."""
        if not self.framed(region) or is_split(msg.count):
            return False
        user = self._header_user.setdefault(region.buf, msg.index)
        return user == msg.index

    @staticmethod
    def leaf(slot: int, n: int) -> Region:
        return Region(f"L{slot}", 0, n)

    def out(self, offset: int = 0, count: int | None = None) -> Region:
        return Region("out", offset, self.n if count is None else count)

    # -- ops --------------------------------------------------------------------------------
    def eval(self, ev: Eval) -> None:
        i = len(self.evals)
        self.evals.append(ev)
        self.logical.append((Op("E", i), tuple(ev.inputs), (ev.output,)))

    def copy(self, src: Region, dst: Region) -> None:
        if src == dst:
            return
        i = len(self.copies)
        self.copies.append((src, dst))
        self.logical.append((Op("C", i), (src,), (dst,)))

    def check(self, region: Region) -> None:
        i = len(self.checks)
        self.checks.append(region)
        self.logical.append((Op("F", i), (region,), ()))

    def send(self, msg: Message, region: Region | None) -> Region | None:
        """Send `region` as `msg`; a small payload not in a framed buffer is copied into one."""
        if msg.count and not is_split(msg.count) and not self._one_message(msg, region):
            frame = self.work(msg.count, framed=True)
            self._header_user[frame.buf] = msg.index
            self.copy(region, frame)
            region = frame
        self.messages[msg.index] = msg
        self.regions[msg.index] = region if msg.count else None
        self.logical.append((Op("S", msg.index), (region,) if msg.count else (), ()))
        return region

    def recv(self, msg: Message, region: Region | None) -> Region | None:
        """Receive `msg` into `region` (None: into a new buffer); returns where it landed.
        A small payload for a region outside a framed buffer lands in one, then is copied."""
        target = region
        if msg.count and (region is None or (not is_split(msg.count) and not self._one_message(msg, region))):
            target = self.work(msg.count, framed=not is_split(msg.count))
            if not is_split(msg.count):
                self._header_user[target.buf] = msg.index
        self.messages[msg.index] = msg
        self.regions[msg.index] = target if msg.count else None
        self.logical.append((Op("W", msg.index), (), (target,) if msg.count else ()))
        if region is not None and target is not None and target != region:
            self.copy(target, region)
        return target

    def build(self, slots, result: Region | None) -> RankProgram:
        return RankProgram(
            rank=self.rank,
            slots=tuple(slots),
            buffers=tuple(self.buffers),
            messages=dict(self.messages),
            regions=dict(self.regions),
            evals=tuple(self.evals),
            copies=tuple(self.copies),
            checks=tuple(self.checks),
            ops=schedule(self.logical, self.regions),
            result=result,
        )


class Lowering(Record):
    """What a realization module's `lower` returns: the per-rank program builder and what the
    Program states about it (rounds on the critical path, reduce-scatter chunks, the extra
    text its identity digests, details shown by `to_dict`; `identity` set only by `tree`, whose
    Program keeps the tree Plan's identity)."""

    __slots__ = ("builder", "rounds", "chunks", "extra", "details", "identity")

    def __init__(
        self,
        builder: Callable[[int], RankProgram],
        rounds: int,
        chunks: tuple | None = None,
        extra: str = "",
        details: dict | None = None,
        identity: str | None = None,
    ) -> None:
        _set(self, "builder", builder)
        _set(self, "rounds", rounds)
        _set(self, "chunks", chunks)
        _set(self, "extra", extra)
        _set(self, "details", dict() if details is None else details)
        _set(self, "identity", identity)


def allreduce_only(name: str, mode: str) -> str | None:
    """The reason a realization without a reduce-scatter form does not apply in that mode."""
    if mode == "reduce-scatter":
        return f"{name}: has no reduce-scatter form (use halving or scatter)"
    return None
