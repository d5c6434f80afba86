"""reduce (single and variadic): local reduce per tile, then combine across the devices that
hold different parts of the reduced dims (GSPMD section 4.3, "reduce").

Plan for ``reduce(xs, inits), dimensions=D`` with result sharding T:

1. Pick the operand sharding S. The operand keeps its own sharding when it is tiled (no
   operand traffic: reducing first and resharding the smaller result is never more data
   than resharding the operand). A replicated operand is cut (free, local slicing) to T
   extended with one tile on every reduced dim, so the reduce itself runs on T's tiles and
   no collective is needed. Maximal operands go through replicated first.
2. The local reduce gives, on every device, the partial result for its tile. Its sharding
   R(S) is S with the reduced dims replicated and removed: devices that differed only in
   their reduced-dim tile coordinate now hold partial results of the same output tile.
3. If a reduced dim is sharded, combine the partials across exactly those devices (groups
   = devices that differ only in reduced-dim coordinates, from S's tile array):

   * recognised reducer (the reducer computation's root is add / multiply / maximum /
     minimum / and / or / xor of its two parameters): padding of uneven reduced dims is
     masked with the reducer's identity, the local reduce starts from the identity, the
     partials are all-reduced with that opcode, and the original init value is applied
     once at the end (so a non-identity init is still exact). Opcodes the runtime has no
     all-reduce for (integer and/or, xor) combine as below instead.
   * any other reducer, and every variadic reduce (argmax: the reducer works on (value,
     index) pairs; an all-reduce applies one scalar reducer to each operand separately, so
     it cannot express this): padding is masked with the init values, the partial results
     are all-gathered along a new major dim within each group and reduced again with the
     original reducer and inits. This relies only on what XLA's reduce semantics already
     require: the reducer is associative and commutative and the init value may be
     applied any number of times (XLA itself pads with the init value).
4. The result, with sharding R(S), is resharded to T (free when R(S) equals T).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.opcodes import REDUCTION_KINDS, reducer_opcode
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.ir.shape import Shape
from hlo_spmd.memo import BoundedMemo
from hlo_spmd.passes.partition.causes import with_cause
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.support.common import copy_attrs
from hlo_spmd.passes.partition.masking import pad_value_identity, padded_dims, valid_mask
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.registry import handles
from hlo_spmd.passes.partition.reshard import reshard
from hlo_spmd.sharding import HloSharding, TileAssignment, device_offsets, partial_replicate
from hlo_spmd.sharding.common import memoised

# Shardings are immutable: one shared replicated sharding for the hot paths (a
# fresh one per instruction cost an allocation, and ``s is target`` tests hit first).
_REPLICATED = HloSharding.replicate()

PT = PrimitiveType

# -- reducer analysis -------------------------------------------------------------------------
# ``reducer_opcode`` (re-exported here) is ir.opcodes' one recogniser of a reducer computation.


def identity_value(opcode: str, element_type: PrimitiveType):
    """The identity of the binary reducer ``opcode`` on ``element_type`` (a numpy scalar),
    or None when there is none (e.g. maximum on complex numbers)."""
    try:
        return pad_value_identity(opcode, element_type)
    except ValueError:
        return None


def all_reduce_supported(opcode: str, et: PrimitiveType) -> bool:
    """Whether an all-reduce with this reducer runs on every backend (XLA CPU matches the
    reducer to sum / product / min / max; and/or only on pred, as min/max)."""
    kind = REDUCTION_KINDS.get(opcode)
    if kind is None:
        return False
    return (PrimitiveType(et) == PT.PRED) == kind.endswith("on pred")


def _is_constant_equal(inst: Instruction, value) -> bool:
    """Whether ``inst`` is a scalar constant bitwise equal to ``value``."""
    if inst.opcode != "constant" or inst.shape.rank != 0 or not inst.attrs.HasField("literal"):
        return False
    v = np.asarray(value)
    # Every layer's reduce asks this of the same init literal: decode each distinct one once.
    key = (inst.attrs.literal.SerializeToString(deterministic=True), v.dtype.str, v.tobytes())
    hit = _CONSTANT_EQUAL.get(key)
    if hit is None:
        hit = _CONSTANT_EQUAL.put(key, _literal_equal(inst.attrs.literal, v))
    return hit


_CONSTANT_EQUAL = BoundedMemo(4096)


def _literal_equal(literal, value: np.ndarray) -> bool:
    from hlo_spmd.ir.literal import literal_to_numpy

    try:
        lit = np.asarray(literal_to_numpy(literal))
        return lit.tobytes() == value.astype(lit.dtype).tobytes()
    except Exception:  # noqa: BLE001 - exotic literal: treat as not the identity
        return False


# -- sharding helpers --------------------------------------------------------------------------
def rebuild_like(s: HloSharding, ta: TileAssignment) -> HloSharding:
    """``s``'s kind (plain / partial replication / subgroups) with a new tile assignment."""
    if s.replicate_on_last_tile_dim:
        return HloSharding.partial_tile(ta)
    if s.subgroup_types:
        return HloSharding.subgroup(ta, s.subgroup_types)
    return HloSharding.tile(ta)


