"""gather and scatter without replicating the operand (XLA's
``SpmdPartitioningVisitor::HandleGather`` / ``HandleScatter`` and the strategies of
gather_scatter_utils.cc / spmd_partitioner_util.cc).

A strategy is a *device grid*: one array of logical devices whose axes each carry a role
that ties dims of the operand, the indices, the updates and the result together:

* ``pass``     an operand dim that is not indexed and taken whole (operand passthrough):
               the result's matching offset dim (gather) or the updates' window dim
               (scatter) is tiled along the same devices;
* ``batch``    an explicit batching dim (operand_batching_dims / start_indices_batching_dims)
               with the indices' and the result's matching dims (index-parallel);
* ``index``    an indices batch dim (index passthrough): the operand is whole along this
               axis; a gather result is tiled like the indices, a scatter combines the
               partial results (add / max / min only);
* ``triv``     an indexed operand dim with slice size 1 (the trivially sliced operand, a
               vocab-sharded table): each device keeps its rows. Gather shifts the indices by
               the shard's start, masks rows owned elsewhere and all-reduces; scatter shifts
               the indices so updates for other shards fall out of bounds and are dropped,
               exactly as the unpartitioned scatter drops out-of-bounds windows;
* replication  everything else: whole on those devices.

Candidate grids are read off the current shardings of the operand, the indices (and
updates) and off the wanted result sharding. Plans are data: each candidate (and the
replicated fallback) is priced without emitting anything, in bytes per device on the wire
(``reshard.reshard_cost`` and ``collectives.cost``, the one cost model) plus the bytes of
its largest new array (``Strategy.key``); only the winner is emitted, so a loser leaves no
dead code and no warning. Duplicate indices in an overwriting scatter keep
XLA's semantics because every update of a row is applied on the devices that own the row,
in the original order.

Partially manual operands and result (manual subgroups over the same device groups) run
the same strategies inside the manual groups, on the non-manual rest of their shardings
(GSPMD 4.4, as the dot handler does): collectives then act within every group at once.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from hlo_spmd.collectives.cost import bytes_per_device
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.opcodes import IDEMPOTENT_REDUCERS
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.ir.shape import Shape
from hlo_spmd.passes.gather_scatter_dims import GatherDims, Role, ScatterDims
from hlo_spmd.passes.partition.causes import with_cause
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.handlers.basic import handle_replicated
from hlo_spmd.passes.partition.support.common import copy_attrs
from hlo_spmd.passes.partition.support.dot_dims import manual_groups
from hlo_spmd.passes.partition.handlers.reduce import reducer_opcode
from hlo_spmd.passes.partition.masking import pad_value_identity, padded_dims, valid_mask
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.registry import handles
from hlo_spmd.passes.propagation.gather_scatter import (gather_parallel_dims,
                                                        scatter_parallel_dims)
from hlo_spmd.passes.partition.reshard import reshard
from hlo_spmd.passes.partition.support.strategy import (Strategy, cheapest, itemsize,
                                                        local_bytes, moves, replicated_price,
                                                        result_move)
from hlo_spmd.sharding import (HloSharding, device_offsets,
                               partial_replicate_all_except, tile_shape)

PRED = PrimitiveType.PRED



# The records below are plain ``__slots__`` classes (never compared, copied or mutated):
# a dataclass costs ~0.75 ms to create at import.
class Grid:
    """Logical devices ``arr`` (one axis per entry of ``roles``; role None = replicated)."""
    __slots__ = ("arr", "roles")

    def __init__(self, arr: np.ndarray, roles: list[Role | None]) -> None:
        self.arr = arr
        self.roles = roles

    def sharding_for(self, array: str, rank: int) -> HloSharding:
        """The sharding of ``array`` (of ``rank`` dims) implied by this grid."""
        by_dim: dict[int, int] = {}
        for a, role in enumerate(self.roles):
            if role is not None and self.arr.shape[a] > 1:
                dims = dict(role[1])
                if array in dims:
                    by_dim[dims[array]] = a
        order = [by_dim[d] for d in range(rank) if d in by_dim]
        rest = [a for a in range(self.arr.ndim) if a not in order]
        moved = np.transpose(self.arr, order + rest)
        tiles = [self.arr.shape[by_dim[d]] if d in by_dim else 1 for d in range(rank)]
        rep = int(np.prod([self.arr.shape[a] for a in rest], dtype=np.int64))
        if not by_dim:
            return HloSharding.replicate()
        if rep == 1:
            return HloSharding.tile(moved.reshape(tiles))
        return HloSharding.partial_tile(moved.reshape(tiles + [rep]))

    def axes(self, kind: str) -> list[int]:
        return [a for a, r in enumerate(self.roles)
                if r is not None and r[0] == kind and self.arr.shape[a] > 1]

    def groups(self, axes: Sequence[int]) -> np.ndarray:
        """Device groups ``[k, m]`` differing only along ``axes``."""
        size = int(np.prod([self.arr.shape[a] for a in axes], dtype=np.int64))
        rest = [a for a in range(self.arr.ndim) if a not in axes]
        return np.transpose(self.arr, rest + list(axes)).reshape(-1, size)


def grid_from(s: HloSharding, rank: int, labels: Sequence[Role | None]) -> Grid | None:
    """The grid of sharding ``s`` of a rank-``rank`` array whose dim d plays ``labels[d]``
    (dims without a role are made whole first)."""
    if s.is_replicated:
        return None
    if not s.is_tiled or s.subgroup_types or s.is_manual:
        return None
    keep = [d for d in range(rank) if labels[d] is not None]
    s = partial_replicate_all_except(s, keep)
    if not s.is_tiled:
        return None
    arr = s.tile_assignment.array()
    roles: list[Role | None] = [labels[d] if arr.shape[d] > 1 else None for d in range(rank)]
    roles += [None] * (arr.ndim - rank)
    if all(r is None for r in roles):
        return None
    return Grid(arr, roles)


def _coords(grid: Grid, n: int) -> tuple[np.ndarray, list[int], list[Role | None]]:
    """[n, k] tile coordinates of every logical device along the grid's role axes."""
    axes = [a for a, r in enumerate(grid.roles) if r is not None]
    idx = np.stack(np.unravel_index(np.arange(grid.arr.size), grid.arr.shape), axis=1)
    out = np.zeros((n, len(axes)), dtype=np.int64)
    out[grid.arr.ravel()] = idx[:, axes]
    return out, [grid.arr.shape[a] for a in axes], [grid.roles[a] for a in axes]


