"""``TileAssignment``: the device array of a tiled sharding.

Two forms, one value:

* iota form (XLA's "V2" sharding): ``arange(N).reshape(reshape_dims)
  .transpose(transpose_perm).reshape(dims)``, stored as three small tuples so a
  2048-device mesh costs a few integers, printed ``[2,4]<=[4,2]T(1,0)``;
* explicit form: a full ``int64`` array, printed ``[2,2]0,2,1,3``.

Equality is by value (an iota and an explicit array that denote the same device
array are equal).  The iota fields are always canonical, exactly as XLA's
``IotaTileAssignment::Create`` makes them, so printing matches XLA.

``reshape`` and ``transpose`` follow XLA's ``TileAssignment`` rules, including
when XLA gives up on the iota form and falls back to an explicit array; that is
what makes parse -> print byte-identical to XLA.  ``compact()`` goes further
than XLA and recognises any explicit array that is an iota (used by the sharding
algebra so its outputs stay small).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from hlo_spmd.errors import ShardingError
from hlo_spmd.memo import BoundedMemo
from hlo_spmd.sharding.array_key import array_token

__all__ = ["TileAssignment", "canonicalize_iota", "iota_form", "iota_array"]


def _prod(xs: Sequence[int]) -> int:
    return math.prod(int(x) for x in xs)


def canonicalize_iota(reshape_dims: Sequence[int],
                      transpose_perm: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """XLA's canonical (reshape_dims, perm): no size-1 dims, no mergeable runs.

    Memoised on the (int-tuple) spelling: propagation builds the same few tile
    assignments hundreds of thousands of times on a large module.
    """
    return _canonicalize_iota(tuple(map(int, reshape_dims)), tuple(map(int, transpose_perm)))


@functools.lru_cache(maxsize=1 << 14)
def _canonicalize_iota(reshape_dims: tuple[int, ...],
                       transpose_perm: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The uncached canonicalisation (see :func:`canonicalize_iota`).

    Reshape dims that stay adjacent and in order after the transpose are one
    dim in disguise; merging them (and dropping 1s) gives a unique spelling,
    e.g. ``[3,4,5]T(1,2,0) -> [3,20]T(1,0)``.
    """
    dims = [int(d) for d in reshape_dims]
    perm = [int(p) for p in transpose_perm]
    if len(dims) <= 1:  # XLA leaves rank <= 1 untouched, even [1].
        return tuple(dims), tuple(perm)
    keep = [i for i, d in enumerate(dims) if d != 1]
    remap = {old: new for new, old in enumerate(keep)}
    dims = [dims[i] for i in keep]
    perm = [remap[p] for p in perm if p in remap]
    if not dims:
        return (1,), (0,)
    # Split perm into maximal runs p, p+1, p+2...; each run is one dim.
    runs: list[list[int]] = []
    for p in perm:
        if runs and runs[-1][-1] + 1 == p:
            runs[-1].append(p)
        else:
            runs.append([p])
    by_start = sorted(range(len(runs)), key=lambda r: runs[r][0])
    rank_of = {r: i for i, r in enumerate(by_start)}
    new_dims = tuple(_prod(dims[d] for d in runs[r]) for r in by_start)
    new_perm = tuple(rank_of[r] for r in range(len(runs)))
    return new_dims, new_perm


def iota_array(dims: Sequence[int], reshape_dims: Sequence[int],
               transpose_perm: Sequence[int]) -> np.ndarray:
    """Materialise an iota tile assignment as an int64 array of shape ``dims``."""
    n = _prod(reshape_dims)
    arr = np.arange(n, dtype=np.int64).reshape(tuple(reshape_dims))
    return np.ascontiguousarray(arr.transpose(tuple(transpose_perm))).reshape(tuple(dims))


