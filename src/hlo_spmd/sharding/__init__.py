"""Sharding value type, XLA text/proto forms, mesh helpers and sharding algebra.

Modules: ``tile_assignment`` (device arrays, iota form), ``hlo_sharding`` (the
value type), ``metadata``, ``text`` (XLA text form), ``proto`` (OpSharding),
``mesh`` (mesh_split / named_split), ``algebra`` (shard geometry and
sharding-to-sharding maps), ``grouping`` (device groups, replica groups), ``common``
(what both use: ``memoised``, ``compact``).
"""
from hlo_spmd.sharding.algebra import (device_offsets, improve_sharding, is_finer,
                                       is_spatially_partitioned, is_subtiling, merge_compatible,
                                       merge_if_compatible, merge_sharding, partial_replicate,
                                       partial_replicate_all_except, propagate_through_reshape,
                                       replicate_all_data_dims, reshape_sharding,
                                       reverse_sharding, shard_bounds,
                                       sharding_from_tile_indices, tile_coords, tile_shape,
                                       transpose_sharding, with_tile_assignment)
from hlo_spmd.sharding.common import compact
from hlo_spmd.sharding.grouping import (GroupedSharding, group_by_all_dims_except,
                                        group_by_dims, iota_replica_groups, ungroup)
from hlo_spmd.sharding.hlo_sharding import HloSharding, ShardGroup, ShardingType
from hlo_spmd.sharding.mesh import mesh_split, named_split
from hlo_spmd.sharding.metadata import OpMetadata
from hlo_spmd.sharding.proto import from_proto, to_proto
from hlo_spmd.sharding.text import parse_metadata, parse_sharding
from hlo_spmd.sharding.tile_assignment import TileAssignment, canonicalize_iota, iota_form

__all__ = [
    "HloSharding", "ShardGroup", "ShardingType", "OpMetadata", "TileAssignment",
    "canonicalize_iota", "iota_form", "parse_sharding", "parse_metadata", "to_proto",
    "from_proto", "mesh_split", "named_split", "tile_shape", "tile_coords", "shard_bounds",
    "device_offsets", "partial_replicate", "partial_replicate_all_except",
    "replicate_all_data_dims", "transpose_sharding", "reshape_sharding",
    "propagate_through_reshape", "reverse_sharding", "merge_compatible", "merge_if_compatible",
    "merge_sharding", "is_finer", "improve_sharding", "is_spatially_partitioned", "is_subtiling",
    "compact", "sharding_from_tile_indices", "with_tile_assignment", "GroupedSharding",
    "group_by_dims",
    "group_by_all_dims_except", "ungroup", "iota_replica_groups",
]