def combine(first: Grid | None, second: Grid | None, n: int) -> Grid | None:
    """One grid with the role axes of both (the second's roles must be new ones), when the
    two shardings' device layouts are independent: every combination of coordinates is
    held by the same number of devices. Vectorized over devices."""
    if first is None or second is None:
        return None
    c1, t1, r1 = _coords(first, n)
    c2, t2, r2 = _coords(second, n)
    kinds1 = {tuple(sorted(dict(r[1]).items())) for r in r1}
    if any(tuple(sorted(dict(r[1]).items())) in kinds1 for r in r2):
        return None
    sizes = t1 + t2
    total = int(np.prod(sizes, dtype=np.int64))
    if total <= 1 or n % total:
        return None
    key = np.ravel_multi_index(tuple(np.concatenate([c1, c2], axis=1).T), sizes) \
        if sizes else np.zeros(n, np.int64)
    rep = n // total
    if not np.all(np.bincount(key, minlength=total) == rep):
        return None
    order = np.lexsort((np.arange(n), key))
    arr = order.reshape(sizes + [rep])
    return Grid(arr, list(r1) + list(r2) + [None])


def only(labels: Sequence[Role | None], kind: str) -> list[Role | None]:
    return [lab if lab is not None and lab[0] == kind else None for lab in labels]


def _dedupe(grids: Sequence[Grid | None]) -> list[Grid]:
    out: list[Grid] = []
    for g in grids:
        if g is None:
            continue
        if any(o.arr.shape == g.arr.shape and np.array_equal(o.arr, g.arr) and o.roles == g.roles
               for o in out):
            continue
        out.append(g)
    return out


def _plain_sharding(s: HloSharding) -> bool:
    """Whether an operand's current sharding is one the grid strategies understand."""
    return not (s.is_tuple or s.is_manual or s.is_maximal or s.subgroup_types)


def _wanted(ctx: PartitionContext, inst: Instruction) -> HloSharding | None:
    return _wanted_sharding(ctx.sharding_of(inst))


