"""How the benchmarks write their JSON documents: a document's top level and its nested lists and
objects one item a line, the innermost objects and lists (a result row, the machine) on one line
each, so that a recorded file reads, and diffs, a row at a time. No MPI here."""

from __future__ import annotations

import json
import os


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


def write_json(path: str, doc) -> None:
    """Write `doc` to `path` (creating its folder) as `to_json` lays it out."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(to_json(doc) + "\n")
