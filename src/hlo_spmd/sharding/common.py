"""Small helpers of the sharding maps (algebra, grouping, and passes' own maps):
``memoised`` memoises a sharding map, ``compact`` puts a result in iota form.

Below both ``algebra`` and ``grouping`` (each uses them; algebra also uses grouping for
manual subgroups), so the two do not import each other.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from hlo_spmd.sharding.hlo_sharding import HloSharding

_F = TypeVar("_F", bound=Callable[..., Any])


def memoised(fn: _F) -> _F:
    """Memoise a sharding map on its positional arguments (dims become tuples).

    Propagation asks for the same few maps over and over.  Metadata is part of the
    key: HloSharding equality ignores it, but results carry it along.
    """
    @functools.lru_cache(maxsize=1 << 16)
    def cached(args: tuple[Any, ...], _metadata: tuple[Any, ...]) -> Any:
        return fn(*args)

    # In front of the value-keyed cache: the same argument objects as an earlier call
    # (propagated shardings are shared objects) give its result without hashing or
    # comparing shardings.  Key: each sharding's id plus a mask of where shardings are
    # (so an id never meets an int argument); the arguments are kept alive with it.
    front: dict[tuple[Any, ...], tuple[Any, tuple[Any, ...]]] = {}

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            return fn(*args, **kwargs)
        fkey = []
        mask = 0
        bit = 1
        for a in args:
            if isinstance(a, HloSharding):
                fkey.append(id(a))
                mask |= bit
            elif a is None or isinstance(a, int):
                fkey.append(a)
            else:
                fkey.append(tuple(a))
            bit <<= 1
        fkey.append(mask)
        hit = front.get(tuple(fkey))
        if hit is not None:
            return hit[0]
        key = []
        md = []
        for a in args:
            if isinstance(a, HloSharding):
                md.append(tuple(e.metadata for e in a.tuple_elements) if a.is_tuple
                          else a.metadata)
            elif not (a is None or isinstance(a, int)):
                a = tuple(map(int, a))
            key.append(a)
        r = cached(tuple(key), tuple(md))
        if len(front) >= _FRONT_LIMIT:
            front.clear()
        front[tuple(fkey)] = (r, args)
        return r
    return wrapper  # type: ignore[return-value]


_FRONT_LIMIT = 1 << 16


def compact(sharding: HloSharding) -> HloSharding:
    """Same value with explicit tile arrays turned into iota form where possible."""
    if sharding.is_tuple:
        return HloSharding.tuple(compact(e) for e in sharding.tuple_elements)
    ta = sharding.tile_assignment
    if ta is None or ta.is_iota:
        return sharding
    c = ta.compact()
    return sharding if c is ta else sharding._replace(tile=c)
