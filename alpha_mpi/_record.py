"""Frozen records without `dataclasses`: what a program's first reduction can afford to define.

Python 3.11's `@dataclass(frozen=True)` compiles six methods from generated source for each
class (one `exec` each, about 1 ms per class on a loaded 2-core guest), and a program's first
`allreduce` defines some thirty such classes while it imports the planner and the executor:
half of its 20 ms budget (issue 42, start-up). A `Record` subclass lists its fields as
`__slots__` and writes its own `__init__` (setting each field with `object.__setattr__`); this
base gives it, with no generated code, what the frozen dataclass gave:

- assignment and deletion refused (`FrozenInstanceError`, an AttributeError, as dataclasses'),
- equality with an object of the very same class by the fields in order (else NotImplemented),
  the hash of the fields' tuple, and a repr `Name(field=value, ...)` leaving out `_norepr`,
- `replace(**changes)` for `dataclasses.replace`, pickling and copying by the fields.

Fields are the `__slots__` of the class and its Record bases, bases' first, but for those named
in `_extra` (a cache, set later: no field, left to `__init__`); every field is an `__init__`
keyword of the same name (what `replace` and pickling rely on). A record compared by identity
(dataclasses' eq=False) sets `__eq__ = object.__eq__` and `__hash__ = object.__hash__`.
"""

from __future__ import annotations

from operator import attrgetter

_set = object.__setattr__


class FrozenInstanceError(AttributeError):
    """A field of a frozen record was assigned or deleted."""


class Record:
    """Base of a frozen record (see the module docstring)."""

    __slots__ = ()
    _fields: tuple = ()
    _norepr: tuple = ()  # fields the repr leaves out (dataclasses' field(repr=False))
    _extra: tuple = ()  # slots that are no field (caches set later through object.__setattr__)

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        fields: list = []
        for base in reversed(cls.__mro__):
            for name in base.__dict__.get("__slots__", ()):
                if name not in fields and name not in cls._extra:
                    fields.append(name)
        cls._fields = tuple(fields)
        # One C call reads every field.
        if len(fields) > 1:
            get = attrgetter(*fields)
        else:  # attrgetter of one name returns the bare value, of none is refused
            get = (lambda o, n=fields[0]: (getattr(o, n),)) if fields else (lambda o: ())
        cls._values = staticmethod(get)

    def __setattr__(self, name, value):
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name):
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return self._values(self) == self._values(other)
        return NotImplemented

    def __hash__(self):
        return hash(self._values(self))

    def __repr__(self) -> str:
        shown = (f"{n}={getattr(self, n)!r}" for n in self._fields if n not in self._norepr)
        return f"{type(self).__qualname__}({', '.join(shown)})"

    def __reduce__(self):
        return (_rebuild, (type(self), {n: getattr(self, n) for n in self._fields}))

    def replace(self, **changes):
        """A copy with `changes` (field -> value), built by `__init__` (dataclasses.replace)."""
        values = {n: getattr(self, n) for n in self._fields}
        values.update(changes)
        return type(self)(**values)


def fields_repr(obj, names: tuple) -> str:
    """`Name(field=value, ...)` over `names`: the repr of a mutable record (a plain class with a
    hand-written `__init__`, where a `@dataclass(eq=False)` would have generated one)."""
    shown = (f"{n}={getattr(obj, n)!r}" for n in names)
    return f"{type(obj).__qualname__}({', '.join(shown)})"


def _rebuild(cls, values: dict):
    return cls(**values)


__all__ = ["FrozenInstanceError", "Record", "fields_repr"]