def remove_dims(s: HloSharding, dims: Sequence[int]) -> HloSharding:
    """Drop data dims that have one tile (RemoveShapeDimensions)."""
    if not s.is_tiled or not dims:
        return s
    ta = s.tile_assignment
    drop = set(int(d) for d in dims)
    assert all(ta.dims[d] == 1 for d in drop), (s, dims)
    return rebuild_like(s, ta.reshape([n for i, n in enumerate(ta.dims) if i not in drop]))


def insert_dims(s: HloSharding, positions: Sequence[int], rank: int) -> HloSharding:
    """``s`` (over ``rank - len(positions)`` data dims) with one-tile dims inserted so the
    given positions of a rank-``rank`` shape are unsharded."""
    if not s.is_tiled:
        return s
    ta = s.tile_assignment
    data = list(ta.dims[:s.tiled_data_rank])
    extra = list(ta.dims[s.tiled_data_rank:])
    pos = set(int(p) for p in positions)
    it = iter(data)
    new = [1 if i in pos else next(it) for i in range(rank)]
    return rebuild_like(s, ta.reshape(new + extra))


@memoised
def reduced_sharding(s: HloSharding, dims: Sequence[int]) -> HloSharding:
    """R(S): the sharding of a local reduce of an operand sharded ``s`` over ``dims`` -- the
    reduced dims join the replication and disappear."""
    if not s.is_tiled:
        return s
    return remove_dims(partial_replicate(s, dims), dims)


@memoised
def reduction_groups(s: HloSharding, dims: Sequence[int]) -> np.ndarray:
    """Logical device groups ``[k, m]`` whose members differ only in their tile coordinate
    along ``dims`` (the devices whose partial results combine). Memoised: read-only."""
    arr = s.tile_assignment.array()
    dims = [int(d) for d in dims]
    size = int(np.prod([arr.shape[d] for d in dims], dtype=np.int64))
    moved = np.moveaxis(arr, dims, list(range(arr.ndim - len(dims), arr.ndim)))
    out = np.array(moved.reshape(-1, size))
    out.flags.writeable = False
    return out


@memoised
def same_placement(a: HloSharding, b: HloSharding, dims: Sequence[int], n: int) -> bool:
    """Whether two leaf shardings put the same tile (and padding) on every device."""
    if a == b:
        return True
    if a.is_tuple or b.is_tuple or a.is_manual or b.is_manual or a.is_maximal or b.is_maximal:
        return False
    if not (a.is_tiled or a.is_replicated) or not (b.is_tiled or b.is_replicated):
        return False
    ta = a.tile_dims_for_data(len(dims)) if a.is_tiled else (1,) * len(dims)
    tb = b.tile_dims_for_data(len(dims)) if b.is_tiled else (1,) * len(dims)
    if tuple(ta) != tuple(tb):
        return False
    try:
        return bool(np.array_equal(device_offsets(a, dims, num_devices=n),
                                   device_offsets(b, dims, num_devices=n)))
    except Exception:  # noqa: BLE001 - manual subgroups etc.: only exact equality counts
        return False


def leaf_elements(s: HloSharding, n: int) -> list[HloSharding]:
    """Per-element shardings of an ``n``-element flat tuple value."""
    return list(s.tuple_elements) if s.is_tuple else [s] * n


# -- masking ----------------------------------------------------------------------------------
def mask_reduced_padding(ctx: PartitionContext, xs: Sequence[Instruction], base_shape: Shape,
                         sharding: HloSharding, dims: Sequence[int],
                         values: Sequence[Instruction]) -> list[Instruction]:
    """Each local operand in ``xs`` (all of global shape ``base_shape``, sharded
    ``sharding``) with the padding on ``dims`` replaced by the matching scalar of ``values``;
    one validity mask is built and shared by all operands."""
    pv = PValue(xs[0], base_shape, sharding)
    if not padded_dims(pv, dims):
        return list(xs)
    mask = valid_mask(ctx, pv, dims)
    out = []
    for x, v in zip(xs, values):
        fill = ctx.b.broadcast(v, list(x.shape.dims), []) if x.shape.rank else v
        out.append(ctx.b.select(mask, x, fill))
    return out


# -- the handler ------------------------------------------------------------------------------
def _operand_sharding(ctx: PartitionContext, inst: Instruction, dims: Sequence[int],
                      target: HloSharding) -> HloSharding:
    src = ctx.value(inst.operands[0]).sharding
    if src.is_manual:
        return src
    if src.is_tuple or src.is_maximal or not (src.is_tiled or src.is_replicated):
        src = HloSharding.replicate()
    if src.is_replicated and target.is_tiled and not target.is_manual_subgroup:
        return insert_dims(target, dims, inst.operands[0].shape.rank)
    return src


