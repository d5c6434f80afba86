"""Global-side shardings of a Shardy manual computation's entry (shard_map, Shardy export).

``xla.sdy.GlobalToLocalShape`` carries ``xla.sdy.in_shardings``: the sharding of each
GLOBAL operand, whose manual axes cut the local (manual) value out of it and whose
other axes stay automatic inside the body.  The partitioner reshards every operand to
that sharding before taking its tile as the manual value -- the Shardy counterpart of
the classic ``Sharding`` custom-call JAX puts before ``SPMDFullToShardShape``.
Mirrors what Shardy's export to ``SPMDFullToShardShape`` does with in_shardings
(xla/service/spmd/shardy/.../shard_map_export).

Open dims (``{?}``) of in_shardings are open for propagation as in Shardy's
ManualComputationOp: they gain the free (non-manual) mesh axes that tile the operand
there, so an operand tiled on an open dim keeps that tiling inside the body instead of
being gathered on entry (``refined_entry_value``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from hlo_spmd.annotations import sdy
from hlo_spmd.errors import ShardingError

if TYPE_CHECKING:
    from hlo_spmd.ir.instruction import Instruction
    from hlo_spmd.sharding import HloSharding

__all__ = ["refined_entry_value", "sdy_entry_full_shardings", "sdy_entry_refined_sharding",
           "sdy_exit_local_shardings", "sdy_exit_refined_sharding"]


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


def _entry_context(inst: Instruction, exit: bool = False):  # type: ignore[no-untyped-def]
    """(in_shardings values, own manual axes, enclosing manual axes, meshes, where) of a
    ``GlobalToLocalShape`` (out_shardings of a ``LocalToGlobalShape`` when ``exit``), or
    None when it cannot be read."""
    from hlo_spmd.annotations.normalize import (ATTR_IN_SHARDINGS, ATTR_MANUAL_AXES,
                                                ATTR_OUT_SHARDINGS, module_meshes)

    attr = ATTR_OUT_SHARDINGS if exit else ATTR_IN_SHARDINGS
    fa = inst.attrs.frontend_attributes.map
    if attr not in fa or ATTR_MANUAL_AXES not in fa:
        return None
    comp = inst.parent
    module = getattr(comp, "module", None)
    if module is None:
        return None
    where = f"instruction {inst.name}"
    values = sdy.parse_sharding_per_value(fa[attr], where)
    own = sdy.parse_manual_axes(fa[ATTR_MANUAL_AXES], where)
    if len(values) != len(inst.operands):
        return None
    enclosing = _enclosing_manual_axes(comp, module, where)
    if enclosing is None or set(enclosing) & set(own):
        return None
    return values, tuple(own), enclosing, module_meshes(module), where


def _local_manual_axes(enclosing: tuple[str, ...], own: tuple[str, ...]) -> tuple[str, ...]:
    """The axes the local side of a manual computation is manual over: the enclosing
    computations' axes, then its own."""
    return enclosing + tuple(a for a in own if a not in enclosing)


def refined_entry_value(v: sdy.TensorSharding, operand: HloSharding | None, meshes,
                        enclosing: tuple[str, ...], own: tuple[str, ...], where: str,
                        dims: Sequence[int], local: bool = False) -> sdy.TensorSharding:
    """``v`` with free mesh axes added to its open dims wherever the operand's sharding
    already tiles them that way (Shardy propagates into a manual computation's open
    in_shardings dims; axes manual here or used elsewhere in ``v`` are not free).

    ``local``: ``operand`` is the manual side (a ``LocalToGlobalShape``'s operand, whose
    out_shardings open dims are refined the same way).  Whole axes only, tried major to
    minor until none more fits; ``v`` itself when the operand adds nothing."""
    from hlo_spmd.sharding import is_subtiling

    if operand is None or operand.is_tuple or operand.is_manual or not v.open_dims \
            or operand.is_tile_maximal:
        return v
    mesh = sdy.resolve_mesh(v, meshes, where)
    used = {a.name for a in v.axis_refs()} | set(enclosing) | set(own)
    free = [a.name for a in mesh.axes if a.name not in used]
    rank = len(dims)
    grown = True
    while grown and free:
        grown = False
        for d in v.open_dims:
            for name in list(free):
                old = v.dims[d]
                cand_dims = list(v.dims)
                cand_dims[d] = sdy.DimSharding(old.axes + (sdy.AxisRef(name),), old.is_closed,
                                               old.priority)
                cand = sdy.TensorSharding(v.mesh, tuple(cand_dims), v.replicated,
                                          v.unreduced, v.text)
                if local:
                    view = sdy.to_hlo_sharding(sdy.erase_axes(cand, own), meshes,
                                               _local_manual_axes(enclosing, own), where, rank)
                else:
                    view = sdy.to_hlo_sharding(cand, meshes, enclosing, where, rank)
                if is_subtiling(operand, view, dims):
                    v = cand
                    free.remove(name)
                    grown = True
    return v


