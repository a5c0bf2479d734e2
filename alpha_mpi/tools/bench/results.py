"""How the benchmarks write their JSON documents: a document's top level and its nested lists and
objects one item a line, the innermost objects and lists (a result row, the machine) on one line
each, so that a recorded file reads, and diffs, a row at a time. No MPI here."""

from __future__ import annotations

import json
import os
import stat

from ...refusals import Refusal
from .._args import write_output

MAX_DOCUMENT = 1 << 28  # bytes: a sweep of every MPICH algorithm is a few MiB


def _nested(obj) -> bool:
    items = obj.values() if isinstance(obj, dict) else obj
    return any(isinstance(v, (dict, list)) for v in items)


def to_json(obj, level: int = 0) -> str:
    """`obj` as JSON text (json.loads gives it back unchanged), laid out as the module says."""
    expand = isinstance(obj, (dict, list)) and obj and (level == 0 or _nested(obj))
    if not expand:
        return json.dumps(obj)
    pad, end = " " * (level + 1), " " * level
    if isinstance(obj, dict):
        items = [f"{pad}{json.dumps(str(k))}: {to_json(v, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    return "[\n" + ",\n".join(pad + to_json(v, level + 1) for v in obj) + "\n" + end + "]"


def write_json(path: str, doc, flag: str = "--json") -> None:
    """Write `doc` to `path` (creating its folder) as `to_json` lays it out; a path that cannot
    be written (a full disk, /dev/full, a directory) is refused as `output-unwritable`, naming
    the option (`flag`) that gave it."""
    text = to_json(doc) + "\n"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    except OSError as e:
        raise Refusal("output-unwritable", f"{flag} {path}: cannot make its folder: {e.strerror or e}")
    write_output(path, text, flag)


def read_json(path: str):
    """A benchmark document read as data: a regular file (never a FIFO or a device: opened
    non-blocking), at most MAX_DOCUMENT bytes, JSON that parses (not nested past what Python
    can decode); else `bench-document-invalid` naming the file and what is wrong with it."""

    def bad(what):
        return Refusal("bench-document-invalid", f"{path}: {what}", path=path)

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise bad(f"cannot open it: {e.strerror}")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise bad("not a regular file")
        if st.st_size > MAX_DOCUMENT:
            raise bad(f"{st.st_size} bytes, more than the {MAX_DOCUMENT} a benchmark document may hold")
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(MAX_DOCUMENT + 1)
    finally:
        os.close(fd)
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise bad(f"not a JSON document ({type(e).__name__})")
