"""Global arrays <-> per-device pieces, by sharding.

Geometry comes from the project's sharding algebra
(:func:`hlo_spmd.sharding.shard_bounds`, :func:`hlo_spmd.sharding.tile_shape`); jaxlib
is not used here. Conventions (XLA's): a device's shard is ``ceil(dim / tiles)`` long
along each tiled dim, its real elements start at ``tile_index * ceil(dim / tiles)``,
uneven shards are padded at the END, and a shard may be all padding. Pieces and results
are indexed by device id ``0..num_devices-1``.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from hlo_spmd.errors import HloSpmdError, ShardingError
from hlo_spmd.sharding import HloSharding, from_proto, parse_sharding, shard_bounds, tile_shape
from hlo_spmd.sharding import to_proto as _to_proto
from hlo_spmd.sharding.hlo_sharding import ShardingType
from hlo_spmd.sharding.unreduced import is_unreduced, reduced

ShardingLike = Any  # HloSharding | str (XLA text) | OpSharding message | its bytes


def as_sharding(sharding: ShardingLike) -> HloSharding:
    """The project's :class:`HloSharding` from a sharding, its XLA text, or an OpSharding.

    OpSharding messages may be the project's (``xla_data_pb2``) or jaxlib's; serialized
    OpSharding bytes work too.
    """
    if isinstance(sharding, HloSharding):
        return sharding
    if isinstance(sharding, str):
        return parse_sharding(sharding)
    if isinstance(sharding, (bytes, bytearray)) or hasattr(sharding, "SerializeToString"):
        return from_proto(sharding)
    raise HloSpmdError(f"not a sharding: {sharding!r}")


def to_op_sharding(sharding: ShardingLike):
    """``xla_data_pb2.OpSharding`` message for any :func:`as_sharding` input."""
    return _to_proto(as_sharding(sharding))


def tuple_leaves(sharding: ShardingLike) -> list[HloSharding] | None:
    """The element shardings of a tuple sharding, or None for a leaf sharding."""
    s = as_sharding(sharding)
    return list(s.tuple_elements) if s.is_tuple else None


def describe(sharding: ShardingLike) -> str:
    """XLA text of a sharding (for messages)."""
    return str(as_sharding(sharding))


def _leaf_for_layout(sharding: ShardingLike) -> HloSharding:
    s = as_sharding(sharding)
    if s.is_tuple:
        raise ShardingError(f"a tuple sharding {s} does not describe one array")
    if s.is_manual or s.is_manual_subgroup:
        raise ShardingError(
            f"{s} has no global layout: give the GLOBAL sharding of the value "
            "(manual subgroups are not supported by the runtime)")
    if s.is_unknown or s.is_unreduced:
        raise ShardingError(f"{s} has no global layout")
    return s


def device_bounds(sharding: ShardingLike, dims: Sequence[int], num_devices: int) -> np.ndarray:
    """``[num_devices, rank, 2]``: each device's real ``[start, limit)`` per dim."""
    return shard_bounds(_leaf_for_layout(sharding), dims, num_devices)


def padded_shape(sharding: ShardingLike, dims: Sequence[int]) -> tuple[int, ...]:
    """Per-device (padded) shape: ``ceil(dim / tiles)`` per dim."""
    return tuple(tile_shape(_leaf_for_layout(sharding), dims))


def data_holders(sharding: ShardingLike, num_devices: int) -> list[int]:
    """Devices whose piece carries data: all, except for a maximal sharding (its device)."""
    s = _leaf_for_layout(sharding)
    if s.is_maximal:
        if s.device is None or s.device >= num_devices:
            raise ShardingError(f"{s} names a device outside 0..{num_devices - 1}")
        return [int(s.device)]
    return list(range(num_devices))


