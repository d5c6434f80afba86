"""Global-side shardings of a Shardy manual computation's entry (shard_map, Shardy export).

``xla.sdy.GlobalToLocalShape`` carries ``xla.sdy.in_shardings``: the sharding of each
GLOBAL operand, whose manual axes cut the local (manual) value out of it and whose
other axes stay automatic inside the body.  The partitioner reshards every operand to
that sharding before taking its tile as the manual value -- the Shardy counterpart of
the classic ``Sharding`` custom-call JAX puts before ``SPMDFullToShardShape``.
Mirrors what Shardy's export to ``SPMDFullToShardShape`` does with in_shardings
(xla/service/spmd/shardy/.../shard_map_export).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_spmd.annotations import sdy
from hlo_spmd.errors import ShardingError

if TYPE_CHECKING:
    from hlo_spmd.ir.instruction import Instruction
    from hlo_spmd.sharding import HloSharding

__all__ = ["sdy_entry_full_shardings"]


def sdy_entry_full_shardings(inst: Instruction) -> list[HloSharding] | None:
    """The global sharding of each operand of a ``GlobalToLocalShape`` (None if unknown:
    no attributes, or a manual computation nested in another one)."""
    from hlo_spmd.annotations.normalize import (ATTR_IN_SHARDINGS, ATTR_MANUAL_AXES,
                                                module_meshes)

    fa = inst.attrs.frontend_attributes.map
    if ATTR_IN_SHARDINGS not in fa or ATTR_MANUAL_AXES not in fa:
        return None
    comp = inst.parent
    module = getattr(comp, "module", None)
    if module is None:
        return None
    where = f"instruction {inst.name}"
    values = sdy.parse_sharding_per_value(fa[ATTR_IN_SHARDINGS], where)
    own = sdy.parse_manual_axes(fa[ATTR_MANUAL_AXES], where)
    if len(values) != len(inst.operands):
        return None
    local = inst.sharding
    meshes = module_meshes(module)
    out = []
    for v, op in zip(values, inst.operands):
        try:
            mesh = sdy.resolve_mesh(v, meshes, where)
            own_size = 1
            for a in own:
                own_size *= mesh.axis_size(a)
            out.append(sdy.to_hlo_sharding(v, meshes, (), where, op.shape.rank))
        except ShardingError:
            return None
        # Only when the local side is manual over exactly these axes (not nested).
        leaf = local.tuple_elements[len(out) - 1] if local is not None and local.is_tuple \
            else local
        if leaf is None or not (leaf.is_manual or leaf.is_manual_subgroup):
            return None
        if leaf.is_manual_subgroup:
            ta = leaf.tile_assignment
            dim = leaf.subgroup_manual_dim
            if ta is None or dim is None or ta.dims[dim] != own_size:
                return None
        elif own_size != mesh.total_size:
            return None
    return out
