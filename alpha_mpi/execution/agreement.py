"""Agreement rounds: every rank learns what every other rank says, by point-to-point only.

Two moments need every rank to come to the same verdict:
- building an executor: every rank must build the same one (plan identity, contract, payload
  check) as the same executor of its communicator (the sequence: how many were built on it
  before). A rank whose constructor refused still takes part, saying so, so every rank refuses by
  name (`peer-refused` naming it) and nobody is left paired with the wrong call.
- after a run whose refusal may have been seen on one rank only (the payload check found a
  corrupt payload in a rank's last receive): one round, paid only when the check is on, so all
  ranks refuse or none does.

A round is a dissemination (Bruck) exchange of one fixed-size record: in round k rank r sends
its merged record to r + 2^k and receives from r - 2^k (mod p), ⌈log2 p⌉ rounds, after which
every rank's record has merged every rank's. A record carries the least and the greatest
(identity, sequence) seen with the lowest rank that holds each, and the lowest refusing rank
with its code; min/max merge is associative and commutative, so every rank ends with the same
record. Receives are size-safe (transport.Waiter.receive) and bounded like every other wait.

Record (little-endian, 96 bytes): magic b"ALPHAAGR", kind (1 build, 2 run), 3 reserved,
refusing rank + 1 (0: none), refusal code tag (4), min key (24: 8 plan identity, 8 the rest of the identity — contract,
payload check —, 8 sequence), its
rank, max key (24), its rank, step (8), 8 reserved, crc32 of the bytes before it.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from ..refusals import FrameRefusal, Refusal
from . import frames as fr
from .transport import mark_broken, release_sequence

MAGIC = b"ALPHAAGR"
BUILD, RUN = 1, 2
TAG = 31  # below transport.TAG_BASE: never a frame's tag
_FMT = struct.Struct("<8sB3xI4s24sI24sIQ8x")
SIZE = _FMT.size + 4
_NONE = 0xFFFFFFFF


class Verdict:
    """What a round found: the lowest refusing rank and its code (or None), and whether the
    keys (identity, sequence) differ, with the lowest rank holding the least and the greatest."""

    __slots__ = ("refused", "code", "lo", "lo_rank", "hi", "hi_rank")

    def __init__(self, refused, code, lo, lo_rank, hi, hi_rank):
        self.refused, self.code = refused, code
        self.lo, self.lo_rank, self.hi, self.hi_rank = lo, lo_rank, hi, hi_rank

    @property
    def disagree(self) -> bool:
        return self.lo != self.hi


def key_of(identity: str, sequence: int) -> bytes:
    """The 24-byte key ranks must agree on: digests of the identity's plan part (before the
    first "|") and of the rest (contract, payload check), apart so that a refusal can say which
    differs, and the executor sequence."""
    plan, _, rest = identity.partition("|")
    return fr.short_digest(plan, 8) + fr.short_digest(rest, 8) + struct.pack("<Q", sequence)


def _pack(buf, kind, refused, code, lo, lo_rank, hi, hi_rank, step) -> None:
    _FMT.pack_into(buf, 0, MAGIC, kind, refused + 1, code, lo, lo_rank, hi, hi_rank, step)
    struct.pack_into("<I", buf, _FMT.size, zlib.crc32(bytes(buf[: _FMT.size])))


def exchange(
    comm,
    waiter,
    kind: int,
    key: bytes,
    step: int,
    local: Refusal | tuple[int, str] | None,
    timeout=None,
    what="agreement",
) -> Verdict:
    """Run one round on `comm` (every rank calls it, in the same order of rounds) and return
    the merged verdict. `key`: what must be equal on every rank (key_of); `local`: this rank's
    refusal, if any (or the (rank, code) of one it learned of). Raises peer-timeout (bounded)
    or a frame refusal for a foreign record."""
    rank, p = comm.Get_rank(), comm.Get_size()
    refused, code = -1, b"\0\0\0\0"
    if isinstance(local, tuple):  # a refusal this rank learned of: (refusing rank, code)
        refused, code = local[0], fr.code_tag(local[1])
    elif local is not None:
        refused, code = rank, fr.code_tag(local.code)
    lo = hi = key
    lo_rank = hi_rank = rank
    out = np.zeros(SIZE, dtype=np.uint8)
    inb = np.zeros(SIZE, dtype=np.uint8)
    dist, rnd = 1, 0
    while dist < p:
        _pack(out, kind, refused, code, lo, lo_rank, hi, hi_rank, step)
        dst, src = (rank + dist) % p, (rank - dist) % p
        req = comm.Isend(out, dest=dst, tag=TAG)
        name = f"{what} round {rnd}"
        try:
            got, scratch = waiter.receive(comm, inb, src, TAG, name, step, timeout)
        except Refusal as e:  # a peer that never came: the job cannot end cleanly by itself
            mark_broken(rank, e.code, [req])
            raise
        if scratch is not None:
            raise FrameRefusal(
                "frame-size-mismatch",
                f"rank {rank}: {name} from rank {src}: {got} bytes, expected {SIZE} (not an alpha_mpi "
                "agreement record: user traffic on a dup=False communicator?)",
                peer=src,
                step=step,
            )
        rec = bytes(inb)
        if rec[:8] != MAGIC or struct.unpack_from("<I", rec, _FMT.size)[0] != zlib.crc32(rec[: _FMT.size]):
            raise FrameRefusal(
                "frame-checksum",
                f"rank {rank}: {name} from rank {src} is not an intact agreement record (user traffic on a "
                "dup=False communicator?)",
                peer=src,
                step=step,
            )
        _, rkind, rref, rcode, rlo, rlo_rank, rhi, rhi_rank, rstep = _FMT.unpack_from(rec, 0)
        if rkind != kind or rstep != step:
            raise FrameRefusal(
                "executor-identity-mismatch",
                f"rank {rank}: {name} from rank {src} is for another moment (kind {rkind} step {rstep}, "
                f"expected kind {kind} step {step}): the ranks are out of step",
                peer=src,
                step=step,
            )
        if rref and (refused < 0 or rref - 1 < refused):
            refused, code = rref - 1, rcode
        if (rlo, rlo_rank) < (lo, lo_rank):
            lo, lo_rank = rlo, rlo_rank
        if rhi > hi or (rhi == hi and rhi_rank < hi_rank):
            hi, hi_rank = rhi, rhi_rank
        waiter.wait(req, None, dst, name, step, timeout)
        dist, rnd = dist * 2, rnd + 1
    return Verdict(
        None if refused < 0 else refused,
        fr.code_of_tag(code) if refused >= 0 else None,
        lo,
        lo_rank,
        hi,
        hi_rank,
    )


def refuse_build(verdict: Verdict, rank: int, local: Refusal | None, what: str) -> None:
    """Raise on every rank unless every rank built the same executor without refusing."""
    if local is not None:
        raise local
    if verdict.refused is not None:
        raise Refusal(
            "peer-refused",
            f"rank {verdict.refused} refused to build {what} [{verdict.code}]; no rank built it (build it "
            "again on every rank once that rank's error is fixed)",
            peer=verdict.refused,
            peer_code=verdict.code,
        )
    if verdict.disagree:
        lo, hi = verdict.lo, verdict.hi
        ranks = f"on rank {verdict.lo_rank}, {{}} on rank {verdict.hi_rank}"
        if lo[:8] != hi[:8]:
            detail = (
                f"another plan (tree, placement, delivery, layout, realization): plan {lo[:8].hex()} "
                + (ranks.format(hi[:8].hex()))
            )
        elif lo[8:16] != hi[8:16]:
            detail = (
                "the same plan under another contract or ALPHA_MPI_PAYLOAD_CHECK setting: "
                f"{lo[8:16].hex()} " + ranks.format(hi[8:16].hex())
            )
        else:
            seq = (struct.unpack("<Q", lo[16:])[0], struct.unpack("<Q", hi[16:])[0])
            detail = (
                f"executor #{seq[0]} of this communicator " + ranks.format(f"#{seq[1]}")
            ) + " (a rank built one more or one fewer executor on it)"
        raise Refusal(
            "executor-identity-mismatch", f"the ranks build different {what}s: {detail}; no rank built it"
        )


def build_round(comm, waiter, sequence: int, identity: str, local: Refusal | None, what: str) -> None:
    """The build agreement of executor number `sequence` on `comm`: returns on every rank if
    every rank built the same executor (`identity`) without refusing, else raises on every rank
    (this rank's own refusal, `peer-refused` naming the lowest refusing rank, or
    `executor-identity-mismatch` naming two ranks that differ)."""
    try:
        verdict = exchange(
            comm, waiter, BUILD, key_of(identity or "-", sequence), 0, local, what=f"{what} build agreement"
        )
        refuse_build(verdict, comm.Get_rank(), local, what)
    except Refusal:
        release_sequence(comm, sequence)  # nothing was built: a retry reuses the number
        raise


def refuse_everywhere(comm, local: Refusal, timeout=None, what: str = "executor") -> None:
    """Take part in the build agreement of the next executor on `comm` with this rank's
    refusal `local` (its peers are building that executor), so every rank refuses by name;
    always raises. For a constructor that refused before it could build its Engine."""
    from .transport import DEFAULT_TIMEOUT, Waiter, next_sequence

    sequence = next_sequence(comm)
    try:
        waiter = Waiter(comm, timeout)
    except Refusal:
        waiter = Waiter(comm, DEFAULT_TIMEOUT)
    build_round(comm, waiter, sequence, "", local, what)
    raise local  # pragma: no cover - build_round raises `local` itself


def agree_first(comm, identity: str, local: Refusal | None, timeout=None, what: str = "executor"):
    """The build agreement of an executor that will duplicate `comm` (dup=True), held on the
    communicator's library channel (transport.channel_of) BEFORE the collective Dup: a rank
    that refused, or that builds another executor, or that never comes (it skipped a
    constructor), is named by every rank within the bound, where a Dup would wait for ever.
    Returns the channel, for the caller to duplicate (every rank agreed, so every rank will)."""
    from .transport import DEFAULT_TIMEOUT, Waiter, channel_of, next_sequence

    ch = channel_of(comm)
    sequence = next_sequence(ch)
    try:
        waiter = Waiter(ch, timeout)
    except Refusal as e:
        local, waiter = local or e, Waiter(ch, DEFAULT_TIMEOUT)
    build_round(ch, waiter, sequence, identity, local, what)
    return ch


__all__ = [
    "agree_first",
    "BUILD",
    "build_round",
    "refuse_everywhere",
    "RUN",
    "SIZE",
    "TAG",
    "Verdict",
    "exchange",
    "key_of",
    "refuse_build",
]