def _wanted_sharding(s: HloSharding) -> HloSharding | None:
    if s.is_tuple:
        leaves = list(s.tuple_elements)
        if any(l != leaves[0] for l in leaves):
            return None
        s = leaves[0]
    if s.is_manual or s.is_maximal or s.subgroup_types:
        return None
    return s


def _source_callers(ctx: PartitionContext) -> Callable[[object], list]:
    """The call sites of a computation of the module being partitioned, for the iota
    detection of implicit batching dims (it follows a loop or branch parameter to the
    value passed in). Asked rarely: only for indices read from such a parameter."""
    module = ctx.state.source

    def callers(comp: object) -> list:
        return [i for c in module.computations for i in c.instructions
                if any(cc is comp for cc in i.called_computations)]
    return callers


# -- plans as data ----------------------------------------------------------------------------
def _replicated_key(ctx: PartitionContext, inst: Instruction,
                    vals: Sequence[PValue]) -> tuple[float, float]:
    """The price of ``handle_replicated`` (strategy.replicated_price), as a key."""
    price = replicated_price(ctx, inst.shape, vals, ctx.sharding_of(inst))
    return Strategy(None, *price, lambda: None).key()


# -- indices arithmetic -----------------------------------------------------------------------
def _index_parts(ctx: PartitionContext, idx: Instruction, ivd: int, count: int) -> list[Instruction]:
    """The ``count`` components of the index vector, each of the indices' batch shape."""
    b = ctx.b
    if ivd == idx.shape.rank:
        return [idx]
    dims = list(idx.shape.dims)
    out = []
    for k in range(count):
        lo = [0] * len(dims)
        hi = list(dims)
        lo[ivd], hi[ivd] = k, k + 1
        part = b.slice(idx, lo, hi, [1] * len(dims))
        out.append(b.reshape(part, [d for i, d in enumerate(dims) if i != ivd]))
    return out


def _join_parts(ctx: PartitionContext, parts: list[Instruction], ivd: int, rank: int) -> Instruction:
    if ivd == rank:
        return parts[0]
    b = ctx.b
    shaped = []
    for p in parts:
        dims = list(p.shape.dims)
        shaped.append(b.reshape(p, dims[:ivd] + [1] + dims[ivd:]))
    return shaped[0] if len(shaped) == 1 else b.concatenate(shaped, ivd)


def _shard_start(ctx: PartitionContext, s: HloSharding, dims, dim: int, like: Instruction) -> Instruction:
    """This device's start offset along ``dim`` of sharding ``s``, in ``like``'s type."""
    table = device_offsets(s, dims, num_devices=ctx.num_devices)[:, dim]
    off = ctx.logical_table(table)
    et = like.shape.element_type
    return off if et == PrimitiveType.S32 else ctx.b.convert(off, et)


def _bcast(ctx: PartitionContext, x: Instruction, like: Instruction) -> Instruction:
    return ctx.b.broadcast(x, list(like.shape.dims), []) if like.shape.rank else x


def _identity(combiner: str | None, et: PrimitiveType):
    """The identity of scatter combiner ``combiner`` on ``et`` (a numpy scalar), or None."""
    if combiner is None:
        return None
    try:
        return pad_value_identity(combiner, et)
    except ValueError:
        return None


def _combine_op(et: PrimitiveType) -> str:
    return "or" if et == PRED else "add"


