"""Frames: one contiguous buffer per message, a fixed little-endian header then the payload.

Header (128 bytes, so the payload starts 64-byte aligned within the buffer):

    off size field
      0    8 magic b"ALPHAMPI"
      8    2 format version
     10    1 phase (1 reduce, 2 deliver, 3 assemble)
     11    1 flags (bit 0: the combined value is non-finite upstream)
     12    4 header size (128)
     16    8 topology code (sha256 of the shape name: star, hierarchy:K, ...)
     24   16 order identity (plan order id: tree order + payload layout)
     40   16 identity (plan identity: placement, delivery, layout, realization)
     56    8 contract digest (numerical contract; zero when none is named)
     64    8 step (advances by one per combine on a plan)
     72    4 edge index
     76    4 sender rank
     80    4 receiver rank
     84    8 layout digest
     92    8 element count
    100    4 crc32 of bytes 0..99
    104   24 reserved (zero)

The receiver knows exactly which frame it expects and checks every field before any arithmetic;
the first field that differs names the refusal.
"""

from __future__ import annotations

import hashlib
import struct
import zlib

import numpy as np

from ..refusals import FrameRefusal

MAGIC = b"ALPHAMPI"
VERSION = 1
HEADER = 128
_FMT = struct.Struct("<8sHBBI8s16s16s8sQIII8sQ")
_CRC = struct.Struct("<I")
PHASE_CODE = {"r": 1, "d": 2, "a": 3}
PHASE_NAME = {1: "reduce", 2: "deliver", 3: "assemble"}
# Scatter realization (planning/scatter_plan.py): leaf pieces to chunk owners, reduced chunks out.
PHASE_CODE.update({"s": 4, "g": 5})
PHASE_NAME.update({4: "scatter", 5: "gather"})
FLAG_NONFINITE = 1
if _FMT.size != 100:  # the layout above is part of the wire format
    raise ImportError("alpha_mpi frame header layout changed size")

_STEP_OFF, _FLAGS_OFF, _CRC_OFF = 64, 11, 100


def short_digest(text: str, n: int) -> bytes:
    """First n bytes of a hex digest, or of sha256(text) for names that are not digests."""
    try:
        raw = bytes.fromhex(text)
        if len(raw) >= n:
            return raw[:n]
    except ValueError:
        pass
    return hashlib.sha256(text.encode()).digest()[:n]


class FrameSpec:
    """What one planned frame must say. Built once per plan and edge; patched per step."""

    __slots__ = ("phase", "edge", "sender", "receiver", "count", "fields", "topology", "order", "identity", "contract", "layout")

    def __init__(self, *, phase, edge, sender, receiver, count, topology, order_id, identity, layout_key, contract=""):
        self.phase = PHASE_CODE[phase]
        self.edge, self.sender, self.receiver, self.count = edge, sender, receiver, count
        self.topology = short_digest(topology, 8)
        self.order = short_digest(order_id, 16)
        self.identity = short_digest(identity, 16)
        self.contract = short_digest(contract, 8) if contract else b"\0" * 8
        self.layout = short_digest(layout_key, 8)

    def write(self, buf: np.ndarray, step: int, flags: int = 0) -> None:
        """Write the header into the first HEADER bytes of a uint8 frame buffer."""
        _FMT.pack_into(
            buf, 0, MAGIC, VERSION, self.phase, flags, HEADER, self.topology, self.order,
            self.identity, self.contract, step, self.edge, self.sender, self.receiver, self.layout, self.count,
        )
        _CRC.pack_into(buf, _CRC_OFF, zlib.crc32(buf[:_CRC_OFF]))

    def check(self, buf: np.ndarray, step: int, nbytes_received: int) -> int:
        """Refuse unless the received frame is exactly the one expected; return its flags."""
        ctx = dict(edge=self.edge, peer=self.sender, step=step)
        where = f"{PHASE_NAME[self.phase]} edge {self.edge} from rank {self.sender} (step {step})"
        expected_bytes = HEADER + 8 * self.count
        if nbytes_received < HEADER:
            raise FrameRefusal("frame-size-mismatch", f"{where}: {nbytes_received} bytes arrived, less than a header", **ctx)
        f = _FMT.unpack_from(buf, 0)
        (magic, version, phase, flags, hsize, topo, order, ident, contract, fstep, edge, sender, receiver, layout, count) = f
        if magic != MAGIC:
            raise FrameRefusal("frame-magic", f"{where}: magic {magic!r}, expected {MAGIC!r}", **ctx)
        if version != VERSION:
            raise FrameRefusal("frame-version", f"{where}: format version {version}, expected {VERSION}", **ctx)
        (crc,) = _CRC.unpack_from(buf, _CRC_OFF)
        if crc != zlib.crc32(buf[:_CRC_OFF]) or hsize != HEADER:
            raise FrameRefusal("frame-checksum", f"{where}: header checksum does not match its contents", **ctx)
        if nbytes_received != expected_bytes:
            raise FrameRefusal(
                "frame-size-mismatch", f"{where}: {nbytes_received} bytes arrived, expected {expected_bytes}", **ctx
            )
        if topo != self.topology:
            raise FrameRefusal(
                "frame-topology-mismatch",
                f"{where}: the peer combines with another topology (code {topo.hex()}, expected {self.topology.hex()})",
                **ctx,
            )
        if order != self.order:
            raise FrameRefusal("frame-order-mismatch", f"{where}: order id {order.hex()}, expected {self.order.hex()}", **ctx)
        if ident != self.identity:
            raise FrameRefusal("frame-identity-mismatch", f"{where}: plan identity {ident.hex()}, expected {self.identity.hex()}", **ctx)
        if contract != self.contract:
            raise FrameRefusal("frame-identity-mismatch", f"{where}: contract {contract.hex()}, expected {self.contract.hex()}", **ctx)
        if (phase, edge, sender, receiver) != (self.phase, self.edge, self.sender, self.receiver):
            raise FrameRefusal(
                "frame-routing-mismatch",
                f"{where}: frame says phase {phase} edge {edge} from {sender} to {receiver}, expected phase "
                f"{self.phase} edge {self.edge} from {self.sender} to {self.receiver}",
                **ctx,
            )
        if fstep != step:
            raise FrameRefusal("frame-step-mismatch", f"{where}: frame is for step {fstep}", **ctx)
        if layout != self.layout or count != self.count:
            raise FrameRefusal(
                "frame-size-mismatch",
                f"{where}: {count} elements / {nbytes_received} bytes, expected {self.count} / {expected_bytes}",
                **ctx,
            )
        return flags


def frame_buffer(count: int) -> np.ndarray:
    """A uint8 buffer for one frame; its payload view is `payload(buf)` (float64, aligned)."""
    return np.zeros(HEADER + 8 * count, dtype=np.uint8)


def payload(buf: np.ndarray) -> np.ndarray:
    return buf[HEADER:].view(np.float64)
