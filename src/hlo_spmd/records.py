"""Plain mutable records without ``@dataclass``: ``__slots__`` classes that compare and
print like the dataclass they replace (no XLA counterpart; an import-time saving).

Python 3.11 builds each dataclass's ``__init__`` / ``__eq__`` / ``__repr__`` by ``exec``
at import (~0.4-0.8 ms a class); the partition command imports dozens of records it may
never compare or print. A subclass names its fields in ``__match_args__`` (in order, as a
dataclass does) and in ``__slots__`` (which may hold more attributes, outside equality
and repr) and writes its ``__init__``; this base gives the dataclass's ``__eq__`` (same
class, field tuples equal), ``__repr__`` (``Name(field=value, ...)``) and
``__hash__ = None``.
"""
from __future__ import annotations

from typing import Any


class Record:
    """Base of a mutable record whose fields are its ``__match_args__``."""
    __slots__ = ()
    __match_args__: tuple[str, ...] = ()
    __hash__ = None  # type: ignore[assignment]  # as a mutable dataclass: unhashable

    def _fields(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f) for f in self.__match_args__)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return (f"{type(self).__qualname__}("
                + ", ".join(f"{f}={getattr(self, f)!r}" for f in self.__match_args__) + ")")


class FrozenInstanceError(AttributeError):
    """Assignment to or deletion of a field of a frozen record (as
    ``dataclasses.FrozenInstanceError``)."""


class FrozenRecord(Record):
    """Base of an immutable record (as ``dataclass(frozen=True)``): fields set once in
    ``__init__`` through ``object.__setattr__``, hashed by value. Its ``__init__`` takes
    the fields positionally in ``__match_args__`` order (copy and pickle rebuild it so)."""
    __slots__ = ()

    def _set_fields(self, *values: Any) -> None:
        """Set the fields once, in ``__match_args__`` order (called from ``__init__``)."""
        for name, value in zip(self.__match_args__, values, strict=True):
            object.__setattr__(self, name, value)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return type(self), self._fields()

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r} of a frozen "
                                  f"{type(self).__qualname__}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r} of a frozen "
                                  f"{type(self).__qualname__}")

    def __hash__(self) -> int:
        return hash(self._fields())