# -- gather -----------------------------------------------------------------------------------
@with_cause("reduction")
def _emit_gather(ctx: PartitionContext, inst: Instruction, gd: GatherDims, grid: Grid,
                 target: HloSharding, vals: Sequence[PValue]) -> PValue:
    b = ctx.b
    op_shape, idx_shape = inst.operands[0].shape, inst.operands[1].shape
    op_s = grid.sharding_for("op", gd.rank)
    idx_s = grid.sharding_for("idx", gd.idx_rank)
    out_s = grid.sharding_for("out", gd.out_rank)
    x = reshard(ctx, vals[0], op_s).hlo
    idx = reshard(ctx, vals[1], idx_s).hlo
    tiles = op_s.tile_dims_for_data(gd.rank) if op_s.is_tiled else (1,) * gd.rank
    # (An indexed dim sliced whole is pass-through: its start clamps to 0 on every shard.)
    triv = [p for p in range(gd.rank) if p in gd.index_map and tiles[p] > 1
            and gd.sizes[p] < op_shape.dims[p] and p not in gd.parallel]
    par = [p for p in gd.parallel if tiles[p] > 1]
    mask = None
    if triv or par:
        parts = _index_parts(ctx, idx, gd.ivd, len(gd.index_map))
        local_rows = x.shape.dims
        for p in par:
            # An implicit batching dim: the indices count the operand's global rows and
            # both are split alike, so each device's indices fall in its own rows.
            k = gd.index_map.index(p)
            v = parts[k]
            parts[k] = b.subtract(v, _bcast(ctx, _shard_start(ctx, op_s, op_shape.dims, p, v), v))
        for p in triv:
            if gd.sizes[p] > 1:  # a wide window: every shard also holds the rows after it
                x = _extend_by_window(ctx, x, op_s, op_shape.dims, p, gd.sizes[p])
        for p in triv:
            k = gd.index_map.index(p)
            v = parts[k]
            # The unpartitioned gather clamps the start into the operand: clamp first, then
            # the window's start row belongs to exactly one shard.
            c = b.clamp(b.scalar(0, v), v, b.scalar(op_shape.dims[p] - gd.sizes[p], v))
            start = _bcast(ctx, _shard_start(ctx, op_s, op_shape.dims, p, v), v)
            end = b.add(start, _bcast(ctx, b.scalar(local_rows[p], v), v))
            ok = b.and_(b.compare(c, start, "GE"), b.compare(c, end, "LT"))
            mask = ok if mask is None else b.and_(mask, ok)
            parts[k] = b.subtract(c, start)
        idx = _join_parts(ctx, parts, gd.ivd, idx_shape.rank)
    attrs = copy_attrs(inst)
    attrs.ClearField("gather_slice_sizes")
    attrs.gather_slice_sizes.extend(
        [x.shape.dims[p] if p in gd.offset_of and gd.sizes[p] == op_shape.dims[p] else gd.sizes[p]
         for p in range(gd.rank)])
    y = b.op("gather", [x, idx], attrs, name=inst.name)
    if mask is not None:
        batch_positions = [gd.batch_out[j] for j in sorted(gd.batch_out)]
        m = b.broadcast(mask, list(y.shape.dims), batch_positions)
        y = b.select(m, y, b.broadcast(b.scalar(0, y), list(y.shape.dims), []))
        y = ctx.f.all_reduce(y, _combine_op(y.shape.element_type),
                             grid.groups(grid.axes("triv")))
    return reshard(ctx, PValue(y, inst.shape, out_s), target)


