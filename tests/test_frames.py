"""Frame headers in one process: every field is checked, and each names its refusal."""

import os
import platform
import struct
import zlib

import numpy as np
import pytest

from alpha_mpi import Refusal
from alpha_mpi.execution.frames import HEADER, FrameSpec, frame_buffer, seal

SPEC = dict(
    phase="r",
    edge=3,
    sender=1,
    receiver=0,
    count=5,
    topology="hierarchy:2",
    layout_order_id="ab" * 32,
    identity="cd" * 32,
    layout_key="numerator:4,mass:1",
    contract="ef" * 32,
)

# (offset, struct format, code); the CRC is recomputed so only the field itself is wrong.
FIELDS = {
    "magic": (0, "8s", "frame-magic"),
    "version": (8, "H", "frame-version"),
    "phase": (10, "B", "frame-routing-mismatch"),
    "header_size": (12, "I", "frame-checksum"),
    "topology": (16, "8s", "frame-topology-mismatch"),
    "order": (24, "16s", "frame-order-mismatch"),
    "identity": (40, "16s", "frame-identity-mismatch"),
    "contract": (56, "8s", "frame-contract-mismatch"),
    "step": (64, "Q", "frame-step-mismatch"),
    "edge": (72, "I", "frame-routing-mismatch"),
    "sender": (76, "I", "frame-routing-mismatch"),
    "receiver": (80, "I", "frame-routing-mismatch"),
    "layout": (84, "8s", "frame-size-mismatch"),
    "count": (92, "Q", "frame-size-mismatch"),
    "sequence": (112, "Q", "frame-sequence-mismatch"),
}


def tamper(buf, field, fix_crc=True):
    off, fmt, _ = FIELDS[field]
    (old,) = struct.unpack_from("<" + fmt, buf, off)
    new = bytes(b ^ 0x5A for b in old) if isinstance(old, bytes) else old + 1
    struct.pack_into("<" + fmt, buf, off, new)
    if fix_crc:
        seal(buf)


def written(step, **kw):
    """SPEC's FrameSpec and the frame of 5 elements it wrote at `step` (`kw`: flags, refusal)."""
    s = FrameSpec(**SPEC)
    buf = frame_buffer(5)
    s.write(buf, step, **kw)
    return s, buf


def test_a_good_frame_passes_and_returns_flags():
    s, buf = written(7, flags=1)
    assert s.check(buf, 7, buf.nbytes) == 1
    assert buf.nbytes == HEADER + 40


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_each_tampered_field_is_refused_by_name(field):
    s, buf = written(7)
    tamper(buf, field)
    with pytest.raises(Refusal) as e:
        s.check(buf, 7, buf.nbytes)
    assert e.value.code == FIELDS[field][2]


@pytest.mark.parametrize("field", ["step", "identity", "count"])
def test_a_changed_field_without_a_new_crc_is_a_checksum_refusal(field):
    s, buf = written(7)
    tamper(buf, field, fix_crc=False)
    with pytest.raises(Refusal) as e:
        s.check(buf, 7, buf.nbytes)
    assert e.value.code == "frame-checksum"


def test_short_and_long_messages_are_size_refusals():
    s, buf = written(0)
    for n in (HEADER - 1, buf.nbytes - 8, buf.nbytes + 8):
        with pytest.raises(Refusal) as e:
            s.check(np.resize(buf, max(n, HEADER)), 0, n)
        assert e.value.code == "frame-size-mismatch"


@pytest.mark.parametrize("bad", ["soon", "0", "-3", "inf", "nan"])
def test_a_bad_timeout_is_refused_not_replaced(monkeypatch, bad):
    from alpha_mpi.execution.waits import timeout_from_env

    monkeypatch.setenv("ALPHA_MPI_TIMEOUT", bad)
    with pytest.raises(Refusal) as e:
        timeout_from_env()
    assert e.value.code == "usage"
    monkeypatch.setenv("ALPHA_MPI_TIMEOUT", "2.5")
    assert timeout_from_env() == 2.5 and timeout_from_env(7) == 7.0
    monkeypatch.delenv("ALPHA_MPI_TIMEOUT")
    assert timeout_from_env() == 300.0  # minutes, for dead peers: a slow peer must survive it


