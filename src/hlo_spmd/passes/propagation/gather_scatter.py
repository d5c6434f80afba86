"""Gather / scatter sharding maps (hlo_sharding_util's Gather*/Scatter* functions), on the
dims model shared with the partitioner (hlo_spmd.passes.gather_scatter_dims).

Three kinds of dims connect a gather's operand, indices and output (scatter: operand,
indices, updates): index pass-through dims (indices batch dims <-> output batch dims),
operand pass-through dims (operand dims sliced whole <-> output offset dims), and
parallel dims (explicit batching dims, or an iota along an indices dim that makes
operand and indices dims move together).
"""
from __future__ import annotations

from typing import Callable, Sequence

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.passes.propagation import sharding_ops as ops
from hlo_spmd.passes.gather_scatter_dims import (GSDims, connected_index_dims,
                                                 explicit_batch_dims, operand_passthrough_dims,
                                                 scatter_slice_sizes)
from hlo_spmd.sharding import HloSharding, merge_sharding

Callers = Callable[[object], list]


# -- attribute access --------------------------------------------------------------------

def _gdn(inst: Instruction):
    return inst.attrs.gather_dimension_numbers


def _sdn(inst: Instruction):
    return inst.attrs.scatter_dimension_numbers


def gather_slice_sizes(inst: Instruction) -> list[int]:
    return list(inst.attrs.gather_slice_sizes)


def scatter_count(inst: Instruction) -> int:
    return (len(inst.operands) - 1) // 2


def scatter_operands(inst: Instruction) -> list[Instruction]:
    return inst.operands[:scatter_count(inst)]


def scatter_indices(inst: Instruction) -> Instruction:
    return inst.operands[scatter_count(inst)]


def scatter_updates(inst: Instruction) -> list[Instruction]:
    n = scatter_count(inst)
    return inst.operands[n + 1:2 * n + 1]


def _scatter_slice_sizes(inst: Instruction) -> list[int]:
    d = _sdn(inst)
    return scatter_slice_sizes(scatter_operands(inst)[0].shape.dims,
                               scatter_updates(inst)[0].shape.dims,
                               list(d.inserted_window_dims), list(d.input_batching_dims),
                               list(d.update_window_dims))


# -- iota detection (GetDimensionForIota) ---------------------------------------------------

def dimension_for_iota(inst: Instruction, callers: Callers, depth: int = 0) -> int | None:
    """The dim along which ``inst`` counts 0, 1, 2, ... (an iota in disguise), or None."""
    if depth > 32:
        return None
    if inst.opcode == "iota":
        return int(inst.attrs.dimensions[0]) if inst.attrs.dimensions else 0
    if inst.shape.is_tuple or inst.shape.element_type.name != "S32":
        return None
    if inst.opcode == "constant":
        return _constant_iota_dim(inst)
    if inst.opcode == "broadcast":
        d = dimension_for_iota(inst.operands[0], callers, depth + 1)
        return None if d is None else int(inst.attrs.dimensions[d])
    if inst.opcode == "get-tuple-element" and inst.operands[0].opcode == "parameter":
        comp = inst.parent
        if comp is None or comp.module is None or comp is comp.module.entry:
            return None
        sites = callers(comp)
        if len(sites) != 1:
            return None
        caller = sites[0]
        k = inst.tuple_index
        if caller.opcode == "while" and caller.operands[0].opcode == "tuple":
            root = comp.root
            if root is not None and root.opcode == "tuple" and root.operands[k] is inst:
                return dimension_for_iota(caller.operands[0].operands[k], callers, depth + 1)
        if caller.opcode == "conditional":
            idx = [c for c in caller.called_computations].index(comp)
            arg = caller.operands[idx + 1]
            if arg.opcode == "tuple":
                return dimension_for_iota(arg.operands[k], callers, depth + 1)
    return None


def _constant_iota_dim(inst: Instruction) -> int | None:
    try:
        import numpy as np
        from hlo_spmd.ir.literal import literal_to_numpy
        arr = np.asarray(literal_to_numpy(inst.attrs.literal)).reshape(inst.shape.dims)
    except Exception:  # noqa: BLE001 - undecodable literal: not an iota
        return None
    for d in range(arr.ndim):
        if arr.shape[d] <= 1:
            continue
        idx = np.arange(arr.shape[d]).reshape([-1 if i == d else 1 for i in range(arr.ndim)])
        if np.array_equal(arr, np.broadcast_to(idx, arr.shape)):
            return d
    return None


