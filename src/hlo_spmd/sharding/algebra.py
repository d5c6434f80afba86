"""Sharding algebra: geometry of shards and the sharding-to-sharding maps.

Everything works on whole numpy arrays of device ids; nothing loops over
devices in Python, so 2048-device meshes cost microseconds to milliseconds.

Vocabulary.  For a tiled sharding of an array with dims ``D``, device ``d`` sits
at tile index ``t(d)`` of the tile assignment; its data tile index is the first
``data_rank`` coordinates.  Shards are ``ceil(D_i / tiles_i)`` long; the last
ones may be partly or wholly padding ("uneven" dims).  The *holder set* of a
device is the set of real (unpadded) elements it holds; every function here is
property-tested against a direct model of holder sets.

Where XLA has the same function (hlo_sharding_util.cc), the result has XLA's
value (propagation relies on that); results are re-compacted to iota form when
possible, so they may print more compactly than XLA would print the same value.
The exceptions, where XLA's value is wrong under the holder model, are listed in
reshape_sharding and is_subtiling; propagate_through_reshape keeps XLA's value
even where it is wrong, because propagation has to pick what XLA picks.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import numpy as np

from hlo_spmd.errors import ShardingError
from hlo_spmd.sharding.hlo_sharding import HloSharding, ShardingType
from hlo_spmd.sharding.common import compact, memoised
from hlo_spmd.sharding.metadata import OpMetadata
from hlo_spmd.sharding.tile_assignment import TileAssignment

__all__ = [
    "tile_shape", "tile_coords", "shard_bounds", "device_offsets", "partial_replicate",
    "partial_replicate_all_except", "replicate_all_data_dims", "transpose_sharding",
    "reshape_sharding", "propagate_through_reshape", "reverse_sharding", "merge_compatible",
    "merge_if_compatible", "merge_sharding", "is_finer", "improve_sharding",
    "is_spatially_partitioned", "is_subtiling", "sharding_from_tile_indices",
    "with_tile_assignment",
]


# -- small helpers ------------------------------------------------------------
def _require_leaf(sharding: HloSharding, what: str) -> None:
    if sharding.is_tuple:
        raise ShardingError(f"{what} needs a non-tuple sharding, got {sharding}")


def _tiling(sharding: HloSharding, what: str) -> tuple[TileAssignment, int] | None:
    """(tile assignment, data rank) of a tiled leaf; None for another leaf (tuple: error)."""
    _require_leaf(sharding, what)
    ta, r = sharding.tile_assignment, sharding.tiled_data_rank
    return None if ta is None or r is None else (ta, r)


def _check_rank(sharding: HloSharding, dims: Sequence[int]) -> tuple[int, ...]:
    dims_t = tuple(int(d) for d in dims)
    if sharding.is_tiled and sharding.tiled_data_rank != len(dims_t):
        raise ShardingError(
            f"sharding {sharding} tiles {sharding.tiled_data_rank} dims but the shape "
            f"{list(dims_t)} has rank {len(dims_t)}")
    return dims_t


def with_tile_assignment(like: HloSharding, ta: TileAssignment) -> HloSharding:
    """``like``'s kind of tiling (partial, or its subgroup types) over tile array ``ta``.

    XLA's ``ReplicateOnLastTileDim() ? PartialTile(ta) : Subgroup(ta, subgroup_types())``,
    with ``like``'s metadata.
    """
    if like.replicate_on_last_tile_dim:
        return HloSharding._partial_tile(ta, like.metadata)
    return HloSharding._subgroup_impl(ta, like.subgroup_types, like.metadata)


def tile_shape(sharding: HloSharding, dims: Sequence[int]) -> tuple[int, ...]:
    """Per-device shard shape: ``ceil(dim / tiles)`` (padded at the end if uneven)."""
    _require_leaf(sharding, "tile_shape")
    dims_t = _check_rank(sharding, dims)
    if not sharding.is_tiled:
        return dims_t
    tiles = sharding.tile_dims_for_data()
    return tuple(-(-d // t) for d, t in zip(dims_t, tiles))


def tile_coords(sharding: HloSharding) -> tuple[np.ndarray, np.ndarray]:
    """(devices [N], coords [N, ndim]): every tile-array position and its device."""
    ta = sharding.tile_assignment
    if ta is None:
        raise ShardingError(f"{sharding} has no tile assignment")
    return ta.flat(), _position_coords(ta.dims)


@functools.lru_cache(maxsize=1 << 10)
def _position_coords(dims: tuple[int, ...]) -> np.ndarray:
    """``[N, ndim]`` row-major coordinates of every position of a ``dims`` array
    (read-only): the same few tile-array shapes are asked for by every sharding map."""
    n = math.prod(dims)
    rank = len(dims)
    coords = np.empty((n, rank), np.int64)
    if rank:
        # Column k is position k's digit: one broadcast fill of an arange per dim (no
        # divisions; np.unravel_index + np.stack cost several passes at 2048 devices).
        grid = coords.reshape(tuple(dims) + (rank,))
        for k, d in enumerate(dims):
            grid[..., k] = np.arange(d, dtype=np.int64).reshape(
                (1,) * k + (d,) + (1,) * (rank - k - 1))
    coords.flags.writeable = False
    return coords


def _total_devices(sharding: HloSharding, num_devices: int | None) -> int:
    need: int | None = None
    if sharding.is_tiled:
        ta = sharding.tile_assignment
        assert ta is not None
        need = ta.num_devices if ta.is_iota else int(ta.flat().max()) + 1
    elif sharding.is_maximal:
        assert sharding.device is not None
        need = sharding.device + 1
    if num_devices is None:
        if need is None:
            raise ShardingError(f"{sharding} does not say how many devices there are; "
                                "pass num_devices=")
        return need
    if need is not None and need > num_devices:
        raise ShardingError(f"{sharding} uses device {need - 1} but num_devices={num_devices}")
    return int(num_devices)


def shard_bounds(sharding: HloSharding, dims: Sequence[int],
                 num_devices: int | None = None) -> np.ndarray:
    """``[num_devices, rank, 2]`` int64: the [start, limit) of real elements per device.

    Rows are indexed by device id.  Tiled: the device's tile clipped to the
    array (an all-padding shard has start == limit).  Devices absent from the
    tile assignment get empty [0, 0) rows.  Replicated, manual and unreduced:
    every device holds the full range (for manual that is the device's own
    local value; for unreduced a full-shaped partial sum).  Maximal: as XLA's
    TileOffset/LimitForDevice, every row is the full range although only
    ``sharding.device`` actually holds the value.  Unknown / tuple: error.
    """
    _require_leaf(sharding, "shard_bounds")
    dims_t = _check_rank(sharding, dims)
    if sharding.is_unknown:
        raise ShardingError("an {unknown} sharding has no shard geometry")
    total = _total_devices(sharding, num_devices)
    rank = len(dims_t)
    d = np.asarray(dims_t, dtype=np.int64)
    if not sharding.is_tiled:
        out = np.zeros((total, rank, 2), dtype=np.int64)
        out[:, :, 1] = d
        return out
    out = np.zeros((total, rank, 2), dtype=np.int64)
    devices, coords = tile_coords(sharding)
    tiles = np.asarray(sharding.tile_dims_for_data(), dtype=np.int64)
    size = -(-d // tiles) if rank else d
    c = coords[:, :rank]
    out[devices, :, 0] = np.minimum(c * size, d)
    out[devices, :, 1] = np.minimum((c + 1) * size, d)
    return out


def device_offsets(sharding: HloSharding, dims: Sequence[int],
                   num_devices: int | None = None) -> np.ndarray:
    """``[num_devices, rank]`` int64 shard start offsets in padded coordinates.

    ``index * ceil(dim / tiles)``, not clipped: this is the offset a
    dynamic-slice of the padded array uses.  Untiled kinds and devices absent
    from the tile assignment get 0.
    """
    _require_leaf(sharding, "device_offsets")
    dims_t = _check_rank(sharding, dims)
    total = _total_devices(sharding, num_devices)
    out = np.zeros((total, len(dims_t)), dtype=np.int64)
    if not sharding.is_tiled:
        return out
    devices, coords = tile_coords(sharding)
    tiles = np.asarray(sharding.tile_dims_for_data(), dtype=np.int64)
    size = -(-np.asarray(dims_t, dtype=np.int64) // tiles)
    out[devices] = coords[:, : len(dims_t)] * size
    return out


# -- sharding -> sharding maps -------------------------------------------------
@memoised
def transpose_sharding(sharding: HloSharding, perm: Sequence[int]) -> HloSharding:
    """Sharding of ``transpose(x, perm)`` given x's sharding (XLA's TransposeSharding).

    ``perm`` covers the data dims (subgroup dims stay put) or all tile dims.
    """
    tiling = _tiling(sharding, "transpose_sharding")
    if tiling is None:
        return sharding
    ta, r = tiling
    p = [int(x) for x in perm]
    if len(p) == r:
        if sorted(p) != list(range(r)):
            raise ShardingError(f"{p} is not a permutation of {r} dims")
        p += list(range(r, ta.ndim))
    elif len(p) != ta.ndim:
        raise ShardingError(f"perm {p} fits neither the {r} data dims nor the {ta.ndim} tile dims")
    new_ta = ta.transpose(p)
    if sharding.replicate_on_last_tile_dim:
        return compact(with_tile_assignment(sharding, new_ta))
    types = tuple(sharding.subgroup_types[i - r] for i in p[r:])
    return compact(HloSharding._subgroup_impl(new_ta, types, sharding.metadata))


@memoised
def partial_replicate(sharding: HloSharding, dims_to_replicate: Sequence[int]) -> HloSharding:
    """Stop tiling the given data dims; their devices join the replication group.

    XLA's PartiallyReplicateTiledShardingOnDims.  Dims outside the data rank
    are ignored; untiled shardings come back unchanged.
    """
    tiling = _tiling(sharding, "partial_replicate")
    if tiling is None:
        return sharding
    ta, r = tiling
    valid = [int(d) for d in dims_to_replicate if 0 <= int(d) < r]
    group = math.prod(ta.dims[d] for d in valid)
    if group == 1:
        return sharding
    if group == sharding.num_tiles and not sharding.subgroup_types:
        return HloSharding.replicate(sharding.metadata)
    perm = sorted(range(r), key=lambda d: d in valid)  # stable: kept dims first
    new_ta = transpose_sharding(sharding, perm).tile_assignment
    assert new_ta is not None
    shape = list(ta.dims)
    for d in valid:
        shape[d] = 1
    if sharding.replicate_on_last_tile_dim:
        shape[-1] *= group
        res = HloSharding._partial_tile(new_ta.reshape(shape), sharding.metadata)
    else:
        shape.insert(r, group)
        res = HloSharding._subgroup_impl(new_ta.reshape(shape),
                                         (ShardingType.REPLICATED,) + sharding.subgroup_types,
                                         sharding.metadata)
    return compact(res)


def partial_replicate_all_except(sharding: HloSharding, dims_to_keep: Sequence[int]) -> HloSharding:
    """Replicate every data dim not in ``dims_to_keep``."""
    tiling = _tiling(sharding, "partial_replicate_all_except")
    if tiling is None:
        return sharding
    keep = {int(d) for d in dims_to_keep}
    return partial_replicate(sharding, [d for d in range(tiling[1]) if d not in keep])


def replicate_all_data_dims(sharding: HloSharding, rank: int = -1) -> HloSharding:
    """Replicate all data, keeping manual (and other non-replicated) subgroups.

    XLA's ReplicateAllDataDims: with ``rank`` >= 0 a remaining subgroup sharding is
    re-ranked to ``rank`` data dims (all of one tile), e.g. for a reshape's result.
    """
    _require_leaf(sharding, "replicate_all_data_dims")
    if sharding.is_manual:
        return sharding
    if not sharding.subgroup_types:
        return HloSharding.replicate(sharding.metadata)
    result = partial_replicate_all_except(sharding, ())
    r = result.tiled_data_rank
    if rank >= 0 and result.is_tiled and r != rank:
        ta = result.tile_assignment
        assert ta is not None and r is not None
        result = with_tile_assignment(result, ta.reshape((1,) * rank + ta.dims[r:]))
    return result


def reverse_sharding(sharding: HloSharding, dims: Sequence[int]) -> HloSharding:
    """Sharding of ``reverse(x, dims)``: flip the tile order on those dims.

    Exact for evenly divided dims; with uneven dims the padding moves to the
    front, which the partitioner has to pad for (as in XLA).
    """
    _require_leaf(sharding, "reverse_sharding")
    if not sharding.is_tiled or not list(dims):
        return sharding
    ta = sharding.tile_assignment
    assert ta is not None
    arr = np.flip(ta.array(), axis=tuple(int(d) for d in dims))
    return compact(with_tile_assignment(sharding, TileAssignment.from_array(arr)))


@memoised
def reshape_sharding(sharding: HloSharding, in_dims: Sequence[int],
                     out_dims: Sequence[int]) -> HloSharding | None:
    """Sharding of ``reshape(x, out_dims)`` in which every device keeps its elements, or None.

    XLA's ReshapeSharding (the current, gcd-based one).  Source and target dims are
    walked major to minor and each source dim's tiles carried over: size-1 dims come
    and go, a dim splits into consecutive dims, consecutive dims merge while the tiles
    stay contiguous, unsharded dims reshape freely.  Where only part of a source dim's
    tiles can be carried (a transposing reshape: ``[6,4] -> [4,6]`` tiled ``[6,1]``
    keeps ``gcd(6,4) = 2`` tiles) the walk stops, and the tiles not carried join the
    replication group, so each device then holds more than before, never less; so do
    tiled size-1 source dims that meet no size-1 target dim.  Each device has exactly
    the elements it had when the result has as many tiles as the input.  None when
    no tile at all carries over.

    Two departures from XLA, both where XLA's result would lose elements:
    * None where a source dim with uneven shards would be folded in as the minor part
      of a target dim already split by a more major source dim (its shards would not
      be contiguous tiles of the target dim);
    * tiles left over go to the replication subgroup; XLA reshapes the tile array in
      place, which moves them into the manual (or other) subgroup dims when there are
      any.
    """
    _require_leaf(sharding, "reshape_sharding")
    src = tuple(int(d) for d in in_dims)
    tgt = tuple(int(d) for d in out_dims)
    if math.prod(src) != math.prod(tgt):
        raise ShardingError(f"cannot reshape {list(src)} to {list(tgt)}: element counts differ")
    if not sharding.is_tiled:
        return sharding
    _check_rank(sharding, src)
    carried, to_replicate = _carry_tiles(src, tgt, sharding.tile_dims_for_data())
    if math.prod(carried) == 1:
        return None
    carried += [1] * (len(tgt) - len(carried))
    if to_replicate:
        sharding = partial_replicate(sharding, to_replicate)
    ta = sharding.tile_assignment
    assert ta is not None  # some data tiles are carried, so some are left tiled
    r = len(src)
    sub = list(ta.dims[r:])
    types = sharding.subgroup_types or (
        (ShardingType.REPLICATED,) if sharding.replicate_on_last_tile_dim else ())
    kept = math.prod(carried)
    left = math.prod(ta.dims[:r]) // kept
    if left == 1:
        new_ta = ta.reshape(carried + sub)
    else:
        # The carried tiles are a major (row-major prefix) part of the data tiles; the
        # rest moves behind the subgroup dims as one more replication dim.
        new_ta = (ta.reshape([kept, left] + sub).transpose([0] + list(range(2, len(sub) + 2)) + [1])
                  .reshape(carried + sub + [left]))
        types += (ShardingType.REPLICATED,)
    return compact(HloSharding._subgroup_impl(new_ta, tuple(types), sharding.metadata))


def _carry_tiles(src: tuple[int, ...], tgt: tuple[int, ...],
                 tiles: Sequence[int]) -> tuple[list[int], list[int]]:
    """(tiles of the leading target dims, tiled size-1 source dims to replicate).

    The tiles carried are always a row-major prefix of the source data tiles.
    """
    # Stacks hold dims minor-first so pop() yields the most major remaining one; a
    # source entry is [size, tiles, source dim].
    s_stack = [[d, t, i] for i, (d, t) in reversed(list(enumerate(zip(src, tiles))))]
    t_stack = list(reversed(tgt))
    out: list[int] = []
    to_replicate: list[int] = []
    inplace = False  # the last target dim continues: its minor part is back on t_stack

    def append(n: int) -> None:
        nonlocal inplace
        if inplace:
            out[-1] *= n
        else:
            out.append(n)
        inplace = False

    while s_stack and t_stack and math.prod(e[1] for e in s_stack) != 1:
        # Unsharded source dims fold together and cover whole target dims.
        size, idx = 1, -1
        while s_stack and s_stack[-1][1] == 1:
            size *= s_stack[-1][0]
            idx = s_stack.pop()[2]
        while t_stack and t_stack[-1] > 1 and size % t_stack[-1] == 0:
            size //= t_stack.pop()
            append(1)
        if size != 1:
            s_stack.append([size, 1, idx])
        if not s_stack or not t_stack:
            break
        s_size, s_parts, idx = s_stack.pop()
        t_size = t_stack.pop()
        if s_size == t_size:
            if inplace and s_size % s_parts:
                return [], []  # uneven shards as the minor part of a split target dim
            append(s_parts)
        elif t_size == 1:
            append(1)
            s_stack.append([s_size, s_parts, idx])
        elif s_size == 1:
            t_stack.append(t_size)
            if s_parts > 1:
                to_replicate.append(idx)
        elif s_parts == 1:
            if not s_stack or s_stack[-1][1] != 1:
                break
            s_stack[-1][0] *= s_size
        elif s_size % s_parts:
            return [], []
        else:
            g = math.gcd(s_parts, t_size)
            if g == 1:
                break
            s_stack.append([s_size // g, s_parts // g, idx])
            t_stack.append(t_size // g)
            append(g)
            inplace = True
    return out, to_replicate


@memoised
def propagate_through_reshape(sharding: HloSharding, in_dims: Sequence[int],
                              out_dims: Sequence[int]) -> HloSharding:
    """Best sharding for ``reshape(x, out_dims)`` that keeps data in place, as XLA picks it.

    XLA's PropagateShardingThroughReshape: for each start dim, runs of consecutive
    source dims (longest first) keep their tiles, the rest replicated; the run's
    reshaped tiling (reshape_sharding) is merged into the result and the start moves
    past a run that merges.  The whole shape is tried first, so this is
    reshape_sharding's result whenever that exists.  Manual subgroups are kept: the
    data part is propagated within each manual group.  Always a sharding (replicated
    data at worst).

    Every device keeps the elements it held, except where a size-1 source dim is
    tiled (all its shards but the first are padding): XLA lays the run's devices out
    as though that dim were not tiled, so the devices of its padding shards trade
    places with devices that hold data.  This keeps XLA's result (fixture
    pipeline_shift relies on it); reshape_sharding itself has no such exception.
    """
    _require_leaf(sharding, "propagate_through_reshape")
    if not sharding.is_tiled:
        return sharding
    src = tuple(int(d) for d in in_dims)
    tgt = tuple(int(d) for d in out_dims)
    if sharding.is_manual_subgroup:
        from hlo_spmd.sharding.grouping import group_by_dims, ungroup
        manual = sharding.subgroup_manual_dim
        assert manual is not None
        grouped = group_by_dims(sharding, [manual], subgroup_manual=True)
        inner = propagate_through_reshape(grouped.sharding, src, tgt)
        return ungroup(dataclasses.replace(grouped, sharding=inner, data_rank=len(tgt),
                                           group_dims=(manual + len(tgt) - len(src),)))
    ta = sharding.tile_assignment
    assert ta is not None
    result = HloSharding.replicate()
    start = 0
    while start < len(src):
        for end in range(len(src), start, -1):
            # The run's tiling alone, on canonical devices; its reshape gives the
            # tile counts, laid out over the real devices with the run's dims first.
            run = [t if start <= i < end else 1 for i, t in enumerate(ta.dims[:len(src)])]
            reshaped = reshape_sharding(HloSharding._tiled(TileAssignment(run)), src, tgt)
            if reshaped is None or not reshaped.is_tiled:
                continue
            tiles = list(reshaped.tile_dims_for_data())
            perm = list(range(start, end)) + list(range(start)) + list(range(end, ta.ndim))
            laid_out = ta.transpose(perm).reshape(tiles + [ta.num_devices // math.prod(tiles)])
            merged = merge_if_compatible(HloSharding._partial_tile(laid_out, ()), result)
            if merged is not None:
                result = merged
                start = end
                break
        else:
            start += 1
    return result.with_metadata(sharding.metadata)


# -- merging and ordering ----------------------------------------------------------
def sharding_from_tile_indices(devices: np.ndarray, data_index: np.ndarray,
                               data_tiles: Sequence[int],
                               manual_index: np.ndarray | None = None, manual_size: int = 1,
                               metadata: Sequence[OpMetadata] = ()) -> HloSharding | None:
    """Build the sharding in which ``devices[k]`` holds data tile ``data_index[k]``.

    Devices sharing a data (and manual) index form a replication group; all
    groups must have equal size or None is returned.  Groups are listed in
    ascending device order, XLA's canonical order.
    """
    tiles = tuple(int(t) for t in data_tiles)
    n_tiles = math.prod(tiles) * manual_size
    if n_tiles == 0 or np.asarray(devices).size % n_tiles:
        return None
    columns = tuple(np.asarray(data_index, np.int64).T) if tiles else ()
    return _sharding_from_tile_columns(devices, columns, tiles, manual_index, manual_size,
                                       metadata)


def _sharding_from_tile_columns(devices: np.ndarray, columns: Sequence[np.ndarray],
                                tiles: tuple[int, ...], manual_index: np.ndarray | None,
                                manual_size: int, metadata: Sequence[OpMetadata]
                                ) -> HloSharding | None:
    """sharding_from_tile_indices with the data index given as one array per data dim."""
    devices = np.asarray(devices, dtype=np.int64)
    n = devices.size
    n_tiles = math.prod(tiles) * manual_size
    if n_tiles == 0 or n % n_tiles:
        return None
    key = np.ravel_multi_index(tuple(columns), tiles) if tiles else np.zeros(n, np.int64)
    if manual_index is not None and manual_size > 1:
        key = key * manual_size + np.asarray(manual_index, np.int64)
    reps = n // n_tiles
    counts = np.bincount(key, minlength=n_tiles)
    if counts.size != n_tiles or np.any(counts != reps):
        return None
    order = _order_by_key_then_device(key, devices)
    dims = list(tiles) + ([manual_size] if manual_size > 1 else []) + [reps]
    ta = TileAssignment.from_array(devices[order].reshape(dims)).compact()
    types = ([ShardingType.MANUAL] if manual_size > 1 else []) + [ShardingType.REPLICATED]
    return compact(HloSharding._subgroup_impl(ta, tuple(types), tuple(metadata)))


# Below this many devices numpy's fixed cost per call outweighs what a cheaper algorithm
# saves: the plain one is kept there.
_LARGE = 256


def _order_by_key_then_device(key: np.ndarray, devices: np.ndarray) -> np.ndarray:
    """``np.lexsort((devices, key))``. When every (key, device) pair is distinct and both are
    small non-negative ints (always so for a sharding's device ids), one unstable argsort
    of ``key * span + device`` gives the same order: lexsort's stable merge sort of int64
    was most of this function's cost at 2048 devices."""
    n = devices.size
    if n >= _LARGE and devices.dtype.kind == "i" and key.dtype.kind == "i":
        if bool(np.all(devices[1:] > devices[:-1])):
            # Devices already ascending: ties in key keep index order, i.e. a stable
            # sort of key, which numpy does as a linear radix sort for 16-bit ints.
            lo, hi = int(key.min()), int(key.max())
            if lo >= 0 and hi < (1 << 15):
                return np.argsort(key.astype(np.int16), kind="stable")
        lo, hi = int(devices.min()), int(devices.max())
        if lo >= 0 and hi < (1 << 31) and int(key.max()) < (1 << 31) and int(key.min()) >= 0:
            combined = key * (hi + 1) + devices
            order = np.argsort(combined)
            s = combined[order]
            if not np.any(s[1:] == s[:-1]):  # no ties, so stability does not matter
                return order
    return np.lexsort((devices, key))


def _indices_by_device(s: HloSharding, total: int) -> tuple[np.ndarray, np.ndarray]:
    """(tile coords [total, ndim] by device id, present mask [total])."""
    devices, coords = tile_coords(s)
    out = np.full((total, coords.shape[1]), -1, dtype=np.int64)
    out[devices] = coords
    present = np.zeros(total, dtype=bool)
    present[devices] = True
    return out, present


def _untransposed(ta: TileAssignment) -> bool:
    perm = ta.transpose_perm
    return perm is not None and perm == tuple(range(len(perm)))


def _iota_rows(ta: TileAssignment, tb: TileAssignment
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(devices [N], a's coords [N, ndim_a], b's coords [N, ndim_b]) row by row for two
    iota tile assignments over the same N devices, rows in ``ta``'s position order.

    Both hold every device 0..N-1 once, so the device sets agree and no [device]-indexed
    table is needed: a's coords are its position coords as they stand, b's are gathered
    through b's inverse map (not even that when neither transposes, as both flats are
    then 0..N-1). The merge only tests and regroups rows, so their order is free.
    """
    fa = ta.flat()
    ca = _position_coords(ta.dims)
    cb = _position_coords(tb.dims)
    if _untransposed(ta) and _untransposed(tb):
        return fa, ca, cb
    return fa, ca, cb[tb.device_positions()[fa]]


@memoised
def merge_compatible(a: HloSharding, b: HloSharding,
                     minimum_tiles: int | None = None) -> HloSharding | None:
    """Finest sharding whose every device holds the intersection of a's and b's tiles.

    The paper's Offset rule / XLA's MergeShardingIfCompatible: per data dim the
    tile counts must agree or one side must be 1; each device must sit at the
    same index on dims tiled by both (and in the same manual group); the
    resulting groups must be equally sized.  Replicated is the identity;
    maximal only merges with itself or replicated.  Returns None if
    incompatible or the result has fewer than ``minimum_tiles`` tiles.

    XLA assigns devices greedily and can reject some merges that are valid;
    this version accepts every merge whose groups are consistent and agrees
    with XLA whenever XLA succeeds.
    """
    if a.is_tuple or b.is_tuple:
        if not (a.is_tuple and b.is_tuple) or len(a.tuple_elements) != len(b.tuple_elements):
            return None
        parts = [merge_compatible(x, y, minimum_tiles)
                 for x, y in zip(a.tuple_elements, b.tuple_elements)]
        if any(p is None for p in parts):
            return None
        return HloSharding.tuple(p for p in parts if p is not None)
    min_tiles = 0 if minimum_tiles is None else minimum_tiles

    def ok(s: HloSharding) -> HloSharding | None:
        return s if s.num_tiles >= min_tiles else None

    if a.is_replicated:
        return ok(b.with_metadata(_merged_md(b, a)) if b.is_tiled else b)
    if b.is_replicated:
        return ok(a.with_metadata(_merged_md(a, b)) if a.is_tiled else a)
    if not (a.is_tiled and b.is_tiled):
        return ok(a) if a == b else None
    ta, tb = a.tile_assignment, b.tile_assignment
    assert ta is not None and tb is not None
    ra, rb = a.tiled_data_rank, b.tiled_data_rank
    if ra != rb or ta.num_devices != tb.num_devices:
        return None
    for t in a.subgroup_types + b.subgroup_types:
        if t not in (ShardingType.MANUAL, ShardingType.REPLICATED):
            return None  # unreduced/maximal subgroups do not merge
    ma, mb = a.subgroup_manual_dim, b.subgroup_manual_dim
    if (ma is None) != (mb is None):
        return None
    manual_size = 1
    if ma is not None and mb is not None:
        manual_size = ta.dims[ma]
        if manual_size != tb.dims[mb]:
            return None
    assert ra is not None
    da = np.asarray(ta.dims[:ra], np.int64)
    db = np.asarray(tb.dims[:ra], np.int64)
    if np.any((da > 1) & (db > 1) & (da != db)):
        return None
    merged_tiles = np.where(da > 1, da, db)
    if int(np.prod(merged_tiles)) < min_tiles:
        return None
    if ta.is_iota and tb.is_iota:
        devs, ca, cb = _iota_rows(ta, tb)
    else:
        total = max(_total_devices(a, None), _total_devices(b, None))
        ia, pa = _indices_by_device(a, total)
        ib, pb = _indices_by_device(b, total)
        if not np.array_equal(pa, pb):
            return None  # different device sets
        devs = np.nonzero(pa)[0]
        ca, cb = ia[devs], ib[devs]
    # Dim by dim on [devices] columns (numpy broadcasts [devices, rank] masks several
    # times slower than it compares rank columns).
    ta_dims, tb_dims = ta.dims, tb.dims
    columns = []
    for k in range(ra):
        if ta_dims[k] > 1:
            if tb_dims[k] > 1 and not np.array_equal(ca[:, k], cb[:, k]):
                return None
            columns.append(ca[:, k])
        else:
            columns.append(cb[:, k])
    manual_index = None
    if ma is not None and mb is not None:
        if not np.array_equal(ca[:, ma], cb[:, mb]):
            return None
        manual_index = ca[:, ma]
    return _sharding_from_tile_columns(devs, columns, tuple(int(t) for t in merged_tiles),
                                       manual_index, manual_size, _merged_md(b, a))


def _merged_md(dst: HloSharding, src: HloSharding) -> tuple[OpMetadata, ...]:
    md = list(dst.metadata)
    md.extend(m for m in src.metadata if m not in md)
    return tuple(md)


def is_finer(a: HloSharding, b: HloSharding) -> bool:
    """True if ``a`` is strictly more specific than ``b`` (XLA's IsShardingMoreSpecific).

    Tiled beats fewer tiles; any tiling beats maximal; anything but
    replicated beats replicated; manual beats tile-maximal only.  Tuples:
    no element worse and at least one better.
    """
    if a.is_tuple != b.is_tuple:
        raise ShardingError(f"cannot compare tuple and non-tuple shardings: {a} vs {b}")
    if a.is_tuple:
        if len(a.tuple_elements) != len(b.tuple_elements):
            raise ShardingError(f"tuple shardings of different lengths: {a} vs {b}")
        better = False
        for x, y in zip(a.tuple_elements, b.tuple_elements):
            if is_finer(y, x):
                return False
            better |= is_finer(x, y)
        return better
    if a.is_manual and b.is_tile_maximal:
        return True
    if a.is_manual or b.is_manual:
        return False
    if a.is_unknown:
        return False
    if b.is_unknown:
        return not a.is_unknown
    if not b.is_tile_maximal:
        return a.num_tiles > b.num_tiles
    if not b.is_replicated:
        return not a.is_tile_maximal
    return not a.is_replicated


def merge_if_compatible(to_merge: HloSharding, dst: HloSharding,
                        minimum_tiles: int | None = None) -> HloSharding | None:
    """XLA's MergeShardingIfCompatible: ``to_merge`` merged into ``dst``, or None.

    merge_compatible under XLA's preconditions: leaves only and never manual; a
    tile-maximal ``to_merge`` never merges and a tile-maximal ``dst`` is simply
    replaced; otherwise ``dst`` must be partially replicated and the result needs
    ``minimum_tiles`` tiles (default: one more than ``dst`` has).
    """
    if to_merge.is_tuple or dst.is_tuple or to_merge.is_manual or dst.is_manual:
        return None
    if to_merge.is_tile_maximal:
        return None
    if dst.is_tile_maximal:
        return to_merge
    if not dst.has_partial_replication:
        return None
    return merge_compatible(to_merge, dst,
                            dst.num_tiles + 1 if minimum_tiles is None else minimum_tiles)


def merge_sharding(to_merge: HloSharding, dst: HloSharding,
                   may_combine_partial_sharding: bool = True) -> tuple[bool, HloSharding]:
    """XLA's MergeSharding: (whether the new ``dst`` improves on ``to_merge``, new ``dst``).

    ``to_merge`` is the current sharding, ``dst`` the candidate.  Two partially
    replicated leaves over as many devices first try to combine into a strictly finer
    sharding (accepted, the combination); else ``dst`` comes back unchanged, accepted
    when strictly finer than ``to_merge`` (is_finer).  Tuples go leaf by leaf and are
    accepted when any leaf is, with every leaf of the candidate (as XLA does).
    """
    if to_merge.is_tuple:
        if not dst.is_tuple or len(to_merge.tuple_elements) != len(dst.tuple_elements):
            raise ShardingError(f"tuple arity mismatch: {to_merge} vs {dst}")
        changed = False
        out: list[HloSharding] = []
        for m, d in zip(to_merge.tuple_elements, dst.tuple_elements):
            ok, new = merge_sharding(m, d, may_combine_partial_sharding)
            changed |= ok
            out.append(new)
        return changed, HloSharding.tuple(out)
    ok, merged = _merge_leaf(to_merge, dst, bool(may_combine_partial_sharding))
    return ok, dst if merged is None else merged


@memoised
def _merge_leaf(to_merge: HloSharding, dst: HloSharding,
                may_combine_partial_sharding: bool) -> tuple[bool, HloSharding | None]:
    """``merge_sharding`` of two leaves (None: ``dst`` itself, returned by the caller so
    that the very object passed in comes back); memoised, as the repeated layers of a
    model merge the same pairs."""
    if (may_combine_partial_sharding and to_merge.has_partial_replication
            and dst.has_partial_replication and to_merge.num_devices == dst.num_devices):
        merged = merge_if_compatible(to_merge, dst, max(to_merge.num_tiles, dst.num_tiles) + 1)
        if merged is not None:
            return True, merged
    return is_finer(dst, to_merge), None


def improve_sharding(existing: HloSharding | None, candidate: HloSharding,
                     may_combine_partial_sharding: bool = True) -> HloSharding | None:
    """The sharding to adopt, or None to keep ``existing``.

    merge_sharding, except that a tuple keeps its existing leaves where the
    candidate's are no improvement: never a coarser or incomparable sharding.
    """
    if existing is None:
        return candidate
    if candidate.is_tuple:
        if not existing.is_tuple or len(existing.tuple_elements) != len(candidate.tuple_elements):
            raise ShardingError(f"tuple arity mismatch: {existing} vs {candidate}")
        out: list[HloSharding] = []
        changed = False
        for e, c in zip(existing.tuple_elements, candidate.tuple_elements):
            ok, new = merge_sharding(e, c, may_combine_partial_sharding)
            changed |= ok
            out.append(new if ok else e)
        return HloSharding.tuple(out) if changed else None
    ok, new = merge_sharding(existing, candidate, may_combine_partial_sharding)
    return new if ok else None


def is_spatially_partitioned(sharding: HloSharding | None) -> bool:
    """XLA's IsSpatiallyPartitioned: anything but single-device (tuples: any leaf; None: no)."""
    if sharding is None:
        return False
    kind = sharding.kind   # (asked per rule run: the kind is read once)
    if kind == "tuple":
        return any(is_spatially_partitioned(e) for e in sharding.tuple_elements)
    # A leaf: not tile-maximal, or replicated; i.e. anything but maximal.
    return kind != "maximal"


@memoised
def is_subtiling(a: HloSharding, b: HloSharding, dims: Sequence[int]) -> bool:
    """True if every device's real elements under ``a`` lie within those under ``b``.

    XLA's IsSubTilingOrEqualSharding on every input where XLA's answer is right:
    manual shardings never compare, nor do shardings of other ranks than ``dims``.
    Shards that are all padding hold nothing, so they lie within anything (XLA
    compares their padded offsets), and a last, partly padded shard of ``a`` must lie
    within ``b``'s shard too (XLA skips that check).
    """
    _require_leaf(a, "is_subtiling")
    _require_leaf(b, "is_subtiling")
    if a.is_manual or b.is_manual:
        return False
    if b.is_tile_maximal:
        return True
    if a.is_tile_maximal:
        return False
    if any(s.is_tiled and s.tiled_data_rank != len(dims) for s in (a, b)):
        return False
    total = max(_total_devices(a, None), _total_devices(b, None))
    ba = shard_bounds(a, dims, total)
    bb = shard_bounds(b, dims, total)
    empty = np.any(ba[:, :, 0] >= ba[:, :, 1], axis=1)
    inside = np.all((ba[:, :, 0] >= bb[:, :, 0]) & (ba[:, :, 1] <= bb[:, :, 1]), axis=1)
    return bool(np.all(empty | inside))
