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
value; results are re-compacted to iota form when possible, so they may print
more compactly than XLA would print the same value.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from hlo_spmd.errors import ShardingError
from hlo_spmd.sharding.hlo_sharding import HloSharding, ShardingType
from hlo_spmd.sharding.metadata import OpMetadata
from hlo_spmd.sharding.tile_assignment import TileAssignment

__all__ = [
    "tile_shape", "tile_coords", "shard_bounds", "device_offsets", "partial_replicate",
    "partial_replicate_all_except", "replicate_all_data_dims", "transpose_sharding",
    "reshape_sharding", "propagate_through_reshape", "reverse_sharding", "merge_compatible",
    "is_finer", "improve_sharding", "is_spatially_partitioned", "is_subtiling", "compact",
    "sharding_from_tile_indices",
]


# -- small helpers ------------------------------------------------------------
def compact(sharding: HloSharding) -> HloSharding:
    """Same value with explicit tile arrays turned into iota form where possible."""
    if sharding.is_tuple:
        return HloSharding.tuple(compact(e) for e in sharding.tuple_elements)
    ta = sharding.tile_assignment
    if ta is None or ta.is_iota:
        return sharding
    c = ta.compact()
    return sharding if c is ta else sharding._replace(tile=c)


def _require_leaf(sharding: HloSharding, what: str) -> None:
    if sharding.is_tuple:
        raise ShardingError(f"{what} needs a non-tuple sharding, got {sharding}")


def _check_rank(sharding: HloSharding, dims: Sequence[int]) -> tuple[int, ...]:
    dims_t = tuple(int(d) for d in dims)
    if sharding.is_tiled and sharding.tiled_data_rank != len(dims_t):
        raise ShardingError(
            f"sharding {sharding} tiles {sharding.tiled_data_rank} dims but the shape "
            f"{list(dims_t)} has rank {len(dims_t)}")
    return dims_t


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
    n = ta.num_devices
    coords = np.stack(np.unravel_index(np.arange(n, dtype=np.int64), ta.dims), axis=1) \
        if ta.ndim else np.zeros((n, 0), np.int64)
    return ta.flat(), coords.astype(np.int64, copy=False)


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
def transpose_sharding(sharding: HloSharding, perm: Sequence[int]) -> HloSharding:
    """Sharding of ``transpose(x, perm)`` given x's sharding (XLA's TransposeSharding).

    ``perm`` covers the data dims (subgroup dims stay put) or all tile dims.
    """
    _require_leaf(sharding, "transpose_sharding")
    if not sharding.is_tiled:
        return sharding
    ta = sharding.tile_assignment
    r = sharding.tiled_data_rank
    assert ta is not None and r is not None
    p = [int(x) for x in perm]
    if len(p) == r:
        if sorted(p) != list(range(r)):
            raise ShardingError(f"{p} is not a permutation of {r} dims")
        p += list(range(r, ta.ndim))
    elif len(p) != ta.ndim:
        raise ShardingError(f"perm {p} fits neither the {r} data dims nor the {ta.ndim} tile dims")
    new_ta = ta.transpose(p)
    if sharding.replicate_on_last_tile_dim:
        res = HloSharding._partial_tile(new_ta, sharding.metadata)
    else:
        types = tuple(sharding.subgroup_types[i - r] for i in p[r:])
        res = HloSharding._subgroup_impl(new_ta, types, sharding.metadata)
    return compact(res)


def partial_replicate(sharding: HloSharding, dims_to_replicate: Sequence[int]) -> HloSharding:
    """Stop tiling the given data dims; their devices join the replication group.

    XLA's PartiallyReplicateTiledShardingOnDims.  Dims outside the data rank
    are ignored; untiled shardings come back unchanged.
    """
    _require_leaf(sharding, "partial_replicate")
    if not sharding.is_tiled:
        return sharding
    ta = sharding.tile_assignment
    r = sharding.tiled_data_rank
    assert ta is not None and r is not None
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
    _require_leaf(sharding, "partial_replicate_all_except")
    if not sharding.is_tiled:
        return sharding
    r = sharding.tiled_data_rank
    assert r is not None
    keep = {int(d) for d in dims_to_keep}
    return partial_replicate(sharding, [d for d in range(r) if d not in keep])