def _local_shape(ctx: PartitionContext, shapes: Sequence[Shape], s: HloSharding) -> Shape:
    local = [ctx.local_shape(shape, s) for shape in shapes]
    return local[0] if len(local) == 1 else Shape.tuple_of(local)


def _elements_of(ctx: PartitionContext, x: Instruction, n: int) -> list[Instruction]:
    if n == 1:
        return [x]
    return [ctx.b.get_tuple_element(x, i) for i in range(n)]


def _gather_and_reduce(ctx: PartitionContext, inst: Instruction, partials: list[Instruction],
                       inits: list[Instruction], groups: np.ndarray) -> list[Instruction]:
    """Combine per-device partial results: all-gather each along a new major dim within
    ``groups``, then reduce that dim with the instruction's own reducer."""
    b = ctx.b
    gathered = []
    for p in partials:
        dims = list(p.shape.dims)
        expanded = b.reshape(p, [1] + dims)
        gathered.append(ctx.f.all_gather(expanded, 0, groups))
    attrs = copy_attrs(inst)
    attrs.ClearField("dimensions")
    attrs.dimensions.append(0)
    shapes = [Shape.array(p.shape.element_type, p.shape.dims) for p in partials]
    declared = shapes[0] if len(shapes) == 1 else Shape.tuple_of(shapes)
    called = [ctx.clone(c) for c in inst.called_computations]
    out = b.op("reduce", gathered + inits, attrs, called, declared=declared,
               name=f"{inst.name}.combine")
    return _elements_of(ctx, out, len(partials))


@handles("reduce")
@with_cause("reduction")
def handle_reduce(ctx: PartitionContext, inst: Instruction) -> PValue:
    b = ctx.b
    n = len(inst.operands) // 2
    dims = sorted({int(d) for d in inst.dimensions})
    in_shape = inst.operands[0].shape
    in_dims = list(in_shape.dims)
    out_shapes = list(inst.shape.tuple_shapes) if inst.shape.is_tuple else [inst.shape]
    target = ctx.sharding_of(inst)
    targets = leaf_elements(target, n)
    norm_target = HloSharding.tuple(targets) if inst.shape.is_tuple else targets[0]

    src = _operand_sharding(ctx, inst, dims, targets[0])
    xs = [ctx.operand(inst, i, src) for i in range(n)]
    inits = [ctx.operand(inst, n + i, _REPLICATED) for i in range(n)]
    res = reduced_sharding(src, dims)
    local_shape = _local_shape(ctx, out_shapes, res)
    # Where R(S) places data exactly as the target does (another spelling of the same
    # sharding), label the result with the target so no resharding follows.
    elems = [t if same_placement(res, t, shape.dims, ctx.num_devices) else res
             for t, shape in zip(targets, out_shapes)]
    res_value = HloSharding.tuple(elems) if inst.shape.is_tuple else elems[0]

    tiles = src.tile_dims_for_data(len(in_dims)) if src.is_tiled else (1,) * len(in_dims)
    sharded = [d for d in dims if tiles[d] > 1]
    if not sharded:  # every reduced dim is whole on each device
        out = ctx.emit_like(inst, xs + inits, local_shape)
        return reshard(ctx, PValue(out, inst.shape, res_value), norm_target)

    groups = reduction_groups(src, sharded)
    et = xs[0].shape.element_type
    opcode = reducer_opcode(inst.called_computations[0]) if n == 1 else None
    ident = identity_value(opcode, et) if opcode is not None else None
    if ident is not None:
        ident_c = b.constant(np.asarray(ident), et)
        (x,) = mask_reduced_padding(ctx, xs[:1], in_shape, src, sharded, [ident_c])
        partial = ctx.emit_like(inst, [x, ident_c], local_shape, name=f"{inst.name}.local")
        if all_reduce_supported(opcode, et):
            combined = ctx.f.all_reduce(partial, opcode, groups)
        else:
            combined = _gather_and_reduce(ctx, inst, [partial], [ident_c], groups)[0]
        if not _is_constant_equal(inst.operands[1], ident):
            dims_out = list(combined.shape.dims)
            init = b.broadcast(inits[0], dims_out, []) if dims_out else inits[0]
            combined = b.binary(opcode, combined, init)
        return reshard(ctx, PValue(combined, inst.shape, res_value), norm_target)

    masked = mask_reduced_padding(ctx, xs, in_shape, src, sharded, inits)
    partial = ctx.emit_like(inst, masked + inits, local_shape, name=f"{inst.name}.local")
    parts = _gather_and_reduce(ctx, inst, _elements_of(ctx, partial, n), inits, groups)
    out = parts[0] if n == 1 else b.tuple(parts)
    return reshard(ctx, PValue(out, inst.shape, res_value), norm_target)
