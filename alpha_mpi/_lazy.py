"""Names a package resolves on first use (PEP 562): the one loader the facades share.

`alpha_mpi` and `alpha_mpi.numerics` load their pure names eagerly and the others (needing MPI,
numpy or the compiled kernel) only when first asked for; this module holds that mechanism once.
Pure: it imports nothing of the package, so it sits in the first layer.
"""

from __future__ import annotations

import importlib

__all__ = ["lazy_attributes"]


def lazy_attributes(package: str, table: dict, namespace: dict, moved: dict | None = None):
    """`(__getattr__, __dir__)` for the module `package` whose globals are `namespace`.

    `table` maps a name to the module (relative to `package`) that defines it; `__getattr__`
    imports that module on first use, returns the name from it and keeps it in `namespace`
    (so it runs once per name), and refuses any other name
    with AttributeError; `__dir__` lists the module's globals and the lazy names together.
    `moved` maps a name the package no longer has to where it went: the AttributeError says so.
    """
    moved = moved or {}

    def __getattr__(name):
        target = table.get(name)
        if target is None and name in moved:
            raise AttributeError(f"{package}.{name} moved to {moved[name]}: import it from there")
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(target, package), name)
        # Kept in the package's globals: later lookups find it there and never come back here
        # (an import per `alpha_mpi.allreduce` call cost as much as the 8-byte round itself).
        namespace[name] = value
        return value

    def __dir__():
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__
