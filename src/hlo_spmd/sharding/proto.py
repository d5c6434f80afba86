"""``OpSharding`` proto conversion (xla_data.proto), following XLA's To/FromProto.

Iota tile assignments are written with ``iota_reshape_dims`` /
``iota_transpose_perm`` (compact for any device count), explicit ones with
``tile_assignment_devices``; both are read.  FromProto applies XLA's
canonicalisation (single device -> replicated, PartialTile / Subgroup rules).
Named shardings (``named_sharding``, field 14: NamedShardingProto) are read into
the same HloSharding (tile form + the named structure) and written back as
field 14 only, as XLA writes them.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from hlo_spmd.errors import ShardingError
from hlo_spmd.sharding.hlo_sharding import HloSharding, ShardGroup, ShardingType
from hlo_spmd.sharding.metadata import OpMetadata
from hlo_spmd.sharding.tile_assignment import TileAssignment

if TYPE_CHECKING:
    from hlo_spmd.proto.xla_data_pb2 import OpMetadata as OpMetadataProto
    from hlo_spmd.proto.xla_data_pb2 import OpSharding

__all__ = ["to_proto", "from_proto", "metadata_to_proto", "metadata_from_proto"]

_MD_FIELDS = ("op_type", "op_name", "source_file", "source_line", "source_end_line",
              "source_column", "source_end_column", "deduplicated_name", "scheduling_name",
              "stack_frame_id")


def _pb() -> Any:
    # Imported lazily: the generated module is large and optional for text-only use.
    from hlo_spmd.proto import xla_data_pb2
    return xla_data_pb2


def metadata_to_proto(md: OpMetadata) -> OpMetadataProto:
    pb = _pb()
    msg = pb.OpMetadata()
    if md.extra:
        msg.ParseFromString(md.extra)
    for f in _MD_FIELDS:
        v = getattr(md, f)
        if v:
            setattr(msg, f, v)
    if md.profile_type:
        msg.profile_type.extend(md.profile_type)
    return msg


def metadata_from_proto(msg: OpMetadataProto) -> OpMetadata:
    pb = _pb()
    rest = pb.OpMetadata()
    rest.CopyFrom(msg)
    for f in _MD_FIELDS:
        rest.ClearField(f)
    rest.ClearField("profile_type")
    return OpMetadata(**{f: getattr(msg, f) for f in _MD_FIELDS},
                      profile_type=tuple(int(x) for x in msg.profile_type),
                      extra=rest.SerializeToString(deterministic=True))


def to_proto(sharding: HloSharding) -> OpSharding:
    """``xla_data_pb2.OpSharding`` for ``sharding`` (field-for-field as XLA's ToProto)."""
    pb = _pb()
    msg = pb.OpSharding()
    if sharding.is_tuple:
        msg.type = pb.OpSharding.TUPLE
        for e in sharding.tuple_elements:
            msg.tuple_shardings.append(to_proto(e))
        return msg
    if sharding.named is not None and sharding.shard_group is None:
        from hlo_spmd.sharding.named import named_to_proto
        named_to_proto(sharding.named, msg.named_sharding)
        for m in sharding.metadata:
            msg.named_sharding.metadata.append(metadata_to_proto(m))
        return msg
    for m in sharding.metadata:
        msg.metadata.append(metadata_to_proto(m))
    kind = sharding.kind
    if kind == "tiled":
        ta = sharding.tile_assignment
        assert ta is not None
        msg.type = pb.OpSharding.OTHER
        if ta.is_iota:
            msg.iota_reshape_dims.extend(ta.reshape_dims or ())
            msg.iota_transpose_perm.extend(ta.transpose_perm or ())
        else:
            msg.tile_assignment_devices.extend(ta.flat().tolist())
        msg.tile_assignment_dimensions.extend(ta.dims)
        msg.replicate_on_last_tile_dim = sharding.replicate_on_last_tile_dim
        msg.last_tile_dims.extend(int(t) for t in sharding.subgroup_types)
    elif kind == "maximal":
        msg.type = pb.OpSharding.MAXIMAL
        msg.tile_assignment_devices.append(int(sharding.device or 0))
    else:
        msg.type = {"replicated": ShardingType.REPLICATED, "manual": ShardingType.MANUAL,
                    "unknown": ShardingType.UNKNOWN,
                    "unreduced": ShardingType.UNREDUCED}[kind].value
    g = sharding.shard_group
    if g is not None:
        msg.is_shard_group = True
        msg.shard_group_id = g.id
        msg.shard_group_type = pb.OpSharding.AS if g.shard_as else pb.OpSharding.LIKE
    return msg


def from_proto(msg: OpSharding | bytes | Any) -> HloSharding:
    """HloSharding from an OpSharding message (ours, jaxlib's, or its serialized bytes)."""
    pb = _pb()
    if isinstance(msg, (bytes, bytearray)):
        data = bytes(msg)
        msg = pb.OpSharding()
        msg.ParseFromString(data)
    elif not isinstance(msg, pb.OpSharding):
        data = msg.SerializeToString()
        msg = pb.OpSharding()
        msg.ParseFromString(data)
    if msg.HasField("named_sharding"):
        from hlo_spmd.sharding.named import named_from_proto
        nmsg = msg.named_sharding
        if len(nmsg.tuple_shardings):
            return HloSharding.tuple(_named_leaf(e) for e in nmsg.tuple_shardings)
        return _named_leaf(nmsg)
    group = ShardGroup(int(msg.shard_group_id), msg.shard_group_type == pb.OpSharding.AS) \
        if msg.is_shard_group else None
    s = _from_proto_leaf(msg, pb)
    return s.with_shard_group(group) if group is not None and not s.is_tuple else s


def _named_leaf(nmsg: Any) -> HloSharding:
    from hlo_spmd.sharding.named import named_from_proto
    return HloSharding.from_named(named_from_proto(nmsg),
                                  [metadata_from_proto(m) for m in nmsg.metadata])


def _from_proto_leaf(msg: Any, pb: Any) -> HloSharding:
    md = [metadata_from_proto(m) for m in msg.metadata]
    t = msg.type
    if t == pb.OpSharding.TUPLE:
        if md:
            raise ShardingError("tuple OpSharding must not carry metadata")
        # A tuple repeats a few element shardings over many leaves (a training step's
        # result tuple: one per weight and gradient), so each distinct element (by its
        # bytes) is read once and shared, as a load shares equal shardings.
        seen: dict[bytes, HloSharding] = {}
        elements = []
        for e in msg.tuple_shardings:
            key = e.SerializeToString()
            s = seen.get(key)
            if s is None:
                s = seen[key] = from_proto(e)
            elements.append(s)
        return HloSharding.tuple(elements)
    if t == pb.OpSharding.REPLICATED:
        return HloSharding.replicate(md)
    if t == pb.OpSharding.MANUAL:
        return HloSharding.manual(md)
    if t == pb.OpSharding.UNREDUCED:
        return HloSharding.unreduced(md)
    if t == pb.OpSharding.UNKNOWN:
        return HloSharding.unknown(md)
    if t == pb.OpSharding.MAXIMAL:
        if len(msg.tile_assignment_devices) != 1:
            raise ShardingError(
                f"MAXIMAL OpSharding needs exactly one device, got "
                f"{len(msg.tile_assignment_devices)}")
        return HloSharding.maximal(int(msg.tile_assignment_devices[0]), md)
    if t != pb.OpSharding.OTHER:
        raise ShardingError(f"unsupported OpSharding type {t}")
    dims = [int(d) for d in msg.tile_assignment_dimensions]
    reshape = [int(d) for d in msg.iota_reshape_dims]
    perm = [int(p) for p in msg.iota_transpose_perm]
    devices = [int(d) for d in msg.tile_assignment_devices]
    if reshape:
        if devices:
            raise ShardingError("OpSharding has both iota fields and tile_assignment_devices")
        if len(reshape) != len(perm):
            raise ShardingError(f"iota_reshape_dims {reshape} and iota_transpose_perm {perm} "
                                "differ in length")
        if all(d == 1 for d in reshape):
            return HloSharding.replicate(md)
    else:
        if not devices:
            raise ShardingError("OTHER OpSharding without tile_assignment_devices or iota fields")
        if len(devices) == 1:
            return HloSharding.replicate(md)
    if not dims:
        raise ShardingError("OTHER OpSharding without tile_assignment_dimensions")
    n = math.prod(reshape) if reshape else len(devices)
    if math.prod(dims) != n:
        raise ShardingError(f"tile_assignment_dimensions {dims} hold {math.prod(dims)} devices, "
                            f"the assignment lists {n}")
    ta = TileAssignment(dims, reshape, perm) if reshape else \
        TileAssignment.from_devices(dims, devices)
    types = [ShardingType(int(x)) for x in msg.last_tile_dims]
    if types:
        if msg.replicate_on_last_tile_dim:
            raise ShardingError(
                "OpSharding sets both replicate_on_last_tile_dim and last_tile_dims")
        return HloSharding.subgroup(ta, types, md)
    if msg.replicate_on_last_tile_dim:
        return HloSharding.partial_tile(ta, md)
    return HloSharding.tile(ta, metadata=md)