def iota_form(array: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Canonical (reshape_dims, perm) if ``array`` (flattened) is an iota, else None.

    An iota array is a mixed-radix digit permutation: value = sum(digit_j *
    stride_j).  Peel the minor axis (its size is the longest arithmetic run
    from 0, which canonical form makes maximal), check the whole array against
    that axis with one numpy comparison, and recurse on the major part.  At most
    log2(N) levels, each O(N) numpy work.
    """
    flat = np.asarray(array, dtype=np.int64).reshape(-1)
    if flat.size > 1 and (flat[0] != 0 or flat[1] <= 0):
        return None  # what _iota_form's first step rejects, without naming the array
    # The sharding algebra compacts the same few device arrays over and over (171
    # calls on 4 distinct arrays for a 2048-device training step): one answer per value.
    key = array_token(flat)
    if key in _IOTA_FORMS:
        return _IOTA_FORMS[key]
    return _IOTA_FORMS.put(key, _iota_form(flat))


_IOTA_FORMS = BoundedMemo(1024)


def _iota_form(flat: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    n = flat.size
    if n == 0:
        return None
    if n == 1:
        return ((1,), (0,)) if flat[0] == 0 else None
    if flat[0] != 0:
        return None
    sizes: list[int] = []    # transposed-axis sizes, minor first
    strides: list[int] = []
    cur = flat
    while cur.size > 1:
        s = int(cur[1])
        if s <= 0:
            return None
        m = cur.size
        # Longest prefix with cur[i] == i * s.
        bad = np.nonzero(cur != np.arange(m, dtype=np.int64) * s)[0]
        run = int(bad[0]) if bad.size else m
        if m % run != 0:
            return None
        block = cur.reshape(m // run, run)
        if not np.array_equal(block, block[:, :1] + np.arange(run, dtype=np.int64) * s):
            return None
        sizes.append(run)
        strides.append(s)
        cur = block[:, 0]
    sizes.reverse()
    strides.reverse()
    # Reshape dims are the axes ordered by decreasing stride; strides must
    # then be exactly the row-major strides of that order.
    order = sorted(range(len(sizes)), key=lambda j: -strides[j])
    expect = 1
    for j in reversed(order):
        if strides[j] != expect:
            return None
        expect *= sizes[j]
    if expect != n:
        return None
    reshape_dims = [sizes[j] for j in order]
    pos = {j: i for i, j in enumerate(order)}
    perm = [pos[j] for j in range(len(sizes))]
    rd, rp = canonicalize_iota(reshape_dims, perm)
    # The digit decomposition proves the values; one final check guards
    # against any reasoning slip at negligible cost.
    if not np.array_equal(iota_array((n,), rd, rp), flat):
        return None
    return rd, rp


def _transpose_kind(dims: Sequence[int], perm: Sequence[int]) -> str:
    """'noop', 'reshape' (only size-1 dims move) or 'transpose' (XLA's rule)."""
    kind = "noop"
    prev = -1
    for i, d in enumerate(perm):
        if dims[d] == 1:
            if d != i and dims[i] != 1:
                kind = "reshape"
            continue
        if d <= prev:
            return "transpose"
        prev = d
    return kind


def _prime_factors(n: int) -> list[int]:
    out: list[int] = []
    while n % 2 == 0:
        out.append(2)
        n //= 2
    f = 3
    while f * f <= n:
        while n % f == 0:
            out.append(f)
            n //= f
        f += 2
    if n > 1:
        out.append(n)
    return out


def _iota_transpose(dims: tuple[int, ...], reshape: tuple[int, ...],
                    rperm: tuple[int, ...], perm: Sequence[int]
                    ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None:
    """Transpose an iota assignment staying in iota form; None where XLA gives up.

    Mirrors XLA's IotaTileAssignment::Transpose: pure transposes of whole
    reshape dims are direct; otherwise reshape dims are split into prime
    factors and grouped greedily (with a look-ahead swap inside one original
    dim) to match the tile dims; failure means an explicit array.
    """
    new_dims = tuple(dims[p] for p in perm)
    kind = _transpose_kind(dims, perm)
    if kind == "noop":
        return dims, reshape, rperm
    if kind == "reshape":
        return (new_dims,) + canonicalize_iota(reshape, rperm)
    if len(reshape) == 1:
        return (new_dims,) + canonicalize_iota(dims, perm)
    non_one: list[int] = []
    one_to_non_one = [-1] * len(dims)
    pure = True
    for i, d in enumerate(dims):
        if d == 1:
            continue
        k = len(non_one)
        if k >= len(reshape) or reshape[rperm[k]] != d:
            pure = False
        one_to_non_one[i] = k
        non_one.append(d)
    if pure:
        new_perm = [rperm[one_to_non_one[p]] for p in perm if dims[p] != 1]
        return (new_dims,) + canonicalize_iota(reshape, new_perm)
    # Decanonicalise into prime factors.
    fdims: list[int] = []
    first_factor = [0] * (len(reshape) + 1)
    for i, d in enumerate(reshape):
        fdims.extend(_prime_factors(d))
        first_factor[i + 1] = len(fdims)
    fperm: list[int] = []
    fperm_orig: list[int] = []          # original reshape dim of each fperm slot
    orig_slots: list[list[int]] = [[] for _ in reshape]
    for od in rperm:
        for j in range(first_factor[od], first_factor[od + 1]):
            fperm.append(j)
            fperm_orig.append(od)
            orig_slots[od].append(len(fperm) - 1)

    def candidate(target: int, slot: int) -> int | None:
        idx = fperm[slot]
        if target % fdims[idx] == 0:
            return idx
        # Look ahead among later factors of the same original dim: factor
        # order inside one dim is free, so swap a fitting one forward.
        for cslot in orig_slots[fperm_orig[slot]]:
            if cslot > slot:
                cidx = fperm[cslot]
                if target % fdims[cidx] == 0:
                    fdims[idx], fdims[cidx] = fdims[cidx], fdims[idx]
                    return idx
        return None

    groups: list[list[int]] = [[] for _ in non_one]
    slot = 0
    dn = len(fdims)
    for i, target in enumerate(non_one):
        if slot >= dn:
            break
        idx = candidate(target, slot)
        while idx is not None:
            target //= fdims[idx]
            groups[i].append(idx)
            slot += 1
            if slot >= dn:
                break
            idx = candidate(target, slot)
        if target != 1:
            return None
    flat_perm: list[int] = []
    for p in perm:
        if one_to_non_one[p] >= 0:
            flat_perm.extend(groups[one_to_non_one[p]])
    if len(flat_perm) != len(fperm):
        return None
    return (new_dims,) + canonicalize_iota(fdims, flat_perm)


class TileAssignment:
    """Immutable N-d array of device ids, in iota or explicit form."""

    __slots__ = ("_dims", "_reshape", "_perm", "_array", "_hash", "_inverse")

    def __init__(self, dims: Sequence[int], reshape_dims: Sequence[int] | None = None,
                 transpose_perm: Sequence[int] | None = None) -> None:
        """Iota form; ``TileAssignment([2,4])`` is ``[2,4]<=[8]``."""
        dims_t = tuple(int(d) for d in dims)
        if any(d < 0 for d in dims_t):
            raise ShardingError(f"tile assignment dims must be non-negative, got {list(dims_t)}")
        if reshape_dims is None:
            reshape_t: tuple[int, ...] = (_prod(dims_t),)
            perm_t: tuple[int, ...] = (0,)
        else:
            reshape_t = tuple(int(d) for d in reshape_dims)
            perm_t = tuple(range(len(reshape_t))) if transpose_perm is None else \
                tuple(int(p) for p in transpose_perm)
            if not reshape_t:
                raise ShardingError("iota reshape dims must be non-empty")
            if any(d < 1 for d in reshape_t):
                raise ShardingError(f"iota reshape dims must be positive, got {list(reshape_t)}")
            if sorted(perm_t) != list(range(len(reshape_t))):
                raise ShardingError(
                    f"iota transpose perm {list(perm_t)} is not a permutation of "
                    f"0..{len(reshape_t) - 1}")
            if _prod(reshape_t) != _prod(dims_t):
                raise ShardingError(
                    f"tile assignment dims {list(dims_t)} hold {_prod(dims_t)} devices but "
                    f"iota reshape dims {list(reshape_t)} hold {_prod(reshape_t)}")
            reshape_t, perm_t = canonicalize_iota(reshape_t, perm_t)
        self._dims = dims_t
        self._reshape: tuple[int, ...] | None = reshape_t
        self._perm: tuple[int, ...] | None = perm_t
        self._array: np.ndarray | None = None
        self._hash: int | None = None
        self._inverse: np.ndarray | None = None

    # -- constructors -------------------------------------------------------
    @classmethod
    def _raw_iota(cls, dims: tuple[int, ...], reshape: tuple[int, ...],
                  perm: tuple[int, ...]) -> TileAssignment:
        ta = cls.__new__(cls)
        ta._dims, ta._reshape, ta._perm = dims, reshape, perm
        ta._array = ta._hash = ta._inverse = None
        return ta

    @classmethod
    def from_array(cls, array: np.ndarray | Sequence) -> TileAssignment:
        """Explicit form from any int array-like (copied, made read-only)."""
        arr = np.array(array, dtype=np.int64, copy=True)
        if arr.ndim == 0:
            arr = arr.reshape(1)
        arr.setflags(write=False)
        ta = cls.__new__(cls)
        ta._dims = tuple(int(d) for d in arr.shape)
        ta._reshape = ta._perm = None
        ta._array = arr
        ta._hash = ta._inverse = None
        return ta

    @classmethod
    def from_devices(cls, dims: Sequence[int], devices: Sequence[int]) -> TileAssignment:
        """Explicit form from a row-major device list (the text/proto V1 form)."""
        dims_t = tuple(int(d) for d in dims)
        devs = np.asarray(devices, dtype=np.int64).reshape(-1)
        if devs.size != _prod(dims_t):
            raise ShardingError(
                f"tile assignment dims {list(dims_t)} need {_prod(dims_t)} devices, "
                f"got {devs.size}")
        return cls.from_array(devs.reshape(dims_t))

    # -- accessors ----------------------------------------------------------
    @property
    def dims(self) -> tuple[int, ...]:
        return self._dims

    @property
    def ndim(self) -> int:
        return len(self._dims)

    @property
    def num_devices(self) -> int:
        """Number of elements (devices) in the array."""
        return _prod(self._dims)

    def dim(self, i: int) -> int:
        return self._dims[i]

    @property
    def is_iota(self) -> bool:
        return self._reshape is not None

    @property
    def reshape_dims(self) -> tuple[int, ...] | None:
        return self._reshape

    @property
    def transpose_perm(self) -> tuple[int, ...] | None:
        return self._perm

    def array(self) -> np.ndarray:
        """The device array (read-only, cached)."""
        if self._array is None:
            assert self._reshape is not None and self._perm is not None
            arr = iota_array(self._dims, self._reshape, self._perm)
            arr.setflags(write=False)
            self._array = arr
        return self._array

    def flat(self) -> np.ndarray:
        return self.array().reshape(-1)

    def first(self) -> int:
        return 0 if self.is_iota else int(self.flat()[0])

    def value_at(self, index: Sequence[int]) -> int:
        return int(self.array()[tuple(index)])

    def device_positions(self) -> np.ndarray:
        """Inverse map: ``pos[device]`` = flat index of the device, -1 if unused.

        Length is max(device)+1; used to turn per-position facts into
        per-device facts with one gather instead of a Python loop.
        """
        if self._inverse is None:
            flat = self.flat()
            size = int(flat.max()) + 1 if flat.size else 0
            inv = np.full(max(size, 0), -1, dtype=np.int64)
            if flat.size and int(flat.min()) < 0:
                raise ShardingError(f"negative device id {int(flat.min())} in tile assignment")
            inv[flat] = np.arange(flat.size, dtype=np.int64)
            inv.setflags(write=False)
            self._inverse = inv
        return self._inverse

    def uses_device(self, device: int) -> bool:
        if self.is_iota:
            return 0 <= device < self.num_devices
        return bool(np.any(self.flat() == device))

    # -- transformations ----------------------------------------------------
    def reshape(self, new_dims: Sequence[int]) -> TileAssignment:
        new_t = tuple(int(d) for d in new_dims)
        if _prod(new_t) != self.num_devices:
            raise ShardingError(
                f"cannot reshape tile assignment {list(self._dims)} to {list(new_t)}")
        if self.is_iota:
            assert self._reshape is not None and self._perm is not None
            return TileAssignment._raw_iota(new_t, self._reshape, self._perm)
        return TileAssignment.from_array(self.array().reshape(new_t))

    def transpose(self, perm: Sequence[int]) -> TileAssignment:
        """XLA's Transpose: iota stays iota when XLA's algorithm manages, else explicit."""
        perm_t = tuple(int(p) for p in perm)
        if sorted(perm_t) != list(range(self.ndim)):
            raise ShardingError(f"{list(perm_t)} is not a permutation of the {self.ndim} tile dims")
        if _transpose_kind(self._dims, perm_t) == "noop":
            return self
        if self.is_iota:
            assert self._reshape is not None and self._perm is not None
            res = _iota_transpose(self._dims, self._reshape, self._perm, perm_t)
            if res is not None:
                return TileAssignment._raw_iota(*res)
        return TileAssignment.from_array(self.array().transpose(perm_t))

    def compact(self) -> TileAssignment:
        """Same value, iota form whenever the array is one (XLA never does this)."""
        if self.is_iota:
            return self
        form = iota_form(self.array())
        if form is None:
            return self
        ta = TileAssignment._raw_iota(self._dims, form[0], form[1])
        ta._array = self._array
        return ta

    def explicit(self) -> TileAssignment:
        """Same value, explicit form."""
        if not self.is_iota:
            return self
        return TileAssignment.from_array(self.array())

    # -- value semantics ----------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TileAssignment):
            return NotImplemented
        if self is other:
            return True
        if self._dims != other._dims:
            return False
        if self.is_iota and other.is_iota:
            # Canonical iota fields are unique per array, so compare them.
            return self._reshape == other._reshape and self._perm == other._perm
        return bool(np.array_equal(self.array(), other.array()))

    def __hash__(self) -> int:
        if self._hash is None:
            # Hash the canonical iota fields when the value is an iota (cheap,
            # no materialisation); equal values always take the same branch
            # because compact() recognises every iota array.
            c = self.compact()
            if c.is_iota:
                self._hash = hash(("iota", c._dims, c._reshape, c._perm))
            else:
                self._hash = hash(("explicit", self._dims, self.array().tobytes()))
        return self._hash

    def array_text(self) -> str:
        """The part after ``devices=[dims]``: ``<=[r]T(p)`` or ``0,1,2``."""
        if self.is_iota:
            assert self._reshape is not None and self._perm is not None
            s = "<=[" + ",".join(map(str, self._reshape)) + "]"
            if len(self._reshape) > 1:
                s += "T(" + ",".join(map(str, self._perm)) + ")"
            return s
        return ",".join(map(str, self.flat().tolist()))

    def __str__(self) -> str:
        return "devices=[" + ",".join(map(str, self._dims)) + "]" + self.array_text()

    def __repr__(self) -> str:
        return f"TileAssignment({str(self)!r})"