def replicate_all_data_dims(sharding: HloSharding) -> HloSharding:
    """Replicate all data, keeping manual (and other non-replicated) subgroups."""
    _require_leaf(sharding, "replicate_all_data_dims")
    if sharding.is_manual:
        return sharding
    if not sharding.subgroup_types:
        return HloSharding.replicate(sharding.metadata)
    return partial_replicate_all_except(sharding, ())


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
    new_ta = TileAssignment.from_array(arr)
    if sharding.replicate_on_last_tile_dim:
        res = HloSharding._partial_tile(new_ta, sharding.metadata)
    else:
        res = HloSharding._subgroup_impl(new_ta, sharding.subgroup_types, sharding.metadata)
    return compact(res)


def reshape_sharding(sharding: HloSharding, in_dims: Sequence[int],
                     out_dims: Sequence[int]) -> HloSharding | None:
    """Sharding of ``reshape(x, out_dims)`` keeping every device's elements, or None.

    Follows XLA's ReshapeSharding rules: add/remove size-1 dims, split a dim
    into consecutive dims, merge consecutive dims where only the most major is
    sharded (or minor shards are whole elements), reshape unsharded dims
    freely.  A size-1 dim that is tiled (all but one shard are padding) is
    replicated first, which is the one place the result holds more than the
    input.  None when the element blocks cannot be expressed as a tiling of
    ``out_dims``.
    """
    _require_leaf(sharding, "reshape_sharding")
    src = tuple(int(d) for d in in_dims)
    tgt = tuple(int(d) for d in out_dims)
    if math.prod(src) != math.prod(tgt):
        raise ShardingError(f"cannot reshape {list(src)} to {list(tgt)}: element counts differ")
    if not sharding.is_tiled:
        return sharding
    _check_rank(sharding, src)
    tiles = sharding.tile_dims_for_data()
    ones = [i for i, (d, t) in enumerate(zip(src, tiles)) if d == 1 and t > 1]
    if ones:
        sharding = partial_replicate(sharding, ones)
        if not sharding.is_tiled:
            return sharding
        tiles = sharding.tile_dims_for_data()
    ta = sharding.tile_assignment
    r = sharding.tiled_data_rank
    assert ta is not None and r is not None
    # Stacks hold dims minor-last so pop() yields the most major remaining dim.
    s_stack = list(reversed(src))
    p_stack = list(reversed(tiles))
    t_stack = list(reversed(tgt))
    out_tiles: list[int] = []
    inplace = False

    def append(size: int) -> None:
        nonlocal inplace
        if inplace:
            out_tiles[-1] *= size
        else:
            out_tiles.append(size)
        inplace = False

    while s_stack or t_stack:
        if not t_stack:
            if math.prod(p_stack) != 1:
                return None
            break
        s_size, s_parts = 1, 1
        if s_stack:
            s_size = s_stack.pop()
            s_parts = p_stack.pop()
        t_size = t_stack.pop()
        if s_parts * math.prod(p_stack) == 1:
            append(1)  # nothing sharded remains: the rest reshapes freely
            continue
        if s_parts > 1 and s_size % s_parts == 0 and t_size % s_parts == 0:
            # Peel the partitions off both dims and continue on shard-sized dims.
            s_stack.append(s_size // s_parts)
            t_stack.append(t_size // s_parts)
            p_stack.append(1)
            append(s_parts)
            inplace = True
            continue
        if s_size == t_size:
            if inplace and s_size % s_parts:
                # This dim is the minor part of a target dim already split by a
                # major source dim; uneven shards here would not be contiguous
                # tiles of the target dim (XLA's ReshapeSharding misses this).
                return None
            append(s_parts)
        elif t_size == 1:
            append(1)
            s_stack.append(s_size)
            p_stack.append(s_parts)
        elif s_size == 1:
            t_stack.append(t_size)  # s_parts == 1 here: tiled size-1 dims were replicated
        elif s_size > t_size:
            if s_size % t_size or s_size % s_parts:
                return None
            if t_size % s_parts == 0:
                append(s_parts)
                s_stack.append(s_size // t_size)
                p_stack.append(1)
            elif s_parts % t_size == 0:
                append(t_size)
                s_stack.append(s_size // t_size)
                p_stack.append(s_parts // t_size)
            else:
                return None
        else:
            # Merge with the next source dim; only contiguous blocks survive.
            if s_size % s_parts:
                return None
            if not s_stack:
                return None
            if p_stack[-1] != 1 and s_size != s_parts:
                return None
            s_stack[-1] *= s_size
            p_stack[-1] *= s_parts
            t_stack.append(t_size)
    if len(out_tiles) != len(tgt):
        return None
    new_dims = out_tiles + list(ta.dims[r:])
    new_ta = ta.reshape(new_dims)
    if sharding.replicate_on_last_tile_dim:
        res = HloSharding._partial_tile(new_ta, sharding.metadata)
    else:
        res = HloSharding._subgroup_impl(new_ta, sharding.subgroup_types, sharding.metadata)
    return compact(res)


def propagate_through_reshape(sharding: HloSharding, in_dims: Sequence[int],
                              out_dims: Sequence[int]) -> HloSharding:
    """Best sharding for ``reshape(x, out_dims)`` that never needs data movement.

    XLA's PropagateShardingThroughReshape: try runs of consecutive source dims
    (longest first), reshape the sharding restricted to that run, and merge
    every compatible result.  Always returns a sharding (replicated at worst);
    every device's holder set contains its source holder set.
    """
    _require_leaf(sharding, "propagate_through_reshape")
    if not sharding.is_tiled:
        return sharding
    whole = reshape_sharding(sharding, in_dims, out_dims)
    if whole is not None:
        return whole
    src = tuple(int(d) for d in in_dims)
    result = replicate_all_data_dims(sharding)
    if result.is_tiled and result.tiled_data_rank != len(tuple(out_dims)):
        # Re-rank the subgroup-only sharding for the output shape.
        ta = result.tile_assignment
        assert ta is not None
        nsub = result.num_subgroup_dims
        result = HloSharding._subgroup_impl(
            ta.reshape((1,) * len(tuple(out_dims)) + ta.dims[ta.ndim - nsub:]),
            (ShardingType.REPLICATED,) if result.replicate_on_last_tile_dim
            else result.subgroup_types, sharding.metadata)
    start = 0
    while start < len(src):
        found = False
        for end in range(len(src), start, -1):
            part = partial_replicate_all_except(sharding, range(start, end))
            if not part.is_tiled or part.num_tiles == 1:
                continue
            reshaped = reshape_sharding(part, src, out_dims)
            if reshaped is None or not reshaped.is_tiled:
                continue
            merged = merge_compatible(reshaped, result, minimum_tiles=result.num_tiles + 1)
            if merged is not None:
                result = merged
                start = end
                found = True
                break
        if not found:
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
    devices = np.asarray(devices, dtype=np.int64)
    n = devices.size
    tiles = tuple(int(t) for t in data_tiles)
    n_tiles = math.prod(tiles) * manual_size
    if n_tiles == 0 or n % n_tiles:
        return None
    key = np.ravel_multi_index(tuple(np.asarray(data_index, np.int64).T), tiles) \
        if tiles else np.zeros(n, np.int64)
    if manual_index is not None and manual_size > 1:
        key = key * manual_size + np.asarray(manual_index, np.int64)
    reps = n // n_tiles
    counts = np.bincount(key, minlength=n_tiles)
    if counts.size != n_tiles or np.any(counts != reps):
        return None
    order = np.lexsort((devices, key))
    dims = list(tiles) + ([manual_size] if manual_size > 1 else []) + [reps]
    ta = TileAssignment.from_array(devices[order].reshape(dims)).compact()
    types = ([ShardingType.MANUAL] if manual_size > 1 else []) + [ShardingType.REPLICATED]
    return compact(HloSharding._subgroup_impl(ta, tuple(types), tuple(metadata)))


def _indices_by_device(s: HloSharding, total: int) -> tuple[np.ndarray, np.ndarray]:
    """(tile coords [total, ndim] by device id, present mask [total])."""
    devices, coords = tile_coords(s)
    out = np.full((total, coords.shape[1]), -1, dtype=np.int64)
    out[devices] = coords
    present = np.zeros(total, dtype=bool)
    present[devices] = True
    return out, present


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
    total = max(_total_devices(a, None), _total_devices(b, None))
    ia, pa = _indices_by_device(a, total)
    ib, pb = _indices_by_device(b, total)
    if not np.array_equal(pa, pb):
        return None  # different device sets
    devs = np.nonzero(pa)[0]
    ca, cb = ia[devs], ib[devs]
    both = (da > 1) & (db > 1)
    if np.any((ca[:, :ra] != cb[:, :ra])[:, both]):
        return None
    data_index = np.where(da > 1, ca[:, :ra], cb[:, :ra])
    manual_index = None
    if ma is not None and mb is not None:
        if not np.array_equal(ca[:, ma], cb[:, mb]):
            return None
        manual_index = ca[:, ma]
    return sharding_from_tile_indices(devs, data_index, merged_tiles.tolist(), manual_index,
                                      manual_size, _merged_md(b, a))


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


def improve_sharding(existing: HloSharding | None, candidate: HloSharding,
                     may_combine_partial_sharding: bool = True) -> HloSharding | None:
    """The sharding to adopt, or None to keep ``existing`` (XLA's MergeSharding).

    Propagation never replaces a sharding by a coarser or incomparable one: it
    first tries to merge two partially replicated shardings into a strictly
    finer one, else takes ``candidate`` only if it is strictly finer.
    """
    if existing is None:
        return candidate
    if candidate.is_tuple:
        if not existing.is_tuple or len(existing.tuple_elements) != len(candidate.tuple_elements):
            raise ShardingError(f"tuple arity mismatch: {existing} vs {candidate}")
        out: list[HloSharding] = []
        changed = False
        for e, c in zip(existing.tuple_elements, candidate.tuple_elements):
            r = improve_sharding(e, c, may_combine_partial_sharding)
            changed |= r is not None
            out.append(e if r is None else r)
        return HloSharding.tuple(out) if changed else None
    if (may_combine_partial_sharding and existing.has_partial_replication
            and candidate.has_partial_replication
            and existing.num_devices == candidate.num_devices):
        merged = merge_compatible(candidate, existing,
                                  max(existing.num_tiles, candidate.num_tiles) + 1)
        if merged is not None:
            return merged
    return candidate if is_finer(candidate, existing) else None


def is_spatially_partitioned(sharding: HloSharding) -> bool:
    """Partitioned in the SPMD sense: anything but single-device (tuples: any leaf)."""
    if sharding.is_tuple:
        return any(is_spatially_partitioned(e) for e in sharding.tuple_elements)
    return not sharding.is_tile_maximal or sharding.is_replicated


def is_subtiling(a: HloSharding, b: HloSharding, dims: Sequence[int]) -> bool:
    """True if every device's real elements under ``a`` lie within those under ``b``.

    Manual shardings never compare (XLA's IsSubTilingOrEqualSharding).
    """
    _require_leaf(a, "is_subtiling")
    _require_leaf(b, "is_subtiling")
    if a.is_manual or b.is_manual:
        return False
    if b.is_tile_maximal:
        return True
    if a.is_tile_maximal:
        return False
    total = max(_total_devices(a, None), _total_devices(b, None))
    ba = shard_bounds(a, dims, total)
    bb = shard_bounds(b, dims, total)
    empty = np.any(ba[:, :, 0] >= ba[:, :, 1], axis=1)
    inside = np.all((ba[:, :, 0] >= bb[:, :, 0]) & (ba[:, :, 1] <= bb[:, :, 1]), axis=1)
    return bool(np.all(empty | inside))
