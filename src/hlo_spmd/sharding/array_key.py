"""Hashable names for the device-id arrays that memos on the partition path key on (no XLA
counterpart: XLA keys such caches on C++ objects).

``(shape, dtype, arr.tobytes())`` was the key everywhere. At 2048 devices every such key
copies 16-48 KB and hashes the copy with siphash (~2.7 instructions a byte), and every
lookup with a key made from another, equal array compares the bytes again: that grew the
7-layer step's process by tens of millions of instructions. ``array_token`` names an
array by a small tuple instead: small arrays keep the bytes key (cheapest there); a large
one is interned, once per distinct value, under a fingerprint numpy computes in one pass
(a dot product with fixed weights), equal values getting the same token (a clash of
fingerprints only costs one exact comparison when a new value is interned). A read-only
array asked about again is answered by identity, without a pass over it.

Both tables are bounded (a long-lived process partitions many modules): when the intern
table is full it is emptied, and a value interned again gets a new serial number. A token
is never reused for another value, so a memo keyed on tokens can only miss, never answer
for the wrong array.
"""
from __future__ import annotations

import itertools

import numpy as np

__all__ = ["array_token"]

# Arrays up to this many bytes are named by their bytes (copy and hash cost less than the
# fingerprint's fixed numpy overhead).
_SMALL = 2048

_WEIGHTS = np.zeros(0, np.int64)


def _weights(n: int) -> np.ndarray:
    """The first ``n`` fingerprint weights (fixed: the same in every run)."""
    global _WEIGHTS
    if _WEIGHTS.size < n:
        size = max(n, 2 * _WEIGHTS.size, 1024)
        # A splitmix-style mix of the index in wrapping uint64 arithmetic (numpy.random
        # would cost ~40M instructions of import).
        w = np.arange(1, size + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        w ^= w >> np.uint64(31)
        w *= np.uint64(0xBF58476D1CE4E5B9)
        w ^= w >> np.uint64(29)
        _WEIGHTS = w.view(np.int64)
    return _WEIGHTS[:n]


def _fingerprint(flat: np.ndarray) -> int:
    if flat.dtype.kind in "biu" and flat.dtype.itemsize <= 8:
        # Integer wrap-around is fine for a hash (uint64 reinterprets).
        v = flat.view(np.int64) if flat.dtype == np.uint64 else flat.astype(np.int64, copy=False)
        return int(np.dot(v, _weights(v.size)))
    return hash(flat.tobytes())


def _frozen(a: np.ndarray) -> bool:
    """No one changes ``a``'s elements: it and every array it views are read-only, and the
    memory at the bottom is an array's own or an immutable bytes object."""
    while True:
        if a.flags.writeable:
            return False
        base = a.base
        if base is None or isinstance(base, bytes):
            return True
        if not isinstance(base, np.ndarray):
            return False
        a = base


# (shape, dtype, fingerprint) -> the distinct frozen arrays interned under it, each with
# its token (the key plus a process-wide serial number: never reused).
_INTERNED: dict[tuple, list[tuple[np.ndarray, tuple]]] = {}
_INTERNED_LIMIT = 1 << 12  # arrays held (each of more than _SMALL bytes)
_interned_count = 0
_SERIAL = itertools.count()
# id(read-only array) -> (the array, its token): the array is held, so its id stays its own.
_BY_ID: dict[int, tuple[np.ndarray, tuple]] = {}
_BY_ID_LIMIT = 1 << 14


def array_token(array: np.ndarray) -> tuple:
    """A small hashable tuple naming ``array``'s value: equal tokens mean equal shapes,
    dtypes and elements; equal values get equal tokens while the value stays interned."""
    global _interned_count
    a = np.asarray(array)
    if a.nbytes <= _SMALL:
        return (a.shape, a.dtype.str, a.tobytes())
    frozen = _frozen(a)
    if frozen:
        hit = _BY_ID.get(id(a))
        if hit is not None and hit[0] is a:
            return hit[1]
    flat = np.ascontiguousarray(a).reshape(-1)
    fp = (a.shape, a.dtype.str, _fingerprint(flat))
    bucket = _INTERNED.get(fp, ())
    for other, other_token in bucket:
        if np.array_equal(other, a):
            token = other_token
            break
    else:
        if _interned_count >= _INTERNED_LIMIT:
            _INTERNED.clear()
            _interned_count = 0
        bucket = _INTERNED.setdefault(fp, [])
        kept = a if frozen else a.copy()
        kept.flags.writeable = False
        token = fp + (next(_SERIAL),)
        bucket.append((kept, token))
        _interned_count += 1
    if frozen:
        if len(_BY_ID) >= _BY_ID_LIMIT:
            _BY_ID.clear()
        _BY_ID[id(a)] = (a, token)
    return token
