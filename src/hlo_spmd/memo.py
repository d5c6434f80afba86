"""One policy for the process-wide memos of pure functions.

A model repeats the same few problems in every layer (the same dot, the same reshard,
the same replica groups), so the partitioner and the verifier remember one answer per
distinct immutable key. Keys of several memos hold O(devices) bytes, so each memo is
bounded: when it reaches its limit it is emptied whole (cheaper than LRU bookkeeping on
every hit, and a model's working set is far below every limit).

Use: ``_COSTS = BoundedMemo(1 << 15)``; ``hit = _COSTS.get(key)``; on a miss
``hit = _COSTS.put(key, compute(...))``. ``get`` is dict's own (a C call on the hot path).
"""
from __future__ import annotations

from typing import Any, TypeVar

_V = TypeVar("_V")


class BoundedMemo(dict):
    """A dict of answers that empties itself instead of growing past ``limit``."""

    __slots__ = ("limit",)

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def put(self, key: Any, value: _V) -> _V:
        """Remember ``value`` for ``key`` and return it."""
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value


__all__ = ["BoundedMemo"]
