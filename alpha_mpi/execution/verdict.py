"""The verdict round: every rank learns every rank's word, by point-to-point only (layer 4).

Whenever the ranks must come to the same decision — an executor's build, a learner's start, a
checkpoint vote, an audit's referees after a mismatch, the flag round after a checked run — each rank says
one fixed-size record and every rank receives every rank's record, so every rank decides from
the same facts and raises the same error (as torch DCP's `_DistWrapper` gathers each rank's
result so that every rank fails alike). Nothing is merged on the way: what each rank said
arrives unchanged, and the caller's decision is a pure function of the table.

Record of one rank (RECORD_HEAD bytes, then `width` little-endian uint64 words):

    off size field
      0    1 status: OK 0, REFUSED 1 (a Refusal of this rank; its code below), RAISED 2 (another
               exception: a bug, an interrupt; its class name below)
      1    3 reserved (zero)
      4    4 refusal code tag (frames.code_tag: the first 4 bytes of sha256 of the code)
      8   24 exception class name (ASCII, zero-padded; RAISED only)
     32    8 the round's number (the endpoint's count of rounds, or a run's step)
     40    8 what the round is for (the first 8 bytes of sha256 of its name)
     48  8*w the caller's words (digests, sizes, keys, flags: typed by the caller)

Exchange (Bruck's allgather, the dissemination pattern): in round k (distance d = 2^k) rank r
sends the records it holds — r, r+1, ..., r+d-1 (mod p), at most p-d of them — to r-d and
receives those of r+d, r+d+1, ... from r+d; after ⌈log2 p⌉ rounds it holds all p. Each message
is one buffer: a header (magic, format, width, count, the rank of its first record), the
records, and a crc32 of the bytes before it. Every receive is size-safe (waits.Waiter.receive:
matched, compared, received) and bounded like every other wait. A rank out of step (it runs
another round: one build, save or check more or fewer than its peers) is named on every rank
alike after the exchange, from the numbers and purposes in the records
(`executor-identity-mismatch`); only a message of another size (a round of another width) or
not intact is refused where it lands, and its peers' waits end at the bound.

Direct exchange (`direct=True`, every executor's build round): each rank sends its one
record straight to every other rank and receives every other rank's (p - 1 messages each way,
one record each: the same header with count 1), so a peer that is not in the round, waiting
for a frame of a warm call, finds this rank's record as the first message from it (engine_walk).

Rounds are collective calls: every rank of the communicator runs the same rounds in the same
order, one at a time on one tag (MPI keeps messages of one sender, tag and communicator in
order, so consecutive rounds never mix).
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from .._record import Record
from .._sha256 import sha256
from ..refusals import FrameRefusal, Refusal
from .abort import mark_broken
from .frames import code_of_tag, code_tag

_set = object.__setattr__  # Records set their fields through it (frozen: _record.py)

__all__ = ["OK", "RAISED", "REFUSED", "Verdicts", "exchange", "ranks_text", "record_of", "RECORD_HEAD"]

OK, REFUSED, RAISED = 0, 1, 2
MAGIC = b"ALPHAVRD"
VERSION = 1
RECORD_HEAD = 48
_HEAD = struct.Struct("<B3x4s24sQ8s")
_MSG = struct.Struct("<8sHHII")  # magic, version, width, count, first rank
_CRC = struct.Struct("<I")
_NO_CODE = b"\0\0\0\0"


def record_of(local: BaseException | None, words, number: int, what: str) -> bytes:
    """This rank's record: its status (from `local`, its failure or None), the round's `number`
    and purpose `what`, and `words` (uint64)."""
    w = np.ascontiguousarray(words, dtype="<u8")
    purpose = sha256(what.encode()).digest()[:8]
    if local is None:
        head = _HEAD.pack(OK, _NO_CODE, b"", number, purpose)
    elif isinstance(local, Refusal):
        head = _HEAD.pack(REFUSED, code_tag(local.code), b"", number, purpose)
    else:
        name = type(local).__name__.encode("ascii", "replace")[:24]
        head = _HEAD.pack(RAISED, _NO_CODE, name, number, purpose)
    return head + w.tobytes()


class Verdicts(Record):
    """What every rank said in one round, the same on every rank: `status[r]` (OK, REFUSED,
    RAISED), `codes[r]` (the refusal code, the exception's class name, or None) and
    `words[r]` (rank r's uint64 words, a read-only (p, width) array)."""

    __slots__ = ("status", "codes", "words", "rounds")

    def __init__(
        self,
        status: tuple,
        codes: tuple,
        words: np.ndarray,
        rounds: tuple = (),  # (number, purpose digest) each rank ran: equal on every rank once returned
    ) -> None:
        _set(self, "status", status)
        _set(self, "codes", codes)
        _set(self, "words", words)
        _set(self, "rounds", rounds)

    @property
    def failed(self) -> list[int]:
        """The ranks that refused or raised, lowest first."""
        return [r for r, s in enumerate(self.status) if s != OK]

    def code_of(self, r: int) -> str:
        """Rank r's failure as named in messages: its code, or "an unexpected <Class>"."""
        if self.status[r] == RAISED:
            return f"an unexpected {self.codes[r] or 'exception'}"
        return self.codes[r]

    def raise_failures(self, local: BaseException | None, what: str) -> None:
        """Raise on every rank if any rank failed: this rank's own `local` failure, else
        `peer-refused` naming the lowest failing rank and its code (with `peer` and `peer_code`
        in the context; every failing rank is listed in the message)."""
        if local is not None:
            raise local
        failed = self.failed
        if not failed:
            return
        first = failed[0]
        others = "" if len(failed) == 1 else f" (ranks {', '.join(map(str, failed))} failed)"
        raise Refusal(
            "peer-refused",
            f"rank {first} refused while {what} [{self.code_of(first)}]{others}; no rank went on (see "
            "that rank's error, fix it, then do it again on every rank)",
            peer=first,
            peer_code=self.code_of(first),
        )


def exchange(
    comm,
    waiter,
    tag: int,
    local: BaseException | None,
    words,
    *,
    number: int,
    what: str,
    timeout: float | None = None,
    owner: object = None,
    direct: bool = False,
) -> Verdicts:
    """One verdict round on `comm` with `tag` (every rank calls it, in the same order of
    rounds): this rank's status (`local`: its failure, or None) and `words` (uint64, the same
    count on every rank) to every rank; returns every rank's. `number` and `what` name the
    round: a rank whose round has another number or purpose is named on every rank alike
    (`executor-identity-mismatch`). Raises peer-timeout (bounded), a frame refusal for a
    foreign message, or peer-failed; the round's send is then recorded for the abort at exit
    (abort.mark_broken, for `owner`: the endpoint whose channel it is). `direct`: every rank
    sends its record to every other rank at once (p - 1 messages of one record each) instead
    of Bruck's rounds, so a peer that is not in the round finds this rank's record as its
    first message from it whatever it waits for (the convenience calls' builds: endpoint.py)."""
    rank, p = comm.Get_rank(), comm.Get_size()
    mine = record_of(local, words, number, what)
    width = (len(mine) - RECORD_HEAD) // 8
    rec = len(mine)
    held = bytearray(p * rec)  # records of ranks rank, rank+1, ... (mod p), in that order
    held[:rec] = mine
    if direct:
        _direct(comm, waiter, tag, held, rec, width, number, what, timeout, owner)
        table = _table(held, p, rank, rec, width)
        _in_step(table, what)
        return table
    have, dist, rnd = 1, 1, 0
    while dist < p:
        count = min(dist, p - dist)
        dst, src = (rank - dist) % p, (rank + dist) % p
        out = bytearray(_MSG.pack(MAGIC, VERSION, width, count, rank))
        out += held[: count * rec]
        out += _CRC.pack(zlib.crc32(out))
        inb = np.empty(_MSG.size + count * rec + _CRC.size, dtype=np.uint8)
        name = f"{what} (verdict round {number}, exchange {rnd})"
        req = comm.Isend(out, dest=dst, tag=tag)
        try:
            got, scratch = waiter.receive(comm, inb, src, tag, name, number, timeout)
            body = _check(scratch if scratch is not None else inb, got, inb.nbytes, src, rank, name, number)
            _match(body, width, count, src, rank, name, number)
            held[have * rec : (have + count) * rec] = body[_MSG.size : _MSG.size + count * rec]
            waiter.wait(req, None, dst, name, number, timeout)
        except Refusal as e:  # a peer that never came, or a foreign message: no clean end by itself
            mark_broken(rank, e.code, [req], owner)
            raise
        have += count
        dist, rnd = dist * 2, rnd + 1
    table = _table(held, p, rank, rec, width)
    _in_step(table, what)
    return table


def _direct(comm, waiter, tag, held, rec, width, number, what, timeout, owner) -> None:
    """The direct exchange: this rank's record (held[:rec]) to every peer, then each peer's
    record into its place (peer q at (q - rank) mod p), received from rank + 1, rank + 2, ...
    Every receive is size-safe and bounded, as in Bruck's rounds."""
    rank, p = comm.Get_rank(), comm.Get_size()
    out = bytearray(_MSG.pack(MAGIC, VERSION, width, 1, rank)) + held[:rec]
    out += _CRC.pack(zlib.crc32(out))
    name = f"{what} (verdict round {number}, direct)"
    reqs = [comm.Isend(out, dest=(rank + d) % p, tag=tag) for d in range(1, p)]
    try:
        for d in range(1, p):
            src = (rank + d) % p
            inb = np.empty(_MSG.size + rec + _CRC.size, dtype=np.uint8)
            got, scratch = waiter.receive(comm, inb, src, tag, name, number, timeout)
            body = _check(scratch if scratch is not None else inb, got, inb.nbytes, src, rank, name, number)
            _match(body, width, 1, src, rank, name, number)
            held[d * rec : (d + 1) * rec] = body[_MSG.size : _MSG.size + rec]
        for d, req in enumerate(reqs, start=1):
            waiter.wait(req, None, (rank + d) % p, name, number, timeout)
    except Refusal as e:  # a peer that never came, or a foreign message: no clean end by itself
        mark_broken(rank, e.code, reqs, owner)
        raise


def _check(buf, got: int, expected: int, src: int, rank: int, name: str, step: int) -> bytes:
    body = bytes(buf)
    intact = (
        got >= _MSG.size + _CRC.size
        and body[:8] == MAGIC
        and _CRC.unpack_from(body, got - _CRC.size)[0] == zlib.crc32(body[: got - _CRC.size])
    )
    if not intact:
        raise FrameRefusal(
            "frame-checksum" if got == expected else "frame-size-mismatch",
            f"rank {rank}: {name} from rank {src}: {got} bytes that are not an intact verdict record "
            f"(expected {expected}; user traffic on a dup=False communicator?)",
            peer=src,
            step=step,
        )
    return body


def _match(body, width, count, src, rank, name, number) -> None:
    _, version, w, n, first = _MSG.unpack_from(body, 0)
    if (version, w, n, first) != (VERSION, width, count, src):
        raise FrameRefusal(
            "executor-identity-mismatch",
            f"rank {rank}: {name} from rank {src} belongs to another kind of round ({n} records of {w} "
            f"words from rank {first}, format {version}; expected {count} of {width} from rank {src}): the "
            "ranks are out of step (a rank built, saved or checked one more or one fewer time than the others)",
            peer=src,
            step=number,
        )


def _table(held: bytearray, p: int, rank: int, rec: int, width: int) -> Verdicts:
    status, codes, rounds = [0] * p, [None] * p, [None] * p
    words = np.empty((p, width), dtype=np.uint64)
    for j in range(p):
        r = (rank + j) % p
        st, code, cls, number, purpose = _HEAD.unpack_from(held, j * rec)
        status[r], rounds[r] = st, (number, purpose)
        if st == REFUSED:
            codes[r] = code_of_tag(code)
        elif st == RAISED:
            codes[r] = cls.rstrip(b"\0").decode("ascii", "replace")
        words[r] = np.frombuffer(held, dtype="<u8", count=width, offset=j * rec + RECORD_HEAD)
    words.flags.writeable = False
    return Verdicts(tuple(status), tuple(codes), words, tuple(rounds))


def _in_step(table: Verdicts, what: str) -> None:
    """executor-identity-mismatch on every rank alike unless every rank ran this round (the same
    number and purpose): the groups of ranks that did the same, the largest first."""
    groups: dict = {}
    for r, key in enumerate(table.rounds):
        groups.setdefault(key, []).append(r)
    if len(groups) == 1:
        return
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    shown = "; ".join(f"{ranks_text(rs)} at round {key[0]} ({key[1].hex()})" for key, rs in ordered)
    raise Refusal(
        "executor-identity-mismatch",
        f"the ranks are out of step while {what}: {shown} (a rank built, saved or checked one more or one "
        "fewer time than the others, or called another operation); nothing was decided",
        ranks=tuple(sorted(r for _, rs in ordered[1:] for r in rs)),
    )


def ranks_text(ranks) -> str:
    """`rank 3` / `ranks 0, 1, 2` (as messages name them)."""
    ranks = list(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
