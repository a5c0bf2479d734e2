"""Names a package resolves on first use (PEP 562): the one loader the facades share.

`alpha_mpi` and `alpha_mpi.numerics` load their pure names eagerly and the others (needing MPI,
numpy or the compiled kernel) only when first asked for; this module holds that mechanism once.
Pure: it imports nothing of the package, so it sits in the first layer.
"""

from __future__ import annotations

import importlib
import sys
import types

__all__ = ["lazy_attributes"]

#: package -> its lazy names (what _Facade keeps the import system from overwriting)
_NAMES: dict = {}


class _Facade(types.ModuleType):
    """A package with lazy names. Where a lazy name is also one of its submodules (planning's
    `realize` and `simulate`: a function in a module of that name), importing the submodule would
    bind the module to the package's attribute; an eager `from .realize import realize` rebound
    the function after it, a lazy package must refuse that binding instead, so the name keeps
    resolving to the function (`import pkg.realize` still finds the module in sys.modules)."""

    def __setattr__(self, name, value):
        if (
            isinstance(value, types.ModuleType)
            and name in _NAMES.get(self.__name__, ())
            and value.__name__ == f"{self.__name__}.{name}"
        ):
            return
        super().__setattr__(name, value)


def lazy_attributes(package: str, table: dict, namespace: dict, moved: dict | None = None):
    """`(__getattr__, __dir__)` for the module `package` whose globals are `namespace`.

    `table` maps a name to the module (relative to `package`) that defines it; `__getattr__`
    imports that module on first use, returns the name from it and keeps it in `namespace`
    (so it runs once per name), and refuses any other name
    with AttributeError; `__dir__` lists the module's globals and the lazy names together.
    `moved` maps a name the package no longer has to where it went: the AttributeError says so.
    """
    moved = moved or {}
    _NAMES[package] = frozenset(table)
    module = sys.modules.get(package)
    if module is not None and type(module) is types.ModuleType:
        module.__class__ = _Facade

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
