"""Frames: a fixed little-endian header, then the payload (the one owner of writing and checking).

A frame is one buffer (header in front of its payload: one MPI message) or, for payloads of
64 KiB and more, a header message followed by the payload message straight from or into its
place (no copy of user data); see planning/program.py. Header (128 bytes, format version 3):

    off size field
      0    8 magic b"ALPHAMPI"
      8    2 format version
     10    1 phase (PHASE_CODE)
     11    1 flags (bit 0 non-finite upstream, bit 1 a rank refused, bit 2 payload crc present,
               bit 3 the caller's one-bit vote, e.g. the Assembler's `flags`)
     12    4 header size (128)
     16    8 topology code (sha256 of the shape name: star, hierarchy:K, pairwise, ...)
     24   16 order identity (tree order + payload layout)
     40   16 identity (the realization's plan identity: placement, delivery, layout, realization)
     56    8 contract digest (numerical contract; zero when none is named)
     64    8 step (advances by one per run of a plan)
     72    4 message index
     76    4 sender rank
     80    4 receiver rank
     84    8 layout digest (what the payload holds: components, coordinate range, pieces)
     92    8 element count
    100    4 refusing rank + 1 (0: none), when flag bit 1 is set
    104    4 refusal code (first 4 bytes of sha256 of the code)
    108    4 payload CRC32C (when flag bit 2 is set)
    112    8 executor sequence (the executor's number on its communicator, agreed when built)
    120    4 reserved (zero)
    124    4 CRC32C of bytes 0..123

Version 3 (0.3) made both checksums CRC32C (Castagnoli: the SSE4.2 / ARMv8 instruction; the
kernel's `ak_crc32c`, csrc/kernel/frame.h); version 2 had zlib's CRC-32 there. A frame of version 1 or
2 is refused `frame-version`.

A check is one bytes comparison with the expected header (step patched; flags, refusal and
payload crc free) plus the CRC (`ak_frame_check`: the C round does it for every frame); only
when it differs does `FrameSpec.check` name the field. The offsets C uses are its own #defines
(csrc/kernel/frame.h); this module checks at import that they are the ones of the table above.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from .._sha256 import sha256
from ..kernel import abi as _abi
from ..kernel import ffi as _kffi
from ..kernel import lib as _klib
from ..refusals import ADVICE, FrameRefusal

MAGIC = b"ALPHAMPI"
VERSION = 3
HEADER = 128
_FMT = struct.Struct("<8sHBBI8s16s16s8sQIII8sQ")  # bytes 0..99
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
PHASE_CODE = {"r": 1, "d": 2, "a": 3, "s": 4, "g": 5, "x": 6, "h": 7, "u": 8, "o": 9, "f": 10}
PHASE_NAME = {
    1: "reduce",
    2: "deliver",
    3: "assemble",
    4: "scatter",
    5: "gather",
    6: "exchange",
    7: "halving",
    8: "allgather",
    9: "operands",
    10: "flags",
}
FLAG_NONFINITE = 1
FLAG_REFUSED = 2
FLAG_PAYLOAD_CRC = 4
FLAG_VOTE = 8  # a caller's one-bit vote riding on the frames (OR-ed along the program)
if _FMT.size != 100:  # the layout above is part of the wire format
    raise ImportError("alpha_mpi frame header layout changed size")

_FLAGS_OFF, _STEP_OFF, _REFUSED_OFF, _CODE_OFF, _PCRC_OFF, _SEQ_OFF, _RESERVED_OFF, _CRC_OFF = (
    11,
    64,
    100,
    104,
    108,
    112,
    120,
    124,
)
# The C round reads the same offsets from csrc/kernel/frame.h: they must be the table's.
_C_LAYOUT = {
    "AK_FRAME_HEADER": HEADER,
    "AK_FRAME_VERSION": VERSION,
    "AK_FRAME_VERSION_OFF": 8,
    "AK_FRAME_FLAGS_OFF": _FLAGS_OFF,
    "AK_FRAME_STEP_OFF": _STEP_OFF,
    "AK_FRAME_REFUSED_OFF": _REFUSED_OFF,
    "AK_FRAME_CODE_OFF": _CODE_OFF,
    "AK_FRAME_PCRC_OFF": _PCRC_OFF,
    "AK_FRAME_SEQ_OFF": _SEQ_OFF,
    "AK_FRAME_CRC_OFF": _CRC_OFF,
    "AK_FLAG_NONFINITE": FLAG_NONFINITE,
    "AK_FLAG_REFUSED": FLAG_REFUSED,
    "AK_FLAG_PAYLOAD_CRC": FLAG_PAYLOAD_CRC,
    "AK_FLAG_VOTE": FLAG_VOTE,
}
_abi.check(_C_LAYOUT, "alpha_mpi/execution/frames.py")


def crc32c(data, crc: int = 0) -> int:
    """CRC32C of a buffer (bytes, memoryview, numpy array), continuing from `crc`: the kernel's
    (the CPU's instruction where it has one; csrc/kernel/frame.h)."""
    mv = memoryview(data).cast("B")
    return _klib.ak_crc32c(crc, _kffi.from_buffer("uint8_t[]", mv), mv.nbytes)


def seal(mv) -> None:
    """Recompute the header CRC of a frame buffer whose header bytes were changed (tests and
    fault injection write a field, then seal it, so that only the field differs)."""
    _U32.pack_into(mv, _CRC_OFF, crc32c(memoryview(mv).cast("B")[:_CRC_OFF]))


def short_digest(text: str, n: int) -> bytes:
    """First n bytes of a hex digest, or of sha256(text) for names that are not digests."""
    try:
        raw = bytes.fromhex(text)
        if len(raw) >= n:
            return raw[:n]
    except ValueError:
        pass
    return sha256(text.encode()).digest()[:n]


def code_tag(code: str) -> bytes:
    return sha256(code.encode()).digest()[:4]


_CODE_OF_TAG = {code_tag(c): c for c in ADVICE}


def code_of_tag(tag: bytes) -> str:
    """The refusal code a header names (or a placeholder for a code this version lacks)."""
    return _CODE_OF_TAG.get(bytes(tag), "unknown-code-" + bytes(tag).hex())


class FrameSpec:
    """What one planned frame must say. Built once per plan and message; patched per step."""

    __slots__ = (
        "phase",
        "edge",
        "sender",
        "receiver",
        "count",
        "topology",
        "order",
        "identity",
        "contract",
        "layout",
        "sequence",
        "expect",
        "where",
    )

    def __init__(
        self,
        *,
        phase,
        edge,
        sender,
        receiver,
        count,
        topology,
        layout_order_id,
        identity,
        layout_key,
        contract="",
        sequence=0,
    ):
        self.phase = PHASE_CODE[phase]
        self.edge, self.sender, self.receiver, self.count = edge, sender, receiver, count
        self.topology = short_digest(topology, 8)
        self.order = short_digest(layout_order_id, 16)
        self.identity = short_digest(identity, 16)
        self.contract = short_digest(contract, 8) if contract else b"\0" * 8
        self.layout = short_digest(layout_key, 8)
        self.sequence = sequence
        tmp = bytearray(HEADER)
        self._pack(tmp, 0, 0)
        _U64.pack_into(tmp, _SEQ_OFF, sequence)
        self.expect = bytes(tmp[:_CRC_OFF])  # step 0, no flags
        self.where = f"{PHASE_NAME[self.phase]} frame {edge} from rank {sender}"

    def _pack(self, buf, step: int, flags: int) -> None:
        _FMT.pack_into(
            buf,
            0,
            MAGIC,
            VERSION,
            self.phase,
            flags,
            HEADER,
            self.topology,
            self.order,
            self.identity,
            self.contract,
            step,
            self.edge,
            self.sender,
            self.receiver,
            self.layout,
            self.count,
        )

    @property
    def nbytes(self) -> int:
        return 8 * self.count

    def write(
        self, buf, step: int, flags: int = 0, refused: int = -1, code: str = "", payload_crc: int = 0
    ) -> None:
        """Write the whole header into the first HEADER bytes of a uint8 buffer."""
        mv = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf
        mv[:_CRC_OFF] = self.expect
        patch(mv, step, flags, refused, code_tag(code) if code else b"\0\0\0\0", payload_crc)

    def check(self, buf, step: int, nbytes_received: int, split: bool = False) -> int:
        """Refuse unless the received header is exactly the one expected; return its flags.
        `nbytes_received`: bytes of the message (the header message only, when `split`)."""
        ctx = dict(edge=self.edge, peer=self.sender, step=step)
        where = f"{self.where} (step {step})"
        expected_bytes = HEADER if split else HEADER + 8 * self.count
        if nbytes_received < HEADER:
            raise FrameRefusal(
                "frame-size-mismatch", f"{where}: {nbytes_received} bytes arrived, less than a header", **ctx
            )
        h = bytes(memoryview(buf).cast("B")[:HEADER])
        f = _FMT.unpack_from(h, 0)
        (
            magic,
            version,
            phase,
            flags,
            hsize,
            topo,
            order,
            ident,
            contract,
            fstep,
            edge,
            sender,
            receiver,
            layout,
            count,
        ) = f
        if magic == MAGIC and version != VERSION:
            old = {1: (100, zlib.crc32), 2: (_CRC_OFF, zlib.crc32)}.get(version)  # CRC position, function
            if old is not None and _U32.unpack_from(h, old[0])[0] == old[1](h[: old[0]]):
                raise FrameRefusal(
                    "frame-version", f"{where}: format version {version}, expected {VERSION}", **ctx
                )
        if _U32.unpack_from(h, _CRC_OFF)[0] != crc32c(h[:_CRC_OFF]) or hsize != HEADER:
            raise FrameRefusal(
                "frame-checksum",
                f"{where}: the header's checksum does not match its contents (corrupted in transit"
                + (")" if magic == MAGIC else ", or not an alpha_mpi frame)"),
                **ctx,
            )
        if magic != MAGIC:
            raise FrameRefusal("frame-magic", f"{where}: magic {magic!r}, expected {MAGIC!r}", **ctx)
        if version != VERSION:
            raise FrameRefusal(
                "frame-version", f"{where}: format version {version}, expected {VERSION}", **ctx
            )
        if topo != self.topology:
            raise FrameRefusal(
                "frame-topology-mismatch",
                f"{where}: the peer combines with another topology (code {topo.hex()}, expected {self.topology.hex()})",
                **ctx,
            )
        if order != self.order:
            if count != self.count or layout != self.layout:  # the layout is part of the order id
                raise FrameRefusal(
                    "frame-size-mismatch",
                    f"{where}: {count} elements of another payload layout, expected {self.count}",
                    **ctx,
                )
            raise FrameRefusal(
                "frame-order-mismatch", f"{where}: order id {order.hex()}, expected {self.order.hex()}", **ctx
            )
        if ident != self.identity:
            raise FrameRefusal(
                "frame-identity-mismatch",
                f"{where}: plan identity {ident.hex()}, expected {self.identity.hex()} (the peer runs another "
                "realization, placement, delivery or rank count of this order)",
                **ctx,
            )
        if contract != self.contract:
            raise FrameRefusal(
                "frame-contract-mismatch",
                f"{where}: contract {contract.hex()}, expected {self.contract.hex()} (the peer runs this plan "
                "under another numerical contract)",
                **ctx,
            )
        if (phase, edge, sender, receiver) != (self.phase, self.edge, self.sender, self.receiver):
            raise FrameRefusal(
                "frame-routing-mismatch",
                f"{where}: frame says phase {phase} message {edge} from {sender} to {receiver}, expected phase "
                f"{self.phase} message {self.edge} from {self.sender} to {self.receiver}",
                **ctx,
            )
        if fstep != step:
            raise FrameRefusal("frame-step-mismatch", f"{where}: frame is for step {fstep}", **ctx)
        # The size last: a header that names another plan says so, whatever its size.
        if nbytes_received != expected_bytes:
            raise FrameRefusal(
                "frame-size-mismatch",
                f"{where}: {nbytes_received} bytes arrived, expected {expected_bytes}",
                **ctx,
            )
        if layout != self.layout or count != self.count:
            raise FrameRefusal(
                "frame-size-mismatch",
                f"{where}: {count} elements, expected {self.count} (another payload layout)",
                **ctx,
            )
        fseq = _U64.unpack_from(h, _SEQ_OFF)[0]
        if fseq != self.sequence:
            raise FrameRefusal(
                "frame-sequence-mismatch",
                f"{where}: a frame of executor #{fseq} on this communicator, expected #{self.sequence} (the "
                "peer runs another executor of the same plan: it skipped or repeated one, or dup=False lets "
                "two executors share a communicator)",
                **ctx,
            )
        if h[_RESERVED_OFF:_CRC_OFF] != bytes(_CRC_OFF - _RESERVED_OFF):
            raise FrameRefusal("frame-checksum", f"{where}: reserved header bytes are not zero", **ctx)
        return flags

    def fast_check(self, mv, step: int) -> int:
        """The frame's flags if its header is byte for byte the expected one (step patched;
        flags, refusal and payload crc free) with a valid CRC; -1 otherwise (then `check`
        names what differs). The C round's check (ak_frame_check), for one header in Python."""
        h = _kffi.from_buffer("uint8_t[]", memoryview(mv).cast("B"))
        return _klib.ak_frame_check(h, self.expect, step)


def patch(
    mv, step: int, flags: int, refused: int = -1, code: bytes = b"\0\0\0\0", payload_crc: int = 0
) -> None:
    """Patch the per-run fields of a header written from its template, then its CRC (what the
    C round does for every frame it sends: ak_frame_patch)."""
    h = _kffi.from_buffer("uint8_t[]", memoryview(mv).cast("B"))
    _klib.ak_frame_patch(h, h, step, flags, refused, code, payload_crc)


def refusal_of(mv) -> tuple:
    """(refusing rank, code) a header names (flag bit 1)."""
    return _U32.unpack_from(mv, _REFUSED_OFF)[0] - 1, code_of_tag(mv[_CODE_OFF : _CODE_OFF + 4])


def payload_crc_of(mv) -> int:
    return _U32.unpack_from(mv, _PCRC_OFF)[0]


def frame_buffer(count: int) -> np.ndarray:
    """A uint8 buffer for one frame; its payload view is `payload(buf)` (float64, aligned)."""
    return np.zeros(HEADER + 8 * count, dtype=np.uint8)


def payload(buf: np.ndarray) -> np.ndarray:
    return buf[HEADER:].view(np.float64)


__all__ = [
    "MAGIC",
    "VERSION",
    "HEADER",
    "PHASE_CODE",
    "PHASE_NAME",
    "FLAG_NONFINITE",
    "FLAG_REFUSED",
    "FLAG_PAYLOAD_CRC",
    "FLAG_VOTE",
    "FrameSpec",
    "patch",
    "refusal_of",
    "payload_crc_of",
    "crc32c",
    "seal",
    "code_tag",
    "code_of_tag",
    "frame_buffer",
    "payload",
    "short_digest",
]