def batch_parallel_dims(operand: Instruction, indices: Instruction, slice_sizes: Sequence[int],
                        index_vector_dim: int, index_map: Sequence[int],
                        indices_batching: Sequence[int], offset_dims: Sequence[int],
                        callers: Callers) -> GSDims | None:
    """GetGatherScatterBatchParallelDims: parallel dims implied by an iota in the indices."""
    parallel = [-1] * len(index_map)
    base = indices
    while base.opcode == "copy":
        base = base.operands[0]
    if base.opcode != "concatenate":
        base = indices
    ivd = index_vector_dim
    if base.opcode == "concatenate" and int(base.attrs.dimensions[0]) == ivd:
        done = 0
        for op in base.operands:
            n = op.shape.dims[ivd] if op.shape.rank > ivd else 1
            d = dimension_for_iota(op, callers)
            if d is not None and d != ivd:
                for j in range(n):
                    if done + j < len(parallel):
                        parallel[done + j] = d
            done += n
    else:
        d = dimension_for_iota(base, callers)
        if d is not None and d != ivd:
            n = base.shape.dims[ivd] if base.shape.rank > ivd else 1
            parallel = [d] * n
    res = GSDims()
    for i, ipd in enumerate(parallel):
        if ipd == -1 or i >= len(index_map):
            continue
        opd = index_map[i]
        if ipd in res.indices:
            return None
        if slice_sizes[opd] == 1 and ipd not in indices_batching:
            if operand.shape.dims[opd] != base.shape.dims[ipd]:
                return None
            res.indices.append(ipd)
            res.operand.append(opd)
    if not res.indices:
        return None
    res.fill_output(ivd, offset_dims)
    return res


def gather_parallel_dims(inst: Instruction, callers: Callers) -> GSDims | None:
    d = _gdn(inst)
    return batch_parallel_dims(inst.operands[0], inst.operands[1], gather_slice_sizes(inst),
                               d.index_vector_dim, list(d.start_index_map),
                               list(d.start_indices_batching_dims), list(d.offset_dims), callers)


def scatter_parallel_dims(inst: Instruction, callers: Callers) -> GSDims | None:
    d = _sdn(inst)
    return batch_parallel_dims(scatter_operands(inst)[0], scatter_indices(inst),
                               _scatter_slice_sizes(inst), d.index_vector_dim,
                               list(d.scatter_dims_to_operand_dims),
                               list(d.scatter_indices_batching_dims),
                               list(d.update_window_dims), callers)


def gather_explicit_batch_dims(inst: Instruction) -> GSDims | None:
    d = _gdn(inst)
    return explicit_batch_dims(d.operand_batching_dims, d.start_indices_batching_dims,
                               d.index_vector_dim, d.offset_dims)


def scatter_explicit_batch_dims(inst: Instruction) -> GSDims | None:
    d = _sdn(inst)
    return explicit_batch_dims(d.input_batching_dims, d.scatter_indices_batching_dims,
                               d.index_vector_dim, d.update_window_dims)


# -- gather --------------------------------------------------------------------------------

def _connected_gather(inst: Instruction) -> GSDims:
    d = _gdn(inst)
    return connected_index_dims(inst.operands[1].shape.rank, d.index_vector_dim,
                                inst.shape.rank, list(d.offset_dims))


def gather_output_from_index(index_sharding: HloSharding, inst: Instruction) -> HloSharding:
    """GatherOutputShardingFromIndex."""
    if not index_sharding.is_tiled:
        return index_sharding
    c = _connected_gather(inst)
    return ops.propagate_along(index_sharding, c.indices, c.output, inst.shape.rank)


def gather_index_from_output(output_sharding: HloSharding, inst: Instruction) -> HloSharding:
    """GatherIndexShardingFromOutput."""
    if not output_sharding.is_tiled:
        return output_sharding
    c = _connected_gather(inst)
    return ops.propagate_along(output_sharding, c.output, c.indices, inst.operands[1].shape.rank)


def _operand_to_output(operand_dims: Sequence[int], s: HloSharding, out_rank: int,
                       collapsed: Sequence[int], batching: Sequence[int],
                       offset_dims: Sequence[int],
                       slice_sizes: Sequence[int]) -> HloSharding | None:
    """PassthroughOperandToGatherOutputOrScatterUpdate."""
    if not s.is_tiled:
        return None
    pt = operand_passthrough_dims(operand_dims, collapsed, batching, offset_dims, slice_sizes)
    res = ops.propagate_along(s, pt.operand, pt.output, out_rank)
    return None if res.is_tile_maximal else res


def _output_to_operand(operand_dims: Sequence[int], s: HloSharding,
                       collapsed: Sequence[int], batching: Sequence[int],
                       offset_dims: Sequence[int],
                       slice_sizes: Sequence[int]) -> HloSharding | None:
    """PassthroughGatherOutputOrScatterUpdateToOperand."""
    if not s.is_tiled:
        return s
    pt = operand_passthrough_dims(operand_dims, collapsed, batching, offset_dims, slice_sizes)
    res = ops.propagate_along(s, pt.output, pt.operand, len(operand_dims))
    return None if res.is_tile_maximal else res


