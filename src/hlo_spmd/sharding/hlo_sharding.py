"""``HloSharding``: the immutable sharding value, with XLA's normalisation rules.

Kinds: replicated, maximal (one device), manual, unknown, unreduced, tiled
(optionally ``replicate_on_last_tile_dim`` or subgroup ``last_tile_dims`` such as
``{manual, replicated}``), and tuple (a flat list of leaf shardings).

The constructors apply exactly the canonicalisation XLA applies (PartialTile
sorts each replication group, Subgroup drops size-1 subgroup dims, merges dims
of one type and sorts types, a sharding with only replication becomes
``{replicated}``...), so a value built here prints as XLA prints it.

Equality and hashing are by value and ignore metadata; the shard group
(``shard_as`` / ``shard_like``) is part of the value, as in XLA.  A value read
from a named (mesh-axis) form keeps that form for printing (``named``) and
equals its tile-form twin: the form is presentation, like metadata.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from enum import IntEnum
from typing import Any, NamedTuple

import numpy as np

from hlo_spmd.errors import ShardingError
from hlo_spmd.sharding.metadata import OpMetadata
from hlo_spmd.sharding.tile_assignment import TileAssignment

__all__ = ["HloSharding", "ShardingType", "ShardGroup"]


class ShardingType(IntEnum):
    """OpSharding.Type; also the subgroup type of a trailing tile dim."""

    REPLICATED = 0
    MAXIMAL = 1
    TUPLE = 2
    OTHER = 3
    MANUAL = 4
    UNKNOWN = 5
    UNREDUCED = 6


# Order XLA sorts subgroup types into (replicated last, so PartialTile can
# canonicalise the replication groups).
_SUBGROUP_ORDER = (ShardingType.MAXIMAL, ShardingType.TUPLE, ShardingType.OTHER,
                   ShardingType.MANUAL, ShardingType.UNREDUCED, ShardingType.REPLICATED,
                   ShardingType.UNKNOWN)

_SUBGROUP_NAMES = {ShardingType.MANUAL: "manual", ShardingType.MAXIMAL: "maximal",
                   ShardingType.REPLICATED: "replicated", ShardingType.UNREDUCED: "unreduced"}


class ShardGroup(NamedTuple):
    """``shard_as N`` (hard: shard exactly alike) or ``shard_like N`` (soft hint)."""

    id: int
    shard_as: bool

    def __str__(self) -> str:
        return f"{'shard_as' if self.shard_as else 'shard_like'} {self.id}"


def _as_tile_assignment(ta: TileAssignment | np.ndarray | Sequence[Any]) -> TileAssignment:
    if isinstance(ta, TileAssignment):
        return ta
    return TileAssignment.from_array(np.asarray(ta))


def _check_devices(ta: TileAssignment) -> None:
    """Devices must be distinct and non-negative (iota always is)."""
    if ta.num_devices == 0:
        raise ShardingError(f"tile assignment {list(ta.dims)} has no devices")
    if ta.is_iota:
        return
    flat = ta.flat()
    low = int(flat.min())
    if low < 0:
        raise ShardingError(f"device id {low} is negative in tile assignment")
    if flat.size >= 256 and flat.dtype.kind == "i" and int(flat.max()) < 4 * flat.size:
        # Ids in a small range: one bincount instead of np.unique's sort (~10x fewer
        # instructions at 2048 devices); the same smallest duplicate is reported.
        counts = np.bincount(flat)
        if counts.max() > 1:
            dup = int(np.argmax(counts > 1))
            raise ShardingError(f"device {dup} appears more than once in tile assignment")
        return
    uniq, counts = np.unique(flat, return_counts=True)
    if uniq.size != flat.size:
        dup = int(uniq[np.argmax(counts > 1)])
        raise ShardingError(f"device {dup} appears more than once in tile assignment")


@functools.lru_cache(maxsize=1 << 12)
def _sorted_groups_iota(dims: tuple[int, ...], reshape: tuple[int, ...], perm: tuple[int, ...],
                        group_size: int) -> TileAssignment | None:
    """The iota tile assignment ``dims`` over ``reshape``/``perm`` with its minor groups
    of ``group_size`` sorted, or None (memoised: propagation partially replicates the
    same few tilings over and over; tile assignments are immutable, so one is shared)."""
    res = _group_minor_iota_dims_sorted(reshape, perm, group_size)
    return None if res is None else TileAssignment(dims, res[0], res[1])


def _group_minor_iota_dims_sorted(dims: tuple[int, ...], perm: tuple[int, ...],
                                  group_size: int
                                  ) -> tuple[list[int], list[int]] | None:
    """Iota dims/perm whose minor ``group_size`` devices come out sorted.

    XLA's GroupMinorIotaDimsSorted: the trailing transposed dims that make up
    one replication group are re-ordered ascending (splitting one dim if the
    group boundary falls inside it), which sorts every group while staying
    in iota form.  None when the group does not align with the dims.
    """
    grouped = 0
    split: tuple[int, int] | None = None
    for i in range(len(perm) - 1, -1, -1):
        if group_size == 1:
            break
        d = perm[i]
        size = dims[d]
        if size <= group_size:
            if group_size % size:
                return None
            group_size //= size
            grouped += 1
        else:
            if size % group_size:
                return None
            split = (d, size // group_size)
            grouped += 1
            group_size = 1
            break
    if split is None:
        new_perm = list(perm)
        new_perm[len(new_perm) - grouped:] = sorted(new_perm[len(new_perm) - grouped:])
        return list(dims), new_perm
    s, major = split
    new_dims = list(dims[:s]) + [major, dims[s] // major] + list(dims[s + 1:])
    new_perm: list[int] = []
    for p in perm:
        if p < s:
            new_perm.append(p)
        elif p == s:
            new_perm.extend([s, s + 1])
        else:
            new_perm.append(p + 1)
    new_perm[len(new_perm) - grouped:] = sorted(new_perm[len(new_perm) - grouped:])
    return new_dims, new_perm


class HloSharding:
    """Immutable sharding value.  Build with the classmethods, never ``HloSharding()``."""

    __slots__ = ("_kind", "_tile", "_replicate_last", "_subgroup", "_elements",
                 "_device", "_metadata", "_shard_group", "_hash", "_named")

    _kind: str
    _tile: TileAssignment | None
    _replicate_last: bool
    _subgroup: tuple[ShardingType, ...]
    _elements: tuple[HloSharding, ...]
    _device: int | None
    _metadata: tuple[OpMetadata, ...]
    _shard_group: ShardGroup | None
    _hash: int | None
    _named: Any  # sharding.named.NamedSharding when read from a named form, else None

    def __init__(self) -> None:  # pragma: no cover - guard
        raise TypeError("use HloSharding.replicate()/tile()/... to build shardings")

    @classmethod
    def _make(cls, kind: str, *, tile: TileAssignment | None = None,
              replicate_last: bool = False, subgroup: Iterable[ShardingType] = (),
              elements: Iterable[HloSharding] = (), device: int | None = None,
              metadata: Iterable[OpMetadata] = (),
              shard_group: ShardGroup | None = None, named: Any = None) -> HloSharding:
        s = object.__new__(cls)
        init = object.__setattr__  # the only writer; instances are immutable
        init(s, "_kind", kind)
        init(s, "_tile", tile)
        init(s, "_replicate_last", replicate_last)
        init(s, "_subgroup", tuple(ShardingType(t) for t in subgroup))
        init(s, "_elements", tuple(elements))
        init(s, "_device", device)
        init(s, "_metadata", tuple(metadata))
        init(s, "_shard_group", shard_group)
        init(s, "_hash", None)
        init(s, "_named", named)
        return s

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("HloSharding is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickle/copy field by field (the default path would need __setattr__).
        return (_rebuild, (self._kind, self._tile, self._replicate_last, self._subgroup,
                           self._elements, self._device, self._metadata, self._shard_group,
                           self._named))

    # -- constructors -------------------------------------------------------
    @classmethod
    def replicate(cls, metadata: Iterable[OpMetadata] = ()) -> HloSharding:
        return cls._make("replicated", metadata=metadata)

    @classmethod
    def manual(cls, metadata: Iterable[OpMetadata] = ()) -> HloSharding:
        return cls._make("manual", metadata=metadata)

    @classmethod
    def unknown(cls, metadata: Iterable[OpMetadata] = ()) -> HloSharding:
        return cls._make("unknown", metadata=metadata)

    @classmethod
    def unreduced(cls, metadata: Iterable[OpMetadata] = ()) -> HloSharding:
        return cls._make("unreduced", metadata=metadata)

    @classmethod
    def maximal(cls, device: int, metadata: Iterable[OpMetadata] = ()) -> HloSharding:
        if int(device) < 0:
            raise ShardingError(f"maximal sharding device {device} is negative")
        return cls._make("maximal", device=int(device), metadata=metadata)

    assign_device = maximal

    @classmethod
    def _tiled(cls, ta: TileAssignment, replicate_last: bool = False,
               subgroup: Iterable[ShardingType] = (),
               metadata: Iterable[OpMetadata] = ()) -> HloSharding:
        """Tiled value exactly as given (no canonicalisation, no checks)."""
        return cls._make("tiled", tile=ta, replicate_last=replicate_last,
                         subgroup=subgroup, metadata=metadata)

    @classmethod
    def tile(cls, tile_assignment: TileAssignment | np.ndarray | Sequence[Any],
             replicate_on_last_tile_dim: bool = False,
             last_tile_dims: Iterable[ShardingType | int] = (),
             metadata: Iterable[OpMetadata] = ()) -> HloSharding:
        """Tiled sharding; partial/subgroup forms are canonicalised as XLA does.

        A plain tiling is kept as given (XLA does not turn ``[1,1]<=[1]`` into
        replicated either).
        """
        ta = _as_tile_assignment(tile_assignment)
        types = tuple(ShardingType(t) for t in last_tile_dims)
        if replicate_on_last_tile_dim and types:
            raise ShardingError(
                "last_tile_dim_replicate and last_tile_dims cannot be used together")
        if replicate_on_last_tile_dim:
            return cls.partial_tile(ta, metadata)
        if types:
            return cls.subgroup(ta, types, metadata)
        if ta.ndim == 0:
            raise ShardingError("tile assignment needs at least one dimension")
        _check_devices(ta)
        return cls._tiled(ta, metadata=metadata)

    @classmethod
    def iota_tile(cls, dims: Sequence[int], reshape_dims: Sequence[int] | None = None,
                  transpose_perm: Sequence[int] | None = None,
                  replicate_on_last_tile_dim: bool = False,
                  last_tile_dims: Iterable[ShardingType | int] = (),
                  metadata: Iterable[OpMetadata] = ()) -> HloSharding:
        """``{devices=[dims]<=[reshape_dims]T(perm)}`` and its partial forms."""
        return cls.tile(TileAssignment(dims, reshape_dims, transpose_perm),
                        replicate_on_last_tile_dim, last_tile_dims, metadata)

    @classmethod
    def partial_tile(cls, tile_assignment: TileAssignment | np.ndarray | Sequence[Any],
                     metadata: Iterable[OpMetadata] = ()) -> HloSharding:
        """Last tile dim is replication (XLA's PartialTile, with its canonicalisation).

        Degenerate cases collapse (all devices in one group -> replicated, group
        of one -> plain tiling); every replication group is sorted, keeping the
        iota form when XLA can.
        """
        ta = _as_tile_assignment(tile_assignment)
        if ta.ndim == 0:
            raise ShardingError("tile assignment needs at least one dimension")
        _check_devices(ta)
        return cls._partial_tile(ta, tuple(metadata))

    @classmethod
    def _partial_tile(cls, ta: TileAssignment, metadata: tuple[OpMetadata, ...]) -> HloSharding:
        n = ta.num_devices
        if ta.ndim == 1 or ta.dims[-1] == n:
            return cls.replicate(metadata)
        if ta.dims[-1] == 1:
            return cls._tiled(ta.reshape(ta.dims[:-1]), metadata=metadata)
        g = ta.dims[-1]
        if ta.is_iota:
            rd, rp = ta.reshape_dims, ta.transpose_perm
            assert rd is not None and rp is not None
            if rd[rp[-1]] == g:
                return cls._tiled(ta, True, metadata=metadata)
            grouped = _sorted_groups_iota(ta.dims, rd, rp, g)
            if grouped is not None:
                return cls._tiled(grouped, True, metadata=metadata)
        arr = np.sort(ta.array().reshape(-1, g), axis=1).reshape(ta.dims)
        return cls._tiled(TileAssignment.from_array(arr), True, metadata=metadata)

    @classmethod
    def subgroup(cls, tile_assignment: TileAssignment | np.ndarray | Sequence[Any],
                 subgroup_types: Iterable[ShardingType | int],
                 metadata: Iterable[OpMetadata] = ()) -> HloSharding:
        """Trailing tile dims typed by ``subgroup_types`` (XLA's Subgroup).

        Canonical form: size-1 subgroup dims removed, dims of one type merged,
        types sorted (replicated last), replication groups sorted, and the
        all-one-type-no-data-tiling cases collapsed to manual/replicated/
        unreduced.
        """
        ta = _as_tile_assignment(tile_assignment)
        types = tuple(ShardingType(t) for t in subgroup_types)
        if len(types) > ta.ndim:
            raise ShardingError(
                f"{len(types)} subgroup types but the tile assignment has only "
                f"{ta.ndim} dims")
        for t in types:
            if t not in _SUBGROUP_NAMES:
                raise ShardingError(f"{t.name} is not a valid subgroup type")
        if ta.ndim == 0:
            raise ShardingError("tile assignment needs at least one dimension")
        _check_devices(ta)
        return cls._subgroup_impl(ta, types, tuple(metadata))

    @classmethod
    def _subgroup_impl(cls, ta: TileAssignment, types: tuple[ShardingType, ...],
                       metadata: tuple[OpMetadata, ...]) -> HloSharding:
        if not types:
            return cls._tiled(ta, metadata=metadata)
        data_rank = ta.ndim - len(types)
        if all(t == types[0] for t in types) and math.prod(ta.dims[:data_rank]) == 1:
            if types[0] == ShardingType.MANUAL:
                return cls.manual(metadata)
            if types[0] == ShardingType.REPLICATED:
                return cls.replicate(metadata)
            if types[0] == ShardingType.UNREDUCED:
                return cls.unreduced(metadata)
        type_to_dims: dict[ShardingType, list[int]] = {}
        removed: list[int] = []
        needs_merging = False
        for i, t in enumerate(types):
            d = data_rank + i
            if ta.dims[d] == 1:
                removed.append(d)
                needs_merging = True
                continue
            if t in type_to_dims:
                needs_merging = True
            type_to_dims.setdefault(t, []).append(d)
        needs_merging |= len(type_to_dims) > 1
        if not needs_merging:
            return cls._create_subgroup(ta, types, metadata)
        perm = list(range(data_rank))
        merged_shape = list(ta.dims[:data_rank])
        merged_types: list[ShardingType] = []
        for t in _SUBGROUP_ORDER:
            ds = type_to_dims.get(t)
            if not ds:
                continue
            perm.extend(ds)
            merged_shape.append(math.prod(ta.dims[d] for d in ds))
            merged_types.append(t)
        full_perm = perm + removed
        new_ta: TileAssignment | None = None
        if ta.is_iota:
            tr = ta.transpose(full_perm)
            if tr.is_iota:
                new_ta = tr.reshape(merged_shape)
        if new_ta is None:
            new_ta = TileAssignment.from_array(
                ta.array().transpose(full_perm).reshape(merged_shape))
        return cls._create_subgroup(new_ta, tuple(merged_types), metadata)

    @classmethod
    def _create_subgroup(cls, ta: TileAssignment, types: tuple[ShardingType, ...],
                         metadata: tuple[OpMetadata, ...]) -> HloSharding:
        if types == (ShardingType.REPLICATED,):
            return cls._partial_tile(ta, metadata)
        if types == (ShardingType.MANUAL,) and ta.num_devices == ta.dims[-1]:
            return cls.manual(metadata)
        if types and types[-1] == ShardingType.REPLICATED:
            # Sort replication groups via PartialTile, then restore the types.
            p = cls._partial_tile(ta, metadata)
            if p._kind != "tiled":  # pragma: no cover - unreachable after merging
                return p
            assert p._tile is not None
            return cls._tiled(p._tile, False, types, metadata)
        return cls._tiled(ta, False, types, metadata)

    @classmethod
    def tuple(cls, shardings: Iterable[HloSharding]) -> HloSharding:
        """Tuple sharding over the flattened leaves (nested tuples are flattened)."""
        leaves: list[HloSharding] = []
        for s in shardings:
            if not isinstance(s, HloSharding):
                raise ShardingError(f"tuple element {s!r} is not an HloSharding")
            if s.is_tuple:
                leaves.extend(s._elements)
            else:
                leaves.append(s)
        return cls._make("tuple", elements=leaves)

    @classmethod
    def from_named(cls, named: Any, metadata: Iterable[OpMetadata] = ()) -> HloSharding:
        """The value of a named (mesh-axis) sharding, remembering the named form.

        The tile form (what every pass computes with) is built by the ordinary
        constructors, so it is canonical; ``named`` only decides how the value
        prints and serialises, and is dropped by any derived sharding.
        """
        md = tuple(metadata)
        if named.is_maximal:
            base = cls.maximal(named.mesh.maximal_device, md)
        elif not named.dims and not named.replicated and not named.manual and \
                named.unreduced and named.to_tiles().dims[-2] == named.mesh.num_devices:
            base = cls.unreduced(md)  # ``{mesh[...], unreduced}``: any rank, as {unreduced}
        else:
            base = cls.subgroup(named.to_tiles(), (ShardingType.MANUAL, ShardingType.UNREDUCED,
                                                  ShardingType.REPLICATED), md)
        return base._replace(named=named)

    @classmethod
    def from_string(cls, text: str) -> HloSharding:
        from hlo_spmd.sharding.text import parse_sharding
        return parse_sharding(text)

    # -- derived values -----------------------------------------------------
    def with_metadata(self, metadata: Iterable[OpMetadata], overwrite: bool = True) -> HloSharding:
        """Copy with metadata set (or only where absent when ``overwrite`` is False)."""
        md = tuple(metadata)
        if self.is_tuple:
            return HloSharding._make("tuple", elements=[e.with_metadata(md, overwrite)
                                                        for e in self._elements])
        if not overwrite and self._metadata:
            return self
        return self._replace(metadata=md)

    def without_metadata(self) -> HloSharding:
        if self.is_tuple:
            return HloSharding._make("tuple",
                                     elements=[e.without_metadata() for e in self._elements])
        return self._replace(metadata=())

    def with_shard_group(self, group: ShardGroup | None) -> HloSharding:
        return self._replace(shard_group=group)

    def _replace(self, **kw: Any) -> HloSharding:
        args = dict(tile=self._tile, replicate_last=self._replicate_last,
                    subgroup=self._subgroup, elements=self._elements, device=self._device,
                    metadata=self._metadata, shard_group=self._shard_group, named=self._named)
        args.update(kw)
        return HloSharding._make(self._kind, **args)

    # -- kind predicates (tuples: true when every leaf is) -------------------
    # (they read ``_kind`` directly: propagation asks them ~10^5 times per module)
    def _all(self, pred: str) -> bool:
        return all(getattr(e, pred) for e in self._elements)

    @property
    def kind(self) -> str:
        """'replicated', 'maximal', 'manual', 'unknown', 'unreduced', 'tiled' or 'tuple'."""
        return self._kind

    @property
    def is_tuple(self) -> bool:
        return self._kind == "tuple"

    @property
    def is_replicated(self) -> bool:
        return self._all("is_replicated") if self._kind == "tuple" else self._kind == "replicated"

    @property
    def is_maximal(self) -> bool:
        """Assigned to a single device (``{maximal device=N}``)."""
        return self._all("is_maximal") if self._kind == "tuple" else self._kind == "maximal"

    @property
    def is_tile_maximal(self) -> bool:
        """XLA's IsTileMaximal: replicated or single-device (every device has it all)."""
        if self._kind == "tuple":
            return self._all("is_tile_maximal")
        return self._kind in ("replicated", "maximal")

    @property
    def is_manual(self) -> bool:
        return self._all("is_manual") if self._kind == "tuple" else self._kind == "manual"

    @property
    def is_unknown(self) -> bool:
        return self._all("is_unknown") if self._kind == "tuple" else self._kind == "unknown"

    @property
    def is_unreduced(self) -> bool:
        return self._all("is_unreduced") if self._kind == "tuple" else self._kind == "unreduced"

    @property
    def is_tiled(self) -> bool:
        """A leaf with a tile assignment (including partial and subgroup forms)."""
        return self._kind == "tiled"

    @property
    def replicate_on_last_tile_dim(self) -> bool:
        return self._replicate_last

    @property
    def subgroup_types(self) -> tuple[ShardingType, ...]:
        """The ``last_tile_dims`` types (empty for ``last_tile_dim_replicate``)."""
        return self._subgroup

    last_tile_dims = subgroup_types

    @property
    def has_partial_replication(self) -> bool:
        return self._replicate_last or ShardingType.REPLICATED in self._subgroup

    @property
    def is_partial_replicated(self) -> bool:
        """Tiled with a replication tile dim (last_tile_dim_replicate or REPLICATED subgroup)."""
        return self.has_partial_replication

    @property
    def is_manual_subgroup(self) -> bool:
        return ShardingType.MANUAL in self._subgroup

    @property
    def tile_assignment(self) -> TileAssignment | None:
        return self._tile

    @property
    def device(self) -> int | None:
        """The device of a maximal sharding."""
        return self._device

    @property
    def tuple_elements(self) -> tuple[HloSharding, ...]:
        return self._elements

    @property
    def metadata(self) -> tuple[OpMetadata, ...]:
        return self._metadata

    @property
    def shard_group(self) -> ShardGroup | None:
        return self._shard_group

    @property
    def named(self) -> Any:
        """The named (mesh-axis) form this value was read from, or None."""
        return self._named

    def without_named(self) -> HloSharding:
        """Same value, printed and serialised in the tile form."""
        if self.is_tuple:
            return HloSharding._make("tuple", elements=[e.without_named() for e in self._elements])
        return self._replace(named=None) if self._named is not None else self

    # -- tile geometry --------------------------------------------------------
    @property
    def num_subgroup_dims(self) -> int:
        return 1 if self._replicate_last else len(self._subgroup)

    @property
    def tiled_data_rank(self) -> int | None:
        """Tile dims that tile data (all tile dims minus subgroup dims); None if untiled."""
        if self._tile is None:
            return None
        return self._tile.ndim - self.num_subgroup_dims

    data_rank = tiled_data_rank

    def tile_dims_for_data(self, rank: int | None = None) -> tuple[int, ...]:
        """Number of tiles along each data dim (all 1 for untiled kinds; give ``rank``)."""
        if self._tile is not None:
            return self._tile.dims[: self.tiled_data_rank]
        if self.is_tuple:
            raise ShardingError("a tuple sharding has no single data tiling")
        if rank is None:
            raise ShardingError(f"{self} does not know the data rank; pass rank=")
        return (1,) * rank

    def subgroup_dim(self, t: ShardingType) -> int | None:
        """Tile dim index holding subgroup type ``t`` (None if absent)."""
        if self._tile is None:
            return None
        r = self.tiled_data_rank
        assert r is not None
        if t == ShardingType.REPLICATED and self._replicate_last:
            return self._tile.ndim - 1
        for i, st in enumerate(self._subgroup):
            if st == t:
                return r + i
        return None

    @property
    def subgroup_replication_dim(self) -> int | None:
        return self.subgroup_dim(ShardingType.REPLICATED)

    @property
    def subgroup_manual_dim(self) -> int | None:
        return self.subgroup_dim(ShardingType.MANUAL)

    @property
    def num_devices(self) -> int | None:
        """Devices in the tile assignment (1 for maximal; None when not tied to a count)."""
        if self._tile is not None:
            return self._tile.num_devices
        if self._kind == "maximal":
            return 1
        return None

    @property
    def num_tiles(self) -> int:
        """Distinct data tiles (XLA's NumTiles: 1 for every untiled kind)."""
        if self.is_tuple:
            raise ShardingError("num_tiles of a tuple sharding is undefined")
        if self._tile is None:
            return 1
        return math.prod(self.tile_dims_for_data())

    @property
    def unique_device(self) -> int | None:
        if self.is_tuple:
            devs = {e.unique_device for e in self._elements}
            return devs.pop() if len(devs) == 1 and self._elements else None
        return self._device

    def uses_device(self, device: int) -> bool:
        if self.is_tuple:
            return any(e.uses_device(device) for e in self._elements)
        if self._kind in ("replicated", "manual", "unknown", "unreduced"):
            return True
        if self._kind == "maximal":
            return self._device == device
        assert self._tile is not None
        return self._tile.uses_device(device)

    def normalize_for_shape(self, shape: Any) -> HloSharding:
        """A leaf sharding on a tuple shape becomes one copy per leaf (XLA's
        NormalizeTupleSharding, which XLA's HLO parser applies to every instruction)."""
        if self.is_tuple:
            return self
        leaves = _leaf_shapes(shape)
        if leaves is None:
            return self
        return HloSharding.tuple([self] * max(1, len(leaves)))

    # -- validation -------------------------------------------------------------
    def validate_for_shape(self, shape: Any, num_devices: int | None = None) -> None:
        """Raise ShardingError unless this sharding fits ``shape``.

        ``shape``: a sequence of ints (array dims), a list of leaf shapes for a
        tuple, or an object with ``tuple_shapes`` / ``dims`` / ``dimensions``.
        ``num_devices``: when given, device ids must lie in [0, num_devices) and a
        tiled sharding must use exactly that many devices.
        """
        if _is_token(shape):
            return
        if self.is_tuple:
            leaves = _leaf_shapes(shape, empty_is_tuple=True)
            if leaves is None:
                raise ShardingError(f"tuple sharding {self} used with non-tuple shape {shape!r}")
            if len(leaves) == 0 and len(self._elements) <= 1:
                return  # empty tuples may carry zero or one sharding
            if len(leaves) != len(self._elements):
                raise ShardingError(
                    f"tuple shape has {len(leaves)} leaves but sharding {self} has "
                    f"{len(self._elements)}")
            for i, (leaf, el) in enumerate(zip(leaves, self._elements)):
                try:
                    el.validate_for_shape(leaf, num_devices)
                except ShardingError as e:
                    raise ShardingError(f"tuple leaf {i}: {e.message}") from None
            return
        if _leaf_shapes(shape) is not None:
            raise ShardingError(f"non-tuple sharding {self} used with a tuple shape")
        dims = _array_dims(shape)
        if self._named is not None and self._named.dims and len(self._named.dims) != len(dims):
            raise ShardingError(
                f"named sharding {self} has {len(self._named.dims)} dim shardings but the "
                f"shape has rank {len(dims)}")
        if self._kind in ("replicated", "manual", "unknown", "unreduced"):
            return
        if self._kind == "maximal":
            assert self._device is not None
            if num_devices is not None and self._device >= num_devices:
                raise ShardingError(
                    f"maximal device {self._device} >= num_devices ({num_devices})")
            return
        ta = self._tile
        assert ta is not None
        if ta.num_devices == 1:
            raise ShardingError(
                f"tile assignment of {self} holds a single device; use {{replicated}} "
                "or {maximal device=N}")
        if len(dims) != self.tiled_data_rank:
            raise ShardingError(
                f"sharding {self} tiles {self.tiled_data_rank} data dims but the shape "
                f"has rank {len(dims)}")
        if num_devices is not None:
            if ta.num_devices != num_devices:
                raise ShardingError(
                    f"sharding {self} uses {ta.num_devices} devices, expected {num_devices}")
            mx = ta.num_devices - 1 if ta.is_iota else int(ta.flat().max())
            if mx >= num_devices:
                raise ShardingError(f"device {mx} >= num_devices ({num_devices}) in {self}")

    # -- value semantics ----------------------------------------------------------
    def _key(self) -> tuple[Any, ...]:
        return (self._kind, self._tile, self._replicate_last, self._subgroup,
                self._elements, self._device, self._shard_group)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HloSharding):
            return NotImplemented
        return self is other or self._key() == other._key()

    def __hash__(self) -> int:
        if self._hash is None:
            object.__setattr__(self, "_hash", hash(self._key()))
        assert self._hash is not None
        return self._hash

    def to_string(self, include_metadata: bool = False) -> str:
        """XLA's text form; ``str()`` omits metadata as XLA's ToString() does."""
        from hlo_spmd.sharding.text import sharding_to_string
        return sharding_to_string(self, include_metadata)

    def __str__(self) -> str:
        return self.to_string(False)

    def __repr__(self) -> str:
        return f"HloSharding({self.to_string(True)!r})"


def _rebuild(kind: str, tile: TileAssignment | None, replicate_last: bool,
             subgroup: tuple[ShardingType, ...], elements: tuple[HloSharding, ...],
             device: int | None, metadata: tuple[OpMetadata, ...],
             shard_group: ShardGroup | None, named: Any = None) -> HloSharding:
    return HloSharding._make(kind, tile=tile, replicate_last=replicate_last, subgroup=subgroup,
                             elements=elements, device=device, metadata=metadata,
                             shard_group=shard_group, named=named)


def _is_token(shape: Any) -> bool:
    return bool(getattr(shape, "is_token", False))


def _leaf_shapes(shape: Any, empty_is_tuple: bool = False) -> list[Any] | None:
    """Flattened leaf shapes of a tuple shape, None for an array shape.

    A bare empty sequence is ambiguous (scalar or empty tuple); the caller
    says which reading applies.
    """
    if hasattr(shape, "tuple_shapes") and getattr(shape, "is_tuple", True):
        subs = getattr(shape, "tuple_shapes")
        if subs is not None and (getattr(shape, "is_tuple", False) or len(subs) > 0):
            out: list[Any] = []
            for s in subs:
                inner = _leaf_shapes(s)
                out.extend(inner if inner is not None else [s])
            return out
    if isinstance(shape, (list, tuple)) and len(shape) == 0 and empty_is_tuple:
        return []
    if isinstance(shape, (list, tuple)) and \
            any(not isinstance(x, (int, np.integer)) for x in shape):
        out = []
        for s in shape:
            inner = _leaf_shapes(s)
            out.extend(inner if inner is not None else [s])
        return out
    return None


def _array_dims(shape: Any) -> tuple[int, ...]:
    for attr in ("dims", "dimensions"):
        if hasattr(shape, attr):
            v = getattr(shape, attr)
            return tuple(int(d) for d in (v() if callable(v) else v))
    return tuple(int(d) for d in shape)