def test_every_single_bit_flip_in_a_header_is_refused_as_a_checksum():
    """A corrupted header names corruption, never a version or a foreign peer."""
    s, buf = written(7, flags=1)
    for byte in range(HEADER):
        for bit in range(8):
            bad = buf.copy()
            bad[byte] ^= 1 << bit
            with pytest.raises(Refusal) as e:
                s.check(bad, 7, bad.nbytes)
            assert e.value.code == "frame-checksum", (byte, bit, e.value.code)
            assert s.fast_check(memoryview(bad), 7) == -1


def test_refusal_and_flags_travel_in_the_header_and_the_fast_check_agrees():
    from alpha_mpi.execution.frames import FLAG_REFUSED, refusal_of

    s, buf = written(9, flags=FLAG_REFUSED, refused=3, code="dtype-invalid")
    assert s.check(buf, 9, buf.nbytes) == FLAG_REFUSED == s.fast_check(memoryview(buf), 9)
    assert refusal_of(memoryview(buf)) == (3, "dtype-invalid")
    assert s.fast_check(memoryview(buf), 8) == -1  # another step: the slow check names it
    with pytest.raises(Refusal) as e:
        s.check(buf, 8, buf.nbytes)
    assert e.value.code == "frame-step-mismatch"


@pytest.mark.parametrize("version, crc_at", [(1, 100), (2, 124)])
def test_an_older_format_version_is_named_as_such(version, crc_at):
    """Versions 1 and 2 had zlib's CRC-32 (at byte 100, then 124) where version 3 has CRC32C:
    named `frame-version`, not `frame-checksum`."""
    s, buf = written(0)
    struct.pack_into("<H", buf, 8, version)
    struct.pack_into("<I", buf, crc_at, zlib.crc32(bytes(buf[:crc_at])))
    with pytest.raises(Refusal) as e:
        s.check(buf, 0, buf.nbytes)
    assert e.value.code == "frame-version"


# -- CRC32C (csrc/kernel/frame.h) -------------------------------------------------------------------------
# RFC 3720 (iSCSI) B.4 and the usual check value: (bytes, CRC32C)
CRC32C_VECTORS = [
    (b"123456789", 0xE3069283),
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
]


@pytest.mark.parametrize("data, want", CRC32C_VECTORS)
def test_crc32c_gives_the_known_values_on_both_paths(data, want):
    from alpha_mpi.execution.frames import crc32c
    from alpha_mpi.kernel import lib

    assert crc32c(data) == want
    assert lib.ak_crc32c_portable(0, data, len(data)) == want


def test_crc32c_instruction_and_table_paths_agree_on_every_length_and_alignment():
    """The instruction path (three streams over 3 x 4 KiB blocks, 8 bytes at a time between
    unaligned ends) and the table path give one value: lengths around every boundary, at
    every start alignment, and chained in pieces."""
    from alpha_mpi.kernel import lib

    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, 3 * 4096 * 3 + 64, dtype=np.uint8).tobytes()
    lengths = [0, 1, 7, 8, 9, 15, 16, 17, 4095, 4096, 12287, 12288, 12289, 24583, 3 * 12288 + 5]
    for n in lengths:
        for off in range(8):
            piece = data[off : off + n]
            assert lib.ak_crc32c(0, piece, n) == lib.ak_crc32c_portable(0, piece, n), (n, off)
    whole = lib.ak_crc32c(0, data, len(data))
    chained = 0
    for a, b in [(0, 5), (5, 12300), (12300, len(data))]:
        chained = lib.ak_crc32c(chained, data[a:b], b - a)
    assert chained == whole == lib.ak_crc32c_portable(0, data, len(data))
    # where the CPU has the instruction the comparison above is instruction against table
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    if platform.machine() == "x86_64" and " sse4_2" in flags:
        assert lib.ak_crc32c_hardware() == 1