def gather_output_from_operand_passthrough(operand_sharding: HloSharding,
                                           inst: Instruction) -> HloSharding | None:
    d = _gdn(inst)
    return _operand_to_output(inst.operands[0].shape.dims, operand_sharding, inst.shape.rank,
                              list(d.collapsed_slice_dims), list(d.operand_batching_dims),
                              list(d.offset_dims), gather_slice_sizes(inst))


def _merge_parallel_passthrough(parallel: HloSharding | None,
                                passthrough: HloSharding | None) -> HloSharding | None:
    if passthrough is None:
        return parallel
    if parallel is None:
        return passthrough
    ok, merged = merge_sharding(parallel, passthrough, True)
    if ok:
        return merged
    ok, merged = merge_sharding(passthrough, parallel, True)
    if ok:
        return merged
    return parallel


def gather_operand_from_output(output_sharding: HloSharding, inst: Instruction,
                               callers: Callers) -> HloSharding | None:
    """GatherOperandShardingFromOutput: parallel dims first, then pass-through dims."""
    d = _gdn(inst)
    parallel: HloSharding | None
    if not output_sharding.is_tiled:
        parallel = output_sharding
    else:
        dims = gather_explicit_batch_dims(inst) or GSDims()
        implicit = gather_parallel_dims(inst, callers)
        if implicit is not None:
            dims.extend(implicit)
        parallel = None if not dims.operand else ops.propagate_along(
            output_sharding, dims.output, dims.operand, inst.operands[0].shape.rank)
    passthrough = _output_to_operand(inst.operands[0].shape.dims, output_sharding,
                                     list(d.collapsed_slice_dims), list(d.operand_batching_dims),
                                     list(d.offset_dims), gather_slice_sizes(inst))
    return _merge_parallel_passthrough(parallel, passthrough)


# -- scatter -------------------------------------------------------------------------------

def _connected_scatter(inst: Instruction) -> GSDims:
    d = _sdn(inst)
    return connected_index_dims(scatter_indices(inst).shape.rank, d.index_vector_dim,
                                scatter_updates(inst)[0].shape.rank, list(d.update_window_dims))


def scatter_index_from_update(update_sharding: HloSharding, inst: Instruction) -> HloSharding:
    """ScatterIndexShardingFromUpdate."""
    if not update_sharding.is_tiled:
        return update_sharding
    c = _connected_scatter(inst)
    return ops.propagate_along(update_sharding, c.output, c.indices,
                               scatter_indices(inst).shape.rank)


def scatter_update_from_index(index_sharding: HloSharding, inst: Instruction) -> HloSharding:
    """ScatterUpdateShardingFromIndex."""
    if not index_sharding.is_tiled:
        return index_sharding
    c = _connected_scatter(inst)
    return ops.propagate_along(index_sharding, c.indices, c.output,
                               scatter_updates(inst)[0].shape.rank)


def scatter_output_from_update(update_sharding: HloSharding,
                               inst: Instruction) -> HloSharding | None:
    """ScatterOutputShardingFromUpdate (update window dims -> operand dims)."""
    d = _sdn(inst)
    return _output_to_operand(scatter_operands(inst)[0].shape.dims, update_sharding,
                              list(d.inserted_window_dims), list(d.input_batching_dims),
                              list(d.update_window_dims), _scatter_slice_sizes(inst))


def scatter_update_from_output(output_sharding: HloSharding, inst: Instruction,
                               callers: Callers) -> HloSharding | None:
    """ScatterUpdateShardingFromOutput: parallel dims first, then pass-through dims."""
    d = _sdn(inst)
    upd_rank = scatter_updates(inst)[0].shape.rank
    parallel: HloSharding | None
    if not output_sharding.is_tiled:
        parallel = output_sharding
    else:
        dims = scatter_explicit_batch_dims(inst) or GSDims()
        implicit = scatter_parallel_dims(inst, callers)
        if implicit is not None:
            dims.extend(implicit)
        parallel = None if not dims.operand else ops.propagate_along(
            output_sharding, dims.operand, dims.output, upd_rank)
    passthrough = _operand_to_output(scatter_operands(inst)[0].shape.dims, output_sharding,
                                     upd_rank, list(d.inserted_window_dims),
                                     list(d.input_batching_dims), list(d.update_window_dims),
                                     _scatter_slice_sizes(inst))
    return _merge_parallel_passthrough(parallel, passthrough)
