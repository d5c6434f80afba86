"""Shardings from a device mesh: GSPMD's ``mesh_split`` and a JAX-style named form.

``mesh_split(rank, mesh, dims_mapping)``: tensor dim ``i`` is split across mesh
axis ``dims_mapping[i]`` (-1 / None: not split; a tuple of axes splits it over
their product, major axis first).  Mesh axes no tensor dim uses replicate the
data (``last_tile_dim_replicate``), or make it manual if listed in
``manual_axes``.  The mesh is either a device-id array or just its shape
(devices 0..N-1 in row-major order), in which case the result stays in iota
form however many devices there are.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from hlo_spmd.errors import ShardingError
from hlo_spmd.sharding.common import compact
from hlo_spmd.sharding.device_ids import all_distinct
from hlo_spmd.sharding.hlo_sharding import HloSharding, ShardingType
from hlo_spmd.sharding.metadata import OpMetadata
from hlo_spmd.sharding.tile_assignment import TileAssignment

__all__ = ["mesh_split", "named_split"]

AxisSpec = int | Sequence[int] | None


def _mesh_assignment(mesh: np.ndarray | Sequence[int] | TileAssignment) -> TileAssignment:
    if isinstance(mesh, TileAssignment):
        return mesh
    if isinstance(mesh, np.ndarray):
        if mesh.ndim == 0:
            raise ShardingError("the device mesh needs at least one axis")
        ta = TileAssignment.from_array(mesh)
        flat = ta.flat()
        if not all_distinct(flat) or int(flat.min()) < 0:
            raise ShardingError("mesh device ids must be distinct and non-negative")
        return ta.compact()
    shape = tuple(int(d) for d in mesh)
    if not shape or any(d < 1 for d in shape):
        raise ShardingError(f"mesh shape {list(shape)} must be non-empty and positive")
    return TileAssignment(shape)


def mesh_split(rank: int, mesh: np.ndarray | Sequence[int] | TileAssignment,
               dims_mapping: Sequence[AxisSpec], manual_axes: Sequence[int] = (),
               metadata: Sequence[OpMetadata] = ()) -> HloSharding:
    """Sharding of a rank-``rank`` tensor split over ``mesh`` by ``dims_mapping``."""
    mta = _mesh_assignment(mesh)
    naxes = mta.ndim
    if len(dims_mapping) != rank:
        raise ShardingError(f"dims_mapping {list(dims_mapping)} has {len(dims_mapping)} entries "
                            f"for a rank-{rank} tensor")
    per_dim: list[list[int]] = []
    used: list[int] = []
    for i, spec in enumerate(dims_mapping):
        axes: list[int]
        if spec is None or (isinstance(spec, (int, np.integer)) and int(spec) == -1):
            axes = []
        elif isinstance(spec, (int, np.integer)):
            axes = [int(spec)]
        else:
            axes = [int(a) for a in spec]
        for a in axes:
            if not 0 <= a < naxes:
                raise ShardingError(f"tensor dim {i} maps to mesh axis {a}, mesh has {naxes} axes")
            if a in used:
                raise ShardingError(f"mesh axis {a} shards more than one tensor dim")
            used.append(a)
        per_dim.append(axes)
    manual = [int(a) for a in manual_axes]
    for a in manual:
        if not 0 <= a < naxes:
            raise ShardingError(f"manual mesh axis {a} out of range for {naxes} axes")
        if a in used:
            raise ShardingError(f"mesh axis {a} cannot both shard data and be manual")
    replicated = [a for a in range(naxes) if a not in used and a not in manual]
    perm = used + manual + replicated
    tile_dims = [math.prod(mta.dims[a] for a in axes) for axes in per_dim]
    types: list[ShardingType] = []
    if manual:
        tile_dims.append(math.prod(mta.dims[a] for a in manual))
        types.append(ShardingType.MANUAL)
    tile_dims.append(math.prod(mta.dims[a] for a in replicated))
    types.append(ShardingType.REPLICATED)
    ta = mta.transpose(perm).reshape(tile_dims)
    if ta.ndim == 1 and not manual:
        return HloSharding.replicate(metadata)  # rank-0 tensor, nothing to split
    return compact(HloSharding._subgroup_impl(ta, tuple(types), tuple(metadata)))


def named_split(rank: int, mesh_axes: Mapping[str, int] | Sequence[tuple[str, int]],
                spec: Sequence[str | Sequence[str] | None],
                devices: np.ndarray | None = None, manual_axes: Sequence[str] = (),
                metadata: Sequence[OpMetadata] = ()) -> HloSharding:
    """Like JAX's ``NamedSharding(Mesh(devices, names), PartitionSpec(*spec))``.

    ``spec`` may be shorter than ``rank`` (missing trailing dims are unsharded);
    an entry is None, an axis name, or a tuple of names (major first).
    ``devices`` defaults to ``arange(N)`` in the mesh shape.
    """
    items = list(mesh_axes.items()) if isinstance(mesh_axes, Mapping) else list(mesh_axes)
    names = [str(n) for n, _ in items]
    sizes = [int(s) for _, s in items]
    if len(set(names)) != len(names):
        raise ShardingError(f"duplicate mesh axis names in {names}")
    index = {n: i for i, n in enumerate(names)}
    if len(spec) > rank:
        raise ShardingError(f"spec {list(spec)} has more entries than the tensor rank {rank}")

    def axis(name: str) -> int:
        if name not in index:
            raise ShardingError(f"unknown mesh axis {name!r}; mesh axes are {names}")
        return index[name]

    mapping: list[AxisSpec] = []
    for entry in list(spec) + [None] * (rank - len(spec)):
        if entry is None:
            mapping.append(None)
        elif isinstance(entry, str):
            mapping.append(axis(entry))
        else:
            mapping.append([axis(n) for n in entry])
    if devices is None:
        mesh: np.ndarray | Sequence[int] = sizes
    else:
        mesh = np.asarray(devices)
        if list(mesh.shape) != sizes:
            raise ShardingError(f"devices shape {list(mesh.shape)} does not match mesh axes "
                                f"{dict(zip(names, sizes))}")
    return mesh_split(rank, mesh, mapping, [axis(n) for n in manual_axes], metadata)