def sdy_entry_refined_sharding(inst: Instruction) -> HloSharding | None:
    """The local (manual-side) sharding of a ``GlobalToLocalShape`` with its open
    in_shardings dims refined from its operands' current shardings; None when no
    dim is open or nothing could be read."""
    from hlo_spmd.sharding import HloSharding

    got = _entry_context(inst)
    if got is None or inst.sharding is None:
        return None
    values, own, enclosing, meshes, where = got
    if not any(v.open_dims for v in values):
        return None
    inner = _local_manual_axes(enclosing, own)
    leaves = []
    for v, op in zip(values, inst.operands):
        try:
            r = refined_entry_value(v, op.sharding, meshes, enclosing, own, where,
                                    op.shape.dims)
            leaves.append(sdy.to_hlo_sharding(sdy.erase_axes(r, own), meshes, inner, where,
                                              op.shape.rank))
        except ShardingError:
            return None
    return HloSharding.tuple(leaves) if inst.shape.is_tuple else leaves[0]


def sdy_entry_full_shardings(inst: Instruction) -> list[HloSharding] | None:
    """The global sharding of each operand of a ``GlobalToLocalShape`` (None if unknown).

    In a manual computation nested in another one, the global operand is already manual
    over the enclosing computations' axes: those are a manual subgroup of its sharding,
    and the local side is manual over them and the entry's own axes together.  Open
    dims refined by propagation (``sdy_entry_refined_sharding``) are refined here the
    same way, when the local side carries that refinement."""
    got = _entry_context(inst)
    if got is None:
        return None
    values, own, enclosing, meshes, where = got
    inner = _local_manual_axes(enclosing, own)
    local = inst.sharding
    out = []
    for v, op in zip(values, inst.operands):
        # Only when the local side is manual over exactly those axes.
        leaf = local.tuple_elements[len(out)] if local is not None and local.is_tuple \
            else local
        try:
            mesh = sdy.resolve_mesh(v, meshes, where)
            own_size = 1
            for a in tuple(own) + enclosing:  # the local side's manual axes
                own_size *= mesh.axis_size(a)
            rank = op.shape.rank
            refined = refined_entry_value(v, op.sharding, meshes, enclosing, own, where,
                                          op.shape.dims)
            if refined != v and leaf is not None and leaf == sdy.to_hlo_sharding(
                    sdy.erase_axes(refined, own), meshes, inner, where, rank):
                v = refined
            out.append(sdy.to_hlo_sharding(v, meshes, enclosing, where, rank))
        except ShardingError:
            return None
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


def sdy_exit_refined_sharding(inst: Instruction) -> HloSharding | None:
    """The global sharding of a ``LocalToGlobalShape`` with its open out_shardings dims
    refined from its (manual-side) operands' current shardings; None when no dim is
    open or nothing could be read."""
    from hlo_spmd.sharding import HloSharding

    got = _entry_context(inst, exit=True)
    if got is None or inst.sharding is None:
        return None
    values, own, enclosing, meshes, where = got
    if not any(v.open_dims for v in values):
        return None
    leaves = []
    for v, op in zip(values, inst.operands):
        try:
            r = refined_entry_value(v, op.sharding, meshes, enclosing, own, where,
                                    op.shape.dims,
                                    local=True)
            leaves.append(sdy.to_hlo_sharding(r, meshes, enclosing, where, op.shape.rank))
        except ShardingError:
            return None
    return HloSharding.tuple(leaves) if inst.shape.is_tuple else leaves[0]


def sdy_exit_local_shardings(inst: Instruction) -> list[HloSharding] | None:
    """The manual-side sharding each operand of a ``LocalToGlobalShape`` must have for
    its tile to be the tile of the exit's global sharding (None if unknown): the
    out_shardings without the manual axes, refined on open dims as propagation refined
    the exit (``sdy_exit_refined_sharding``)."""
    got = _entry_context(inst, exit=True)
    if got is None:
        return None
    values, own, enclosing, meshes, where = got
    inner = _local_manual_axes(enclosing, own)
    full = inst.sharding
    out = []
    for i, (v, op) in enumerate(zip(values, inst.operands)):
        leaf = full.tuple_elements[i] if full is not None and full.is_tuple else full
        try:
            rank = op.shape.rank
            refined = refined_entry_value(v, op.sharding, meshes, enclosing, own, where,
                                          op.shape.dims, local=True)
            if refined != v and leaf is not None and leaf == sdy.to_hlo_sharding(
                    refined, meshes, enclosing, where, rank):
                v = refined
            out.append(sdy.to_hlo_sharding(sdy.erase_axes(v, own), meshes, inner, where, rank))
        except ShardingError:
            return None
    return out
