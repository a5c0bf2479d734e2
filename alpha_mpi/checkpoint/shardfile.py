"""One shard file: a safetensors file holding one float64 vector `values`, written byte for byte
the same for the same values (so equal bits give equal file hashes).

The safetensors format: an 8-byte little-endian header length N, N bytes of JSON header, then
the tensor data. The header here is written by this module, not by the safetensors library
(whose metadata map comes out in a varying key order): keys sorted, no spaces, padded with
spaces to a multiple of 8 bytes, so the data is 8-byte aligned. Any safetensors reader reads it.

Reading parses the header itself, strictly: one tensor `values`, dtype F64, shape and data
offsets equal to what the manifest entry says, the file exactly as long as header and data, and
metadata (when present) naming the same component and range. A float32 shard with a rewritten
hash chain, a giant header length or a truncated file is refused by name before any value is
used.
"""

from __future__ import annotations

import json
import struct

import numpy as np

from ..refusals import CheckpointRefusal
from .paths import open_shard

TENSOR = "values"
MAX_HEADER = 1 << 16  # bytes; ours are about 200


def encode(component: str, start: int, stop: int, values: np.ndarray) -> bytes:
    arr = np.ascontiguousarray(values, dtype="<f8")
    if arr.ndim != 1 or arr.size != stop - start:
        raise CheckpointRefusal(
            "checkpoint-manifest", f"{component} piece [{start}, {stop}) has {arr.size} values"
        )
    header = header_bytes(component, start, stop)
    return struct.pack("<Q", len(header)) + header + arr.tobytes()


def header_bytes(component: str, start: int, stop: int) -> bytes:
    count = stop - start
    h = {
        "__metadata__": {"component": component, "start": str(start), "stop": str(stop)},
        TENSOR: {"data_offsets": [0, 8 * count], "dtype": "F64", "shape": [count]},
    }
    body = json.dumps(h, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    return body + b" " * (-len(body) % 8)


def check_header(f, path: str, size: int, component: str, start: int, stop: int) -> int:
    """Validate the header of an open shard file against its manifest entry; return the byte
    offset of its first value."""

    def bad(what):
        return CheckpointRefusal("checkpoint-shard-invalid", f"shard {path}: {what}", path=path)

    head = f.read(8)
    if len(head) != 8:
        raise bad(f"{size} bytes, shorter than a safetensors header")
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER or 8 + n > size:
        raise bad(f"header length {n} exceeds the file ({size} bytes) or the {MAX_HEADER}-byte limit")
    raw = f.read(n)
    try:
        h = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise bad(f"header is not JSON ({type(e).__name__})")
    if not isinstance(h, dict):
        raise bad("header is not a JSON object")
    tensors = sorted(k for k in h if k != "__metadata__")
    if tensors != [TENSOR]:
        raise bad(f"holds tensors {tensors[:4]!r}, expected exactly [{TENSOR!r}]")
    t = h[TENSOR]
    count = stop - start
    if not isinstance(t, dict) or t.get("dtype") != "F64" or t.get("shape") != [count]:
        got = (t.get("dtype"), t.get("shape")) if isinstance(t, dict) else type(t).__name__
        raise bad(
            f"tensor is {got!r}, the manifest says F64 shape [{count}] (float64 values {start}..{stop})"
        )
    if t.get("data_offsets") != [0, 8 * count] or size != 8 + n + 8 * count:
        raise bad(
            f"data offsets {t.get('data_offsets')!r} and file size {size} do not hold exactly "
            f"{count} float64 values"
        )
    meta = h.get("__metadata__")
    if meta is not None and meta != {"component": component, "start": str(start), "stop": str(stop)}:
        raise bad(f"metadata does not name component {component!r} [{start}, {stop})")
    return 8 + n


def read_values(path: str, size: int, component: str, start: int, stop: int, lo: int, hi: int) -> np.ndarray:
    """Values [lo, hi) (global coordinates inside [start, stop)) of a shard file."""
    with open_shard(path, size) as f:  # as data: a regular file of exactly `size` bytes
        base = check_header(f, path, size, component, start, stop)
        f.seek(base + 8 * (lo - start))
        data = f.read(8 * (hi - lo))
    if len(data) != 8 * (hi - lo):
        raise CheckpointRefusal(
            "checkpoint-shard-invalid", f"shard {path} is shorter than its header says", path=path
        )
    return np.frombuffer(data, dtype="<f8").astype(np.float64)