def _window_extension(op_s: HloSharding, dims, p: int, width: int):
    """(tiles, local rows, starts, extended rows) of shards along ``p`` that also hold the
    ``width - 1`` rows after them (so a window starting in the shard is local)."""
    t = op_s.tile_dims_for_data(len(dims))[p]
    rows = -(-int(dims[p]) // t)
    return t, rows, np.arange(t, dtype=np.int64) * rows, rows + int(width) - 1


def _extend_by_window(ctx: PartitionContext, x: Instruction, op_s: HloSharding, dims,
                      p: int, width: int) -> Instruction:
    from hlo_spmd.passes.partition.halo import exchange_window, tile_index_table

    _, _, starts, ext = _window_extension(op_s, dims, p, width)
    return exchange_window(ctx, x, op_s, op_s, p, int(dims[p]), starts, ext,
                           tile_index_table(ctx, op_s, p))


def _window_extension_bytes(shape: Shape, op_s: HloSharding, p: int, width: int) -> float:
    """Bytes per device ``_extend_by_window`` sends (halo.plan_window's rows)."""
    from hlo_spmd.passes.partition.halo import plan_window

    t, rows, starts, ext = _window_extension(op_s, shape.dims, p, width)
    plan = plan_window(t, t, rows, int(shape.dims[p]), starts, ext)
    local = tile_shape(op_s, shape.dims)
    row = math.prod(int(v) for k, v in enumerate(local) if k != p) * itemsize(shape)
    return plan.rows * row


def _price_gather(ctx: PartitionContext, inst: Instruction, gd: GatherDims, grid: Grid,
                  target: HloSharding, vals: Sequence[PValue]) -> tuple[float, float]:
    """(bytes, largest new array) of ``_emit_gather`` with ``grid``: what it reshards, the
    all-reduce over the trivially sliced devices, the result's reshard."""
    op_s = grid.sharding_for("op", gd.rank)
    idx_s = grid.sharding_for("idx", gd.idx_rank)
    out_s = grid.sharding_for("out", gd.out_rank)
    nbytes, peak = moves(ctx, [(vals[0], op_s), (vals[1], idx_s)])
    y = local_bytes(inst.shape, out_s)
    peak = max(peak, y)
    triv = grid.axes("triv")
    if triv:
        k = int(math.prod(grid.arr.shape[a] for a in triv))
        nbytes += bytes_per_device("all-reduce", y, y, k)
        peak = max(peak, local_bytes(inst.operands[1].shape, idx_s))
        tiles = op_s.tile_dims_for_data(gd.rank)
        for q in gd.index_map:
            if tiles[q] > 1 and gd.sizes[q] > 1:
                nbytes += _window_extension_bytes(inst.operands[0].shape, op_s, q, gd.sizes[q])
    b, p = result_move(ctx, inst.shape, out_s, target)
    return nbytes + b, max(peak, p)


@handles("gather")
def handle_gather(ctx: PartitionContext, inst: Instruction) -> PValue:
    if any(d == 0 for s in (inst.shape, *[o.shape for o in inst.operands]) for d in s.dims):
        return handle_replicated(ctx, inst)
    return _plan_and_emit(ctx, inst, _gather_strategies)


def _gather_strategies(ctx: PartitionContext, inst: Instruction, vals: Sequence[PValue],
                       target: HloSharding | None) -> list[Strategy]:
    """The grid strategies for ``inst`` on operand values ``vals`` (shardings of the current
    device group) towards ``target``, priced; none when a sharding is not one they
    understand."""
    if target is None or not all(_plain_sharding(v.sharding) for v in vals):
        return []
    gd = GatherDims.of(inst)
    implicit = gather_parallel_dims(inst, _source_callers(ctx))
    if implicit is not None:
        gd.parallel = dict(zip(implicit.operand, implicit.indices))
    op_dims = inst.operands[0].shape.dims
    n = ctx.num_devices
    op_labels = gd.operand_labels(op_dims)
    for p in gd.index_map:
        # A window wider than one row on an indexed dim: read where its start row lives,
        # from the shard extended by the rows after it (a windowed read, not the whole dim).
        if op_labels[p] is None and 1 < gd.sizes[p] < int(op_dims[p]):
            op_labels[p] = ("triv", (("op", p),))
    from_op = grid_from(vals[0].sharding, gd.rank, op_labels)
    idx_s = vals[1].sharding
    idx_index = grid_from(idx_s, gd.idx_rank, only(gd.index_labels(), "index"))
    out_index = grid_from(target, gd.out_rank, only(gd.output_labels(op_dims), "index"))
    grids = _dedupe([
        from_op,
        grid_from(idx_s, gd.idx_rank, gd.index_labels()),
        grid_from(target, gd.out_rank, gd.output_labels(op_dims)),
        # The operand's layout with the indices' own batch sharding on its replicas.
        combine(from_op, idx_index, n),
        combine(from_op, out_index, n),
        # Only one kind of the operand's sharded dims kept, the indices' batch sharding on
        # the devices the other kind used (it shares devices with the index batch).
        *[combine(grid_from(vals[0].sharding, gd.rank, only(op_labels, kind)), other, n)
          for kind in ("triv", "pass", "batch") for other in (idx_index, out_index)],
    ])
    return [Strategy(g, *_price_gather(ctx, inst, gd, g, target, vals),
                     lambda g=g: _emit_gather(ctx, inst, gd, g, target, vals))
            for g in grids]


def _plan_and_emit(ctx: PartitionContext, inst: Instruction,
                   strategies: Callable[..., list[Strategy]]) -> PValue:
    """Price the grid ``strategies`` and the replicated fallback, then emit only the
    cheapest (``Strategy.key``; ties keep the earlier, the fallback comes last). When the
    operands and the result are partially manual over the same device groups (GSPMD 4.4,
    as the dot handler does), the strategies run inside those groups on the non-manual
    rest of the shardings: their collectives act within every manual group at once."""
    vals = [ctx.value(o) for o in inst.operands]
    target = _wanted(ctx, inst)
    inner = _manual_inner(ctx, inst, vals)
    if inner is None:
        cands = strategies(ctx, inst, vals, target)
        outer = None
    else:
        groups, inner_vals, inner_target = inner
        cands = strategies(ctx.in_group(ctx.grouping.subgroup(groups)), inst, inner_vals,
                           inner_target)
        outer = ctx.sharding_of(inst)
    best = cheapest(cands)
    if best is None or _replicated_key(ctx, inst, vals) < best.key():
        return handle_replicated(ctx, inst)
    pv = best.emit()
    return pv if outer is None else PValue(pv.hlo, inst.shape, outer)


def _manual_inner(ctx: PartitionContext, inst: Instruction, vals: Sequence[PValue]):
    """(manual groups, the operand values and the wanted result as seen inside them) when
    every operand and the result are partially manual over the same groups, else None."""
    full = ctx.sharding_of(inst)
    leaves = list(full.tuple_elements) if full.is_tuple else [full]
    shardings = [v.sharding for v in vals] + leaves
    if any(s.is_tuple for s in shardings):
        return None
    ranks = [o.shape.rank for o in inst.operands] + [
        s.rank for s in (inst.shape.tuple_shapes if inst.shape.is_tuple else [inst.shape])]
    found = manual_groups(shardings, ranks)
    if found is None:
        return None
    groups, inner = found
    if any(g is None for g in inner):
        return None
    in_vals = [v.with_hlo(v.hlo, g) for v, g in zip(vals, inner)]
    outs = inner[len(vals):]
    if any(o != outs[0] for o in outs):
        return None
    return groups, in_vals, outs[0]


# -- scatter ----------------------------------------------------------------------------------
# Combiners whose partial results (one per share of the updates) combine with an
# all-reduce: add (shares scattered into zeros, then added to the operand) and the
# idempotent ones (each share scattered into the operand itself).
_COMBINABLE = IDEMPOTENT_REDUCERS | {"add"}


@with_cause("reduction")
def _emit_scatter(ctx: PartitionContext, inst: Instruction, sd: ScatterDims, grid: Grid,
                  target: HloSharding, combiner: str | None,
                  vals: Sequence[PValue]) -> PValue:
    b = ctx.b
    n = len(inst.operands) // 2
    op_shape, idx_shape = inst.operands[0].shape, inst.operands[n].shape
    op_s = grid.sharding_for("op", sd.rank)
    idx_s = grid.sharding_for("idx", sd.idx_rank)
    upd_s = grid.sharding_for("upd", sd.upd_rank)
    out_s = grid.sharding_for("out", sd.rank)
    xs = [reshard(ctx, vals[i], op_s).hlo for i in range(n)]
    idx = reshard(ctx, vals[n], idx_s).hlo
    ups = [reshard(ctx, vals[n + 1 + i], upd_s).hlo for i in range(n)]
    tiles = op_s.tile_dims_for_data(sd.rank) if op_s.is_tiled else (1,) * sd.rank
    upd_dims = inst.operands[n + 1].shape.dims
    # A sharded indexed dim with a whole-dim window is pass-through; its indices still go
    # through the masking below, so that a window out of bounds globally stays dropped.
    whole = [p for p in range(sd.rank) if p in sd.index_map and tiles[p] > 1
             and p in sd.window_of and upd_dims[sd.window_of[p]] == op_shape.dims[p]]
    triv = [p for p in range(sd.rank) if p in sd.index_map and tiles[p] > 1
            and p not in whole and p not in sd.parallel]
    par = [p for p in sd.parallel if tiles[p] > 1]
    spare = None
    idx_pv = PValue(idx, idx_shape, idx_s)
    padded = [j for j in padded_dims(idx_pv) if j != sd.ivd]
    if triv or padded or whole or par:
        # Indices relative to this shard. Updates for rows elsewhere, the windows the
        # unpartitioned scatter drops (out of bounds) and the padding of unevenly split
        # indices must change nothing, and no local index may be out of bounds: XLA's CPU
        # backend does not drop an out-of-bounds window of a scatter whose operand is a
        # dynamic-slice (checked with jaxlib 0.10.2). With a combiner that has an
        # identity they become identity updates; otherwise they go to spare rows
        # appended to the shard along one indexed dim and cut off afterwards.
        parts = _index_parts(ctx, idx, sd.ivd, len(sd.index_map))
        windows = [upd_dims[sd.window_of[p]] if p in sd.window_of else 1
                   for p in sd.index_map]
        valid = None
        if padded:
            valid = _index_parts(ctx, valid_mask(ctx, idx_pv, padded), sd.ivd, 1)[0]
        for k, p in enumerate(sd.index_map):
            v = parts[k]
            zero = _bcast(ctx, b.scalar(0, v), v)
            ok = b.and_(b.compare(v, zero, "GE"),
                        b.compare(v, _bcast(ctx, b.scalar(op_shape.dims[p] - windows[k], v), v),
                                  "LE"))
            if p in triv or p in par:
                # (An implicit batching dim's indices fall in this shard's rows already.)
                start = _bcast(ctx, _shard_start(ctx, op_s, op_shape.dims, p, v), v)
                parts[k] = b.subtract(v, start)
                rows = _bcast(ctx, b.scalar(xs[0].shape.dims[p], v), v)
                ok = b.and_(ok, b.and_(b.compare(parts[k], zero, "GE"),
                                       b.compare(parts[k], rows, "LT")))
            valid = ok if valid is None else b.and_(valid, ok)
        identity = _identity(combiner, ups[0].shape.element_type) if n == 1 else None
        if identity is not None:
            # A combiner with an identity: those updates become the identity, scattered
            # at local index 0 (always in bounds); nothing grows.
            parts = [b.select(valid, v, _bcast(ctx, b.scalar(0, v), v)) for v in parts]
            u = ups[0]
            at = [sd.scatter_upd[j] for j in range(sd.idx_rank) if j != sd.ivd]
            keep = b.broadcast(valid, list(u.shape.dims), at)
            ups = [b.select(keep, u, b.broadcast(b.scalar(identity, u), list(u.shape.dims), []))]
        else:
            spare = triv[0] if triv else sd.index_map[0]
            for k, p in enumerate(sd.index_map):
                v = parts[k]
                elsewhere = xs[0].shape.dims[p] if p == spare else 0
                parts[k] = b.select(valid, v, _bcast(ctx, b.scalar(elsewhere, v), v))
            # The spare rows hold one local window along the spare dim.
            sw = sd.window_of.get(spare)
            spare_rows = ups[0].shape.dims[sw] if sw is not None else 1
        idx = _join_parts(ctx, parts, sd.ivd, idx_shape.rank)
    partial = bool(grid.axes("index"))
    base = xs
    if partial and combiner == "add":
        # Each device scatters its share of the updates into zeros; the sum of the shares
        # plus the operand is the result.
        base = [b.broadcast(b.scalar(0, x), list(x.shape.dims), []) for x in xs]
    if spare is not None:
        high = [spare_rows if d == spare else 0 for d in range(sd.rank)]
        base = [b.pad(x, b.scalar(0, x), [0] * sd.rank, high) for x in base]
    local_shape = (Shape.tuple_of([x.shape for x in base]) if n > 1 else base[0].shape)
    y = b.op("scatter", [*base, idx, *ups], copy_attrs(inst),
             [ctx.clone(c) for c in inst.called_computations], declared=local_shape,
             name=inst.name)
    if spare is not None:
        dims = list(xs[0].shape.dims)
        cut = [b.slice(b.get_tuple_element(y, i) if n > 1 else y, [0] * sd.rank, dims,
                       [1] * sd.rank) for i in range(n)]
        y = b.tuple(cut) if n > 1 else cut[0]
    if partial:
        y = ctx.f.all_reduce(y, combiner, grid.groups(grid.axes("index")))
        if combiner == "add":
            y = b.add(xs[0], y)
    return reshard(ctx, PValue(y, inst.shape,
                               HloSharding.tuple([out_s] * n) if n > 1 else out_s), target)


def _price_scatter(ctx: PartitionContext, inst: Instruction, sd: ScatterDims, grid: Grid,
                   target: HloSharding, combiner: str | None,
                   vals: Sequence[PValue]) -> tuple[float, float]:
    """(bytes, largest new array) of ``_emit_scatter`` with ``grid``."""
    n = len(inst.operands) // 2
    op_s = grid.sharding_for("op", sd.rank)
    idx_s = grid.sharding_for("idx", sd.idx_rank)
    upd_s = grid.sharding_for("upd", sd.upd_rank)
    out_s = grid.sharding_for("out", sd.rank)
    nbytes, peak = moves(ctx, [(vals[i], op_s) for i in range(n)] + [(vals[n], idx_s)]
                          + [(vals[n + 1 + i], upd_s) for i in range(n)])
    ys = [local_bytes(inst.operands[i].shape, op_s) for i in range(n)]
    peak = max(peak, *ys)
    tiles = op_s.tile_dims_for_data(sd.rank) if op_s.is_tiled else (1,) * sd.rank
    if any(p in sd.index_map and tiles[p] > 1 for p in range(sd.rank)):
        peak = max(peak, local_bytes(inst.operands[n].shape, idx_s))
    index = grid.axes("index")
    if index:
        k = int(math.prod(grid.arr.shape[a] for a in index))
        nbytes += sum(bytes_per_device("all-reduce", y, y, k) for y in ys)
    leaves = list(target.tuple_elements) if target.is_tuple else [target]
    for i, t in enumerate(leaves):
        b, p = result_move(ctx, inst.operands[i].shape, out_s, t)
        nbytes, peak = nbytes + b, max(peak, p)
    return nbytes, peak


@handles("scatter")
def handle_scatter(ctx: PartitionContext, inst: Instruction) -> PValue:
    if any(d == 0 for o in inst.operands for d in o.shape.dims):
        return handle_replicated(ctx, inst)
    return _plan_and_emit(ctx, inst, _scatter_strategies)


def _scatter_strategies(ctx: PartitionContext, inst: Instruction, vals: Sequence[PValue],
                        target: HloSharding | None) -> list[Strategy]:
    """The grid strategies for ``inst``, priced (as ``_gather_strategies``)."""
    if target is None or not all(_plain_sharding(v.sharding) for v in vals):
        return []
    n = len(inst.operands) // 2
    sd = ScatterDims.of(inst)
    implicit = scatter_parallel_dims(inst, _source_callers(ctx)) if n == 1 else None
    if implicit is not None:
        sd.parallel = dict(zip(implicit.operand, implicit.indices))
    op_dims = inst.operands[0].shape.dims
    upd_dims = inst.operands[n + 1].shape.dims
    opcode = reducer_opcode(inst.called_computations[0]) if n == 1 else None
    combiner = opcode if opcode in _COMBINABLE else None
    if combiner is not None and inst.shape.element_type == PRED and combiner == "add":
        combiner = None
    combinable = combiner is not None
    norm_target = HloSharding.tuple([target] * n) if n > 1 else target
    op_labels = sd.operand_labels(op_dims, upd_dims)
    from_op = grid_from(vals[0].sharding, sd.rank, op_labels)
    n_dev = ctx.num_devices
    idx_index = grid_from(vals[n].sharding, sd.idx_rank,
                          only(sd.index_labels(combinable), "index"))
    upd_index = grid_from(vals[n + 1].sharding, sd.upd_rank,
                          only(sd.update_labels(op_dims, upd_dims, combinable), "index"))
    srcs = [
        from_op,
        combine(from_op, idx_index, n_dev),
        combine(from_op, upd_index, n_dev),
        # One kind of the operand's sharded dims kept (as for gather).
        *[combine(grid_from(vals[0].sharding, sd.rank, only(op_labels, kind)), other, n_dev)
          for kind in ("triv", "pass", "batch") for other in (idx_index, upd_index)],
        grid_from(vals[n].sharding, sd.idx_rank, sd.index_labels(combinable)),
        grid_from(vals[n + 1].sharding, sd.upd_rank,
                  sd.update_labels(op_dims, upd_dims, combinable)),
        grid_from(target, sd.rank, [lab if lab is None or lab[0] != "index" else None
                                    for lab in sd.operand_labels(op_dims, upd_dims)]),
    ]
    return [Strategy(g, *_price_scatter(ctx, inst, sd, g, norm_target, combiner, vals),
                     lambda g=g: _emit_scatter(ctx, inst, sd, g, norm_target, combiner, vals))
            for g in _dedupe(srcs)]