def global_shape_if_even(sharding: ShardingLike, per_device_shape: Sequence[int]
                         ) -> tuple[int, ...]:
    """Global shape assuming every shard is full: per-device dim x tiles along it."""
    s = as_sharding(sharding)
    if is_unreduced(s):
        s = reduced(s)
    s = _leaf_for_layout(s)
    tiles = s.tile_dims_for_data(rank=len(per_device_shape))
    return tuple(int(d) * int(t) for d, t in zip(per_device_shape, tiles))


def poison_value(dtype: np.dtype):
    """Fill value for padding in poison mode: NaN for floats, a large value otherwise."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return True
    if dtype.kind in "fc":
        return np.nan
    try:
        import ml_dtypes

        ml_dtypes.finfo(dtype)
        return np.nan
    except Exception:
        pass
    if dtype.kind in "iu":
        return np.iinfo(dtype).max
    try:
        import ml_dtypes

        return ml_dtypes.iinfo(dtype).max
    except Exception:  # pragma: no cover
        return 0


class OutputLayoutError(HloSpmdError):
    """A per-device result does not have the shape its sharding implies."""


def shard_pieces(array: np.ndarray, sharding: ShardingLike, num_devices: int,
                 pad_value: Any = 0) -> list[np.ndarray]:
    """Per-device pieces of a global ``array`` (index = device id, 0..num_devices-1).

    Every piece has the padded per-device shape ``ceil(dim / tiles)``; a device's real
    data sits at the start and the rest (uneven tail, or all of an empty shard) is filled
    with ``pad_value``. Devices that hold no data (a maximal sharding's other devices)
    get a piece of ``pad_value`` as well.
    """
    array = np.asarray(array)
    s = as_sharding(sharding)
    if is_unreduced(s):
        return _partial_sum_pieces(array, s, num_devices, pad_value)
    dims = array.shape
    bounds = device_bounds(sharding, dims, num_devices)
    shape = padded_shape(sharding, dims)
    holders = set(data_holders(sharding, num_devices))
    pieces = []
    for d in range(num_devices):
        piece = np.full(shape, pad_value, dtype=array.dtype)
        if d not in holders:
            pieces.append(piece)
            continue
        region = tuple(slice(int(lo), int(hi)) for lo, hi in bounds[d])
        local = tuple(slice(0, int(hi - lo)) for lo, hi in bounds[d])
        piece[local] = array[region]
        pieces.append(piece)
    return pieces


def _close_mask(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> np.ndarray:
    """Elementwise agreement of two replicas (:func:`~hlo_spmd.runtime.compare.close_mask`)."""
    from hlo_spmd.runtime.compare import Tolerance, close_mask

    return close_mask(a, b, Tolerance(rtol, 0.0, atol))


def _unreduced_groups(s: HloSharding, n: int) -> np.ndarray:
    """``[groups, members]``: the devices whose pieces are partial sums of one tile."""
    if s.is_unreduced:
        return np.arange(n).reshape(1, n)
    ta = s.tile_assignment
    u = s.subgroup_dim(ShardingType.UNREDUCED)
    return np.moveaxis(ta.array(), u, -1).reshape(-1, ta.dims[u])


def _partial_sum_pieces(array: np.ndarray, s: HloSharding, num_devices: int,
                        pad_value: Any) -> list[np.ndarray]:
    """Pieces of an unreduced value: the devices of one unreduced group hold partial sums
    that add up to their tile of ``array`` (XLA's meaning of an unreduced parameter).

    Floating values are split with unequal weights (member k of a group of m holds
    ``(k + 1) / (m (m + 1) / 2)`` of the tile), so a program that reads one member's
    piece as the whole value, or adds the pieces twice, is caught; other types put the
    whole tile on the group's first member and zeros on the rest. Padding keeps
    ``pad_value`` on every member."""
    pieces = shard_pieces(array, reduced(s), num_devices, pad_value)
    groups = _unreduced_groups(s, num_devices)
    m = groups.shape[1]
    floating = array.dtype.kind in "fc" or array.dtype.name in ("bfloat16",) or \
        array.dtype.name.startswith("float8")
    bounds = device_bounds(reduced(s), array.shape, num_devices)
    out = list(pieces)
    for g in groups:
        for k, d in enumerate(g):
            d = int(d)
            piece = np.array(pieces[d], copy=True)
            local = tuple(slice(0, int(hi - lo)) for lo, hi in bounds[d])
            if floating:
                w = (k + 1) / (m * (m + 1) / 2)
                piece[local] = (piece[local].astype(np.float64) * w).astype(piece.dtype)
            elif k:
                piece[local] = np.zeros_like(piece[local])
            out[d] = piece
    return out


def _sum_partial_sums(pieces: Sequence[np.ndarray], s: HloSharding,
                      rank: int) -> list[np.ndarray]:
    """Each device's piece replaced by the sum over its unreduced group."""
    groups = _unreduced_groups(s, len(pieces))
    out = list(pieces)
    for g in groups:
        total = np.sum([np.asarray(pieces[int(d)]) for d in g], axis=0,
                       dtype=np.asarray(pieces[int(g[0])]).dtype)
        for d in g:
            out[int(d)] = total
    return out


def assemble_checked(pieces: Sequence[np.ndarray], sharding: ShardingLike,
                     global_shape: Sequence[int], *, rtol: float = 1e-5,
                     atol: float = 1e-6) -> tuple[np.ndarray, list[str]]:
    """Global array from per-device pieces, plus a list of replica disagreements.

    Each device's real (unpadded) part is placed at its offset. Devices holding the same
    region (replicated, partially replicated) must agree within ``rtol`` / ``atol``
    (exactly for integers and bool; NaN agrees with NaN); the lowest device id wins.
    """
    if not pieces:
        raise HloSpmdError("no per-device pieces to assemble")
    dims = tuple(int(d) for d in global_shape)
    num_devices = len(pieces)
    s = as_sharding(sharding)
    if is_unreduced(s):
        pieces, sharding = _sum_partial_sums(pieces, s, len(dims)), reduced(s)
    bounds = device_bounds(sharding, dims, num_devices)
    shape = padded_shape(sharding, dims)
    problems: list[str] = []
    out = np.zeros(dims, dtype=np.asarray(pieces[0]).dtype)
    owner: dict[tuple, int] = {}
    holders = set(data_holders(sharding, num_devices))
    covered = np.zeros(dims, dtype=bool)
    for d, piece in enumerate(pieces):
        piece = np.asarray(piece)
        if tuple(piece.shape) != shape:
            raise OutputLayoutError(
                f"device {d} returned shape {list(piece.shape)}, but sharding "
                f"{describe(sharding)} of global shape {list(dims)} needs {list(shape)}"
            )
        key = tuple(map(tuple, bounds[d].tolist()))
        if d not in holders or any(lo >= hi for lo, hi in key):
            continue  # holds nothing
        region = tuple(slice(lo, hi) for lo, hi in key)
        local = piece[tuple(slice(0, hi - lo) for lo, hi in key)]
        if key in owner:
            same = _close_mask(out[region], local, rtol, atol)
            if not same.all():
                at = [int(i) for i in np.argwhere(~same)[0]]
                problems.append(
                    f"device {d} disagrees with device {owner[key]} on their common "
                    f"region {[list(b) for b in key]} (first difference at local "
                    f"index {at}: {local[tuple(at)]!s} vs {out[region][tuple(at)]!s})"
                )
            continue
        owner[key] = d
        out[region] = local
        covered[region] = True
    if not covered.all():
        problems.append(f"sharding {describe(sharding)} leaves part of the output uncovered")
    return out, problems


def assemble(pieces: Sequence[np.ndarray], sharding: ShardingLike, global_shape: Sequence[int],
             **tolerances: float) -> np.ndarray:
    """Like :func:`assemble_checked`, but raise :class:`HloSpmdError` if replicas disagree."""
    out, problems = assemble_checked(pieces, sharding, global_shape, **tolerances)
    if problems:
        raise HloSpmdError("; ".join(problems))
    return out

