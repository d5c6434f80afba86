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


def _enclosing_manual_axes(comp, module, where: str) -> tuple[str, ...] | None:
    """Manual axes already in effect in ``comp``: the axes of the manual computations
    whose bodies (transitively) call it (None when its callers disagree)."""
    from hlo_spmd.annotations.normalize import ATTR_MANUAL_AXES, SDY_GLOBAL_TO_LOCAL

    found: set[tuple[str, ...]] = set()
    for caller_comp in module.computations:
        for call in caller_comp.instructions:
            if not any(c is comp for c in call.called_computations):
                continue
            axes: tuple[str, ...] = ()
            for op in call.operands:
                if op.opcode == "custom-call" and op.custom_call_target == SDY_GLOBAL_TO_LOCAL:
                    fa = op.attrs.frontend_attributes.map
                    if ATTR_MANUAL_AXES in fa:
                        axes = tuple(sdy.parse_manual_axes(fa[ATTR_MANUAL_AXES], where))
                        break
            outer = _enclosing_manual_axes(caller_comp, module, where)
            if outer is None:
                return None
            found.add(outer + tuple(a for a in axes if a not in outer))
    if len(found) > 1:
        return None
    return next(iter(found)) if found else ()


def sdy_entry_full_shardings(inst: Instruction) -> list[HloSharding] | None:
    """The global sharding of each operand of a ``GlobalToLocalShape`` (None if unknown).

    In a manual computation nested in another one, the global operand is already manual
    over the enclosing computations' axes: those are a manual subgroup of its sharding,
    and the local side is manual over them and the entry's own axes together."""
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
    enclosing = _enclosing_manual_axes(comp, module, where)
    if enclosing is None or set(enclosing) & set(own):
        return None
    out = []
    for v, op in zip(values, inst.operands):
        try:
            mesh = sdy.resolve_mesh(v, meshes, where)
            own_size = 1
            for a in tuple(own) + enclosing:  # the local side's manual axes
                own_size *= mesh.axis_size(a)
            out.append(sdy.to_hlo_sharding(v, meshes, enclosing, where, op.shape.rank))
        except ShardingError:
            return None
        # Only when the local side is manual over exactly those axes.
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
