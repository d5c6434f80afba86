"""The convolution handler: a convolution is a dot with windowed dims (XLA's
PartitionConvolution in spmd/convolution_handler.cc, which reuses its dot handler).

* Batch, input feature, output feature and the degenerate spatial dims the shared dims
  model (passes/dot_conv_dims) reads as dot dims are partitioned by the dot planner
  (support/dot_plan) with its cost-based choice and recursive grouping; a callback emits
  the per-device convolution (window sizes of contracting-like spatial dims and the group
  counts rescaled to the local shapes). A batch-partitioned convolution moves nothing.
  ``feature_group_count`` (depthwise) and ``batch_group_count`` (their filter gradients):
  the grouped features form a batch dim; shards hold whole groups, so tilings that do
  not divide the group count are dropped first.
* Windowed spatial dims (GSPMD 4.3): when the result (or else the input) tiles some,
  devices are grouped by those tiles (GSPMD 4.4); the input is resharded to that tiling
  and every device gets the input window its output tile reads from the shared halo
  utility (passes/partition/halo: collective-permutes of the largest halo per side,
  multi-hop when wider than a shard, or an all-gather when cheaper), out-of-range
  elements are zeroed, and the window runs with no padding on that dim; the rest is the
  dot planner's problem inside the groups. An input that holds such a dim whole cuts
  its window locally. Base (lhs) dilation ``d`` (transposed convolutions): every tile
  runs one static window (low padding ``P``) over input elements starting at a
  per-tile element, computes ``e[k]`` extra leading output rows, and cuts its rows out
  at ``e[k]`` (XLA's three cases: output rows per tile x stride a multiple of ``d``, so
  ``e = 0``; stride 1 with the largest low padding any tile needs; a non-unit stride
  with extra window padding -- here one search over ``P`` covers all three).
* Windowed dims tiled on the kernel (the filter gradient jax.grad emits, whose "kernel"
  is the output gradient, sharded like the images): devices are grouped by the kernel's
  (or the input's) tiles, each convolves its kernel rows (read backwards for a reversed
  window) with the input rows they meet (a halo exchange on the input), and the partial
  results are all-reduced across the groups (XLA's halo exchange on the LHS with a
  sharded RHS).
* Which way: the ways that apply (kernel halos, input halos, or every windowed dim whole
  with the planner's plan and a final reshard, e.g. a grouped convolution's filter
  gradient whose small result tiles a windowed dim) are priced by the one cost model
  (operand reshards, halo rows, the plan inside the groups, the all-reduce, the result's
  reshard) and the cheapest is emitted. The planner never tiles a windowed or extra dim
  but takes operands and results tiled on them and prices their reshards (an all-to-all
  moving the tiles to a group dim instead of a gather).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.primitive_types import element_bytes
from hlo_spmd.ir.shape_inference import array_shape
from hlo_spmd.passes.dot_conv_dims import DotDims, WindowDim, batch_window, rhs_nc_window
from hlo_spmd.passes.partition.causes import with_cause
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.halo import (dilated_window_need, drop_extra_rows,
                                            exchange_window, mask_outside, plan_window,
                                            source_order, tile_index_table, tiles_of)
from hlo_spmd.passes.partition.support.common import copy_attrs
from hlo_spmd.passes.partition.handlers.dot import partition_dot
from hlo_spmd.passes.partition.support.dot_dims import (data_tiles, group0_view, is_plain,
                                                       regroup, ungroup_to)
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.registry import handles
from hlo_spmd.passes.partition.reshard import reshard_cost
from hlo_spmd.sharding import HloSharding, group_by_dims, partial_replicate

LHS, RHS, OUT = 0, 1, 2


@handles("convolution")
def handle_convolution(ctx: PartitionContext, inst: Instruction) -> PValue:
    if len(inst.operands) != 2:  # block-scaled (scale operands): whole-value fallback
        from hlo_spmd.passes.partition.handlers.basic import handle_replicated

        return handle_replicated(ctx, inst)
    dims = DotDims.of(inst)
    lhs, rhs = ctx.value(inst.operands[0]), ctx.value(inst.operands[1])
    target = ctx.sharding_of(inst)
    return partition_convolution(ctx, inst, dims, lhs, rhs, target)


def partition_convolution(ctx: PartitionContext, inst: Instruction, dims: DotDims,
                          lhs: PValue, rhs: PValue, target: HloSharding) -> PValue:
    """``inst`` on partitioned operands, with sharding ``target``."""
    shardings = (lhs.sharding, rhs.sharding, target)
    if not all(is_plain(s) for s in shardings):
        # Manual and partially manual convolutions: the dot path handles them as dots.
        return partition_dot(ctx, inst, dims, _untile(ctx, inst, lhs, dims, LHS),
                             _untile(ctx, inst, rhs, dims, RHS), target, local_convolution)
    # The ways that apply, priced by the one cost model; the cheapest is emitted (ties:
    # the kernel's halo way, then the input's halo way, then whole windows).
    kernel = _kernel_halo_dims(ctx, dims, lhs, rhs, target)
    spatial = _halo_dims(dims, lhs, target)
    setup = _spatial_setup(dims, lhs, rhs, target, spatial) if spatial else None
    whole = _planner_price(ctx, inst, dims, lhs, rhs, target)
    halo = math.inf
    if setup is not None:
        # The input either kept whole on the windowed dims it holds whole (windows cut
        # locally; gathered first if tiled elsewhere) or moved to the tiles of the groups
        # (an all-to-all, then halos): the cheaper.
        options = [setup] if setup.held == setup.lhs_outer else \
            [setup, setup._replace(held=setup.lhs_outer)]
        if _in_other_order(ctx, dims, lhs.sharding, setup):
            options.append(setup._replace(held=lhs.sharding))   # (as for the kernel's)
        halo, setup = min(((_spatial_price(ctx, inst, dims, lhs, rhs, target, o), i, o)
                           for i, o in enumerate(options)), key=lambda x: x[:2])[::2]
    if kernel:
        ks = _kernel_setup(dims, lhs, rhs, target, kernel)
        options = [ks] if ks.held == ks.lhs_outer else [ks, ks._replace(held=ks.lhs_outer)]
        if _in_other_order(ctx, dims, lhs.sharding, ks):
            # The input as it is: the halo pieces travel between the devices that hold
            # them, with no permute of the whole input to the kernel's device order.
            options.append(ks._replace(held=lhs.sharding))
        price, ks = min(((_kernel_price(ctx, inst, dims, lhs, rhs, target, o), i, o)
                         for i, o in enumerate(options)), key=lambda x: x[:2])[::2]
        if price <= min(whole, halo):
            return _partition_kernel_spatial(ctx, inst, dims, lhs, rhs, target, ks)
    if setup is None or whole < halo:
        # The windowed dims whole on every device (the operands untiled there; a result
        # tiled on them is cut or resharded afterwards, priced by the planner): the
        # grouped-convolution filter gradient whose result tiles a spatial dim is one
        # local convolution and a small reshard of the result, not a gathered input.
        out = partition_dot(ctx, inst, dims, _untile(ctx, inst, lhs, dims, LHS),
                            _untile(ctx, inst, rhs, dims, RHS), _work(dims, target, OUT),
                            local_convolution)
        return ctx.reshard(out, target)
    return _partition_spatial(ctx, inst, dims, lhs, rhs, target, setup)


# -- which dims the planner may tile ---------------------------------------------------------
def _bad_group_dims(dims: DotDims, which: int, s: HloSharding) -> list[int]:
    """Dims of a grouped convolution whose tiling would split a feature / batch group."""
    c = dims.conv
    if c is None or not s.is_tiled:
        return []
    count = max(c.feature_group_count, c.batch_group_count)
    if count == 1:
        return []
    if c.feature_group_count > 1:
        d = (c.in_feature, c.k_out, c.out_feature)[which]
    else:
        d = (c.in_batch, c.k_out, c.out_feature)[which]
    rank = (dims.lhs_rank, dims.rhs_rank, dims.out_rank)[which]
    t = data_tiles(s, rank)[d]
    return [d] if t > 1 and count % t else []


def _clean(dims: DotDims, which: int, s: HloSharding, keep: Sequence[int] = ()) -> HloSharding:
    """``s`` without tiling on the dims the planner must not tile (except ``keep``)."""
    if not s.is_tiled:
        return s
    rank = (dims.lhs_rank, dims.rhs_rank, dims.out_rank)[which]
    tiles = data_tiles(s, rank)
    drop = [d for d in dims.untiled(which) if d not in keep and tiles[d] > 1]
    drop += _bad_group_dims(dims, which, s)
    return partial_replicate(s, drop) if drop else s


def _untile(ctx: PartitionContext, inst: Instruction, pv: PValue, dims: DotDims,
            which: int) -> PValue:
    """``pv`` resharded so the planner may use it: untiled on the dims it must not tile."""
    if not is_plain(pv.sharding):
        return pv
    return ctx.reshard(pv, _groups_whole(dims, which, pv.sharding))


def _groups_whole(dims: DotDims, which: int, s: HloSharding) -> HloSharding:
    """``s`` without tiles that split a feature / batch group. Tiles of the windowed and
    extra dims stay: the planner leaves those dims whole in every block and prices the
    reshard (an all-to-all moving the tiles to a batch dim, say, not a gather)."""
    bad = _bad_group_dims(dims, which, s)
    return partial_replicate(s, bad) if bad else s


def _inner_sharding(dims: DotDims, s: HloSharding, which: int, x_dims, groups: np.ndarray,
                    sizes: tuple[int, ...]) -> HloSharding:
    """``s`` (of operand / result ``which``) as seen inside one device group of ``groups``,
    which tiles ``x_dims`` into ``sizes`` pieces; dims the planner must not tile cleared."""
    rank = (dims.lhs_rank, dims.rhs_rank, dims.out_rank)[which]
    s = _clean(dims, which, s, keep=x_dims or ())
    exact = regroup(s, rank, groups, x_dims, sizes)
    inner = exact if exact is not None else group0_view(s, rank, groups, x_dims)
    return _clean(dims, which, inner)


def _work(dims: DotDims, target: HloSharding, which: int) -> HloSharding:
    """The sharding the planner aims at: ``target`` without tiles that split a group (the
    planner leaves the dims it must not tile whole and prices reshards to ``target``)."""
    if not is_plain(target):
        return HloSharding.replicate()
    bad = _bad_group_dims(dims, which, target)
    return partial_replicate(target, bad) if bad else target


# -- prices of the two ways (bytes per device, the planner's cost model) ------------------------
def _planner_price(ctx: PartitionContext, inst: Instruction, dims: DotDims, lhs: PValue,
                   rhs: PValue, target: HloSharding) -> float:
    """Bytes of the whole-window way: both operands untiled on the windowed dims, the
    planner's plan, its final reshard to ``target``."""
    from hlo_spmd.passes.partition.handlers.dot import _PLANNER, _ebytes
    from hlo_spmd.passes.partition.support.dot_plan import Problem

    n = ctx.num_devices
    eb = (_ebytes(lhs.hlo), _ebytes(rhs.hlo), float(element_bytes(inst.shape.element_type)))
    ls, rs = _groups_whole(dims, LHS, lhs.sharding), _groups_whole(dims, RHS, rhs.sharding)
    lshape, rshape = tuple(lhs.base_shape.dims), tuple(rhs.base_shape.dims)
    moved = (reshard_cost(lshape, eb[0], lhs.sharding, ls, n)
             + reshard_cost(rshape, eb[1], rhs.sharding, rs, n))
    plan = _PLANNER.plan(Problem(dims, lshape, rshape, ls, rs, _work(dims, target, OUT), n,
                                 eb))
    out_shape = dims.out_dims(lshape, rshape)
    fin = reshard_cost(out_shape, eb[2], _work(dims, target, OUT), target, n)
    return moved + plan.cost.bytes + fin


def _note_gather(ctx: PartitionContext, inst: Instruction) -> None:
    """Gathering an operand on a windowed dim is the last resort: report it (as the
    replicated fallback is reported, by instruction name and opcode)."""
    entry = (inst.name, inst.opcode)
    if entry not in ctx.state.report.replicated_fallbacks:
        ctx.state.report.replicated_fallbacks.append(entry)


# -- windowed spatial dims --------------------------------------------------------------------
def _halo_dims(dims: DotDims, lhs: PValue, target: HloSharding) -> list[tuple[int, int, int]]:
    """(lhs dim, output dim, window index) of the windowed dims to partition with halos:
    those the result tiles, or else those the input tiles."""
    c = dims.conv
    if c is None:
        return []
    cand = []
    for i, (l, o) in enumerate(zip(c.in_spatial, c.out_spatial)):
        if l in dims.untiled(LHS) and o in dims.untiled(OUT):
            cand.append((l, o, i))
    for ref, which, rank in ((target, 1, dims.out_rank), (lhs.sharding, 0, dims.lhs_rank)):
        if not ref.is_tiled:
            continue
        tiles = data_tiles(ref, rank)
        chosen = [x for x in cand if tiles[x[which]] > 1 and
                  (which == 1 or _output_not_larger(dims.window[x[2]],
                                                    int(lhs.base_shape.dims[x[0]])))]
        if chosen:
            return chosen
    return []


def _output_not_larger(w: WindowDim, size: int) -> bool:
    """A dim only the input tiles is partitioned with halos when the result it makes is
    no larger than the input: the result is then resharded, and gathering a base-dilated
    (up to ``d`` times larger) result would move more than gathering the input."""
    return w.base_dilation == 1 or w.output_size(size) <= size


def _held_whole(dims: DotDims, lhs: PValue, outer: HloSharding,
                l_dims: Sequence[int]) -> HloSharding:
    """``outer`` with the windowed dims the input holds whole left whole: each device cuts
    its window out locally there, no halo travels."""
    if not lhs.sharding.is_tiled:
        whole = list(l_dims)
    else:
        tiles = data_tiles(lhs.sharding, dims.lhs_rank)
        whole = [d for d in l_dims if tiles[d] == 1]
    return partial_replicate(outer, whole) if whole else outer


class _HaloSetup(NamedTuple):
    """How a halo way partitions the windowed dims it groups by (``windowed``: the input-
    driven way's (lhs, out, window) triples, or the kernel-driven way's (lhs, rhs, out,
    window) quadruples): the device groups (one per tile of those dims), the operands' and
    result's shardings inside a group and outside (``held``: the input as resharded
    before the exchange)."""
    windowed: list
    groups: np.ndarray
    sizes: tuple[int, ...]
    inner_l: HloSharding
    inner_r: HloSharding
    inner_o: HloSharding
    lhs_outer: HloSharding
    rhs_outer: HloSharding
    held: HloSharding


def _spatial_setup(dims: DotDims, lhs: PValue, rhs: PValue, target: HloSharding,
                   spatial: list[tuple[int, int, int]]) -> _HaloSetup:
    """Group devices by the tiles of the windowed dims ``spatial`` (of the result when it
    tiles them, else of the input) and derive every sharding the halo way uses."""
    out_tiled = target.is_tiled and any(data_tiles(target, dims.out_rank)[o] > 1
                                        for _, o, _ in spatial)
    ref, ref_dims = (target, [o for _, o, _ in spatial]) if out_tiled else \
        (lhs.sharding, [l for l, _, _ in spatial])
    ref_tiles = data_tiles(ref, dims.out_rank if out_tiled else dims.lhs_rank)
    groups = np.asarray(group_by_dims(ref, ref_dims).device_groups, np.int64)
    sizes = tuple(int(ref_tiles[d]) for d in ref_dims)
    l_dims = [l for l, _, _ in spatial]
    o_dims = [o for _, o, _ in spatial]

    def inner_of(s: HloSharding, which: int, x_dims) -> HloSharding:
        return _inner_sharding(dims, s, which, x_dims, groups, sizes)

    inner_l = inner_of(lhs.sharding, LHS, l_dims)
    inner_r = inner_of(rhs.sharding, RHS, None)
    inner_o = inner_of(target, OUT, o_dims)
    lhs_outer = ungroup_to(groups, dims.lhs_rank, l_dims, sizes, inner_l)
    rhs_outer = ungroup_to(groups, dims.rhs_rank, None, sizes, inner_r)
    held = _held_whole(dims, lhs, lhs_outer, l_dims)
    return _HaloSetup(spatial, groups, sizes, inner_l, inner_r, inner_o, lhs_outer,
                         rhs_outer, held)


def _spatial_windows(ctx: PartitionContext, dims: DotDims, lhs: PValue, st: _HaloSetup,
                     local: list[int]):
    """Per windowed dim of ``st`` in order: (lhs dim, output dim, window index, tiles,
    input starts per tile, input width, the per-tile window, extra rows, the exchange's
    plan), with ``local`` (the input's local dims) updated to the exchanged widths."""
    out = []
    held = st.held
    for (ld, od, i), t in zip(st.windowed, st.sizes):
        size = int(lhs.base_shape.dims[ld])
        xt, lsize = tiles_of(held, dims.lhs_rank)[ld], local[ld]
        order = source_order(ctx, held, st.lhs_outer, ld, dims.lhs_rank)
        starts, width, w, extra = dilated_window_need(
            dims.window[i], size, t,
            lambda st, wd: plan_window(xt, t, lsize, size, st, wd, order=order).key())
        out.append((ld, od, i, t, starts, width, w, extra,
                    plan_window(xt, t, lsize, size, starts, width, order=order)))
        local[ld] = width
    return out


def _spatial_price(ctx: PartitionContext, inst: Instruction, dims: DotDims, lhs: PValue,
                   rhs: PValue, target: HloSharding, st: _HaloSetup) -> float:
    """Bytes of the halo way: the operands' reshards, the halo exchanges, the plan inside
    the groups and the result's reshard to ``target``."""
    from hlo_spmd.passes.partition.handlers.dot import _PLANNER, _ebytes
    from hlo_spmd.passes.partition.support.dot_plan import Problem

    n = ctx.num_devices
    eb = (_ebytes(lhs.hlo), _ebytes(rhs.hlo), float(element_bytes(inst.shape.element_type)))
    lshape, rshape = tuple(lhs.base_shape.dims), tuple(rhs.base_shape.dims)
    moved = (reshard_cost(lshape, eb[0], lhs.sharding, st.held, n)
             + reshard_cost(rshape, eb[1], rhs.sharding, st.rhs_outer, n))
    local = list(ctx.local_shape(lhs.base_shape, st.held).dims)
    window = list(dims.window)
    for ld, _, i, _, _, _, w, _, wplan in _spatial_windows(ctx, dims, lhs, st, list(local)):
        rows = wplan.key()[0]
        if local[ld]:
            moved += rows * float(np.prod(local)) / local[ld] * eb[0]
        local[ld] = wplan.width
        window[i] = w
    lwin = list(lshape)
    for ld, _, _ in st.windowed:
        lwin[ld] = local[ld]
    inner = Problem(dims.with_window(window), tuple(lwin), rshape, st.inner_l, st.inner_r,
                    st.inner_o, int(st.groups.shape[1]), eb)
    moved += _PLANNER.plan(inner).cost.bytes
    o_dims = [o for _, o, _ in st.windowed]
    out = ungroup_to(st.groups, dims.out_rank, o_dims, st.sizes, st.inner_o)
    moved += reshard_cost(dims.out_dims(lshape, rshape), eb[2], out, target, n)
    return moved


def _partition_spatial(ctx: PartitionContext, inst: Instruction, dims: DotDims, lhs: PValue,
                       rhs: PValue, target: HloSharding, st: _HaloSetup) -> PValue:
    """Give every device the input window of its output tile (halo exchange) inside the
    groups of ``st``, and plan the rest inside the groups."""
    c = dims.conv
    assert c is not None
    if any(data_tiles(rhs.sharding, dims.rhs_rank)[d] > 1 for d in dims.untiled(RHS)) \
            if rhs.sharding.is_tiled else False:
        _note_gather(ctx, inst)
    l = ctx.reshard(lhs, st.held)
    r = ctx.reshard(rhs, st.rhs_outer)

    x = l.hlo
    window = list(dims.window)
    lshape = list(lhs.base_shape.dims)
    zero = ctx.b.scalar(0, x)
    extras = []
    for ld, od, i, t, starts, width, w, extra, wplan in _spatial_windows(
            ctx, dims, lhs, st, list(x.shape.dims)):
        size = int(lhs.base_shape.dims[ld])
        window[i] = w
        tidx = tile_index_table(ctx, st.lhs_outer, ld)
        x = exchange_window(ctx, x, st.held, st.lhs_outer, ld, size, starts, width, tidx)
        x = mask_outside(ctx, x, ld, -starts, size - starts, tidx, zero)
        lshape[ld] = width
        if extra.any():
            extras.append((od, extra, tidx))
    inner_dims = dims.with_window(window)
    inner_ctx = ctx.in_group(ctx.grouping.subgroup(st.groups))
    li = PValue(x, lhs.base_shape.with_dims(tuple(lshape)), st.inner_l)
    ri = PValue(r.hlo, rhs.base_shape, st.inner_r)
    res = partition_dot(inner_ctx, inst, inner_dims, li, ri, st.inner_o, local_convolution)
    y = res.hlo
    # Inside the groups the windowed output dims are whole: drop the extra leading rows.
    for od, extra, tidx in extras:
        y = drop_extra_rows(ctx, y, od, extra, tidx)
    o_dims = [o for _, o, _ in st.windowed]
    out = PValue(y, inst.shape, ungroup_to(st.groups, dims.out_rank, o_dims, st.sizes,
                                           st.inner_o))
    return ctx.reshard(out, target)


# -- windowed dims tiled on the kernel ----------------------------------------------------------
def _kernel_halo_dims(ctx: PartitionContext, dims: DotDims, lhs: PValue, rhs: PValue,
                      target: HloSharding) -> list[tuple[int, int, int, int]]:
    """(lhs dim, kernel dim, output dim, window index) of windowed dims that may be
    partitioned along the kernel (the filter gradient jax.grad emits: the "kernel" is the
    output gradient, as large as the image, and sharded like it): the kernel (or else the
    input) tiles them and the result does not. Whether it is the cheapest way is priced
    (``_kernel_price``)."""
    c = dims.conv
    if c is None or not (rhs.sharding.is_tiled or lhs.sharding.is_tiled):
        return []
    rt = data_tiles(rhs.sharding, dims.rhs_rank) if rhs.sharding.is_tiled else \
        (1,) * dims.rhs_rank
    lt = data_tiles(lhs.sharding, dims.lhs_rank) if lhs.sharding.is_tiled else \
        (1,) * dims.lhs_rank
    ot = data_tiles(target, dims.out_rank) if target.is_tiled else (1,) * dims.out_rank
    by_kernel = any(rt[r] > 1 for r in c.k_spatial)
    out = []
    for i, (l, r, o) in enumerate(zip(c.in_spatial, c.k_spatial, c.out_spatial)):
        w = dims.window[i]
        tiled = rt[r] > 1 if by_kernel else lt[l] > 1
        if (tiled and ot[o] == 1 and r in dims.untiled(RHS) and l in dims.untiled(LHS)
                and w.base_dilation == 1):
            out.append((l, r, o, i))
    return out


def _kernel_setup(dims: DotDims, lhs: PValue, rhs: PValue, target: HloSharding,
                  kernel: list[tuple[int, int, int, int]]) -> _HaloSetup:
    r_dims = [r for _, r, _, _ in kernel]
    l_dims = [l for l, _, _, _ in kernel]
    # Group by the kernel's tiles, or by the input's when the kernel holds them whole.
    by_kernel = rhs.sharding.is_tiled and all(
        data_tiles(rhs.sharding, dims.rhs_rank)[r] > 1 for r in r_dims)
    ref, ref_dims = (rhs.sharding, r_dims) if by_kernel else (lhs.sharding, l_dims)
    groups = np.asarray(group_by_dims(ref, ref_dims).device_groups, np.int64)
    rt = data_tiles(ref, dims.rhs_rank if by_kernel else dims.lhs_rank)
    sizes = tuple(int(rt[d]) for d in ref_dims)

    def inner_of(s: HloSharding, which: int, x_dims) -> HloSharding:
        return _inner_sharding(dims, s, which, x_dims, groups, sizes)

    inner_l = inner_of(lhs.sharding, LHS, l_dims)
    inner_r = inner_of(rhs.sharding, RHS, r_dims)
    inner_o = inner_of(target, OUT, None)
    lhs_outer = ungroup_to(groups, dims.lhs_rank, l_dims, sizes, inner_l)
    rhs_outer = ungroup_to(groups, dims.rhs_rank, r_dims, sizes, inner_r)
    held = _held_whole(dims, lhs, lhs_outer, l_dims)
    return _HaloSetup(kernel, groups, sizes, inner_l, inner_r, inner_o, lhs_outer,
                        rhs_outer, held)


def _in_other_order(ctx: PartitionContext, dims: DotDims, s: HloSharding,
                    ks: _HaloSetup) -> bool:
    """Whether the input, sharded ``s``, may feed a halo way as it is: it tiles one
    windowed dim in another device order than the groups (``source_order``) and every
    other windowed dim whole or in the groups' order."""
    if s == ks.held or not s.is_tiled:
        return False
    rank = dims.lhs_rank
    st, ot = tiles_of(s, rank), tiles_of(ks.lhs_outer, rank)
    other = 0
    for ld, *_ in ks.windowed:
        if source_order(ctx, s, ks.lhs_outer, ld, rank) is not None:
            other += 1
        elif st[ld] != 1 and (st[ld] != ot[ld] or not np.array_equal(
                tile_index_table(ctx, s, ld), tile_index_table(ctx, ks.lhs_outer, ld))):
            return False
    return other == 1


def _kernel_windows(dims: DotDims, lhs: PValue, rhs: PValue, ks: _HaloSetup):
    """Per kernel-tiled dim: (lhs dim, kernel dim, window index, tiles, input starts per
    tile, input width, the kernel rows per tile, the per-tile window)."""
    out_dims = dims.out_dims(lhs.base_shape.dims, rhs.base_shape.dims)
    out = []
    for (ld, rd, od, i), t in zip(ks.windowed, ks.sizes):
        w = dims.window[i]
        rk = -(-int(rhs.base_shape.dims[rd]) // t)
        k = np.arange(t, dtype=np.int64)
        # Kernel tile k holds rows [k*rk, (k+1)*rk), window taps k*rk.. (reversed: the
        # window reads the kernel backwards, tile k's taps start at size - (k+1)*rk;
        # taps of the padded rows past the end fall before 0 and are masked to zero).
        first = (int(rhs.base_shape.dims[rd]) - (k + 1) * rk) if w.window_reversal \
            else k * rk
        starts = first * w.window_dilation - w.padding_low
        width = (out_dims[od] - 1) * w.stride + (rk - 1) * w.window_dilation + 1
        out.append((ld, rd, i, t, starts, width, rk,
                    WindowDim(rk, w.stride, 0, 0, w.window_dilation, 1, w.window_reversal)))
    return out


def _kernel_price(ctx: PartitionContext, inst: Instruction, dims: DotDims, lhs: PValue,
                  rhs: PValue, target: HloSharding, ks: _HaloSetup) -> float:
    """Bytes of the kernel's halo way: the operands' reshards, the input's halo
    exchanges, the plan inside the groups, the all-reduce across them and the result's
    reshard to ``target``."""
    from hlo_spmd.collectives.cost import bytes_per_device
    from hlo_spmd.passes.partition.handlers.dot import _PLANNER, _ebytes
    from hlo_spmd.passes.partition.support.dot_plan import Problem

    n = ctx.num_devices
    eb = (_ebytes(lhs.hlo), _ebytes(rhs.hlo), float(element_bytes(inst.shape.element_type)))
    lshape, rshape = list(lhs.base_shape.dims), list(rhs.base_shape.dims)
    moved = (reshard_cost(tuple(lshape), eb[0], lhs.sharding, ks.held, n)
             + reshard_cost(tuple(rshape), eb[1], rhs.sharding, ks.rhs_outer, n))
    local = list(ctx.local_shape(lhs.base_shape, ks.held).dims)
    window = list(dims.window)
    xt = tiles_of(ks.held, dims.lhs_rank)
    for ld, rd, i, t, starts, width, rk, w in _kernel_windows(dims, lhs, rhs, ks):
        order = source_order(ctx, ks.held, ks.lhs_outer, ld, dims.lhs_rank)
        wplan = plan_window(xt[ld], t, local[ld], int(lshape[ld]), starts, width,
                            order=order)
        if local[ld]:
            moved += wplan.key()[0] * float(np.prod(local)) / local[ld] * eb[0]
        local[ld] = width
        lshape[ld], rshape[rd] = width, rk
        window[i] = w
    inner = Problem(dims.with_window(window), tuple(lshape), tuple(rshape), ks.inner_l,
                    ks.inner_r, ks.inner_o, int(ks.groups.shape[1]), eb)
    moved += _PLANNER.plan(inner).cost.bytes
    out_local = float(np.prod(ctx.local_shape(
        lhs.base_shape.with_dims(inner.out_shape), ks.inner_o).dims)) * eb[2] \
        if ks.inner_o.is_tiled else float(np.prod(inner.out_shape)) * eb[2]
    moved += bytes_per_device("all-reduce", out_local, out_local, int(ks.groups.shape[0]))
    out = ungroup_to(ks.groups, dims.out_rank, None, ks.sizes, ks.inner_o)
    moved += reshard_cost(dims.out_dims(lhs.base_shape.dims, rhs.base_shape.dims), eb[2],
                          out, target, n)
    return moved


@with_cause("contraction")  # the all-reduce sums the per-window partial products
def _partition_kernel_spatial(ctx: PartitionContext, inst: Instruction, dims: DotDims,
                              lhs: PValue, rhs: PValue, target: HloSharding,
                              ks: _HaloSetup) -> PValue:
    """Each device convolves its kernel rows with the input rows they meet (a halo
    exchange on the input), and the partial results are summed across the groups of
    ``ks`` (all-reduce)."""
    from hlo_spmd.passes.partition.handlers.dot import mask_padding

    r_dims = [r for _, r, _, _ in ks.windowed]
    l = ctx.reshard(lhs, ks.held)
    r = mask_padding(ctx, ctx.reshard(rhs, ks.rhs_outer), r_dims)
    x = l.hlo
    window = list(dims.window)
    lshape, rshape = list(lhs.base_shape.dims), list(rhs.base_shape.dims)
    zero = ctx.b.scalar(0, x)
    for ld, rd, i, t, starts, width, rk, w in _kernel_windows(dims, lhs, rhs, ks):
        size = int(lhs.base_shape.dims[ld])
        tidx = tile_index_table(ctx, ks.lhs_outer, ld)
        x = exchange_window(ctx, x, ks.held, ks.lhs_outer, ld, size, starts, width, tidx)
        x = mask_outside(ctx, x, ld, -starts, size - starts, tidx, zero)
        window[i] = w
        lshape[ld], rshape[rd] = width, rk
    inner_ctx = ctx.in_group(ctx.grouping.subgroup(ks.groups))
    li = PValue(x, lhs.base_shape.with_dims(tuple(lshape)), ks.inner_l)
    ri = PValue(r.hlo, rhs.base_shape.with_dims(tuple(rshape)), ks.inner_r)
    res = partition_dot(inner_ctx, inst, dims.with_window(window), li, ri, ks.inner_o,
                        local_convolution)
    summed = ctx.f.all_reduce(res.hlo, "add", np.ascontiguousarray(ks.groups.T))
    out = PValue(summed, inst.shape, ungroup_to(ks.groups, dims.out_rank, None, ks.sizes,
                                                ks.inner_o))
    return ctx.reshard(out, target)


# -- the per-device convolution -------------------------------------------------------------
def local_convolution(ctx: PartitionContext, inst: Instruction, dims: DotDims,
                      l: Instruction, r: Instruction) -> Instruction:
    """``inst`` on local operands: the window of ``dims`` (padding removed where halos
    were exchanged), contracting-like spatial windows as wide as the local kernel, and
    group counts for the groups this device holds."""
    attrs = copy_attrs(inst)
    c = dims.conv
    assert c is not None
    for i, w in enumerate(dims.window):
        wd = attrs.window.dimensions[i]
        wd.size = w.size
        wd.padding_low, wd.padding_high = w.padding_low, w.padding_high
        wd.base_dilation = w.base_dilation
    for d in dims.contracting:
        if d.spatial >= 0:
            attrs.window.dimensions[d.spatial].size = r.shape.dims[d.rhs]
    shard_windows = [(d, batch_window(dims.window[d.spatial], l.shape.dims[d.lhs]))
                     for d in dims.batch if d.spatial >= 0]    # a batch-like window
    shard_windows += [(d, rhs_nc_window(r.shape.dims[d.rhs]))  # kernel rows = output rows
                      for d in dims.rhs_non_contracting if d.spatial >= 0]
    for d, w in shard_windows:   # the window for the shard's rows
        wd = attrs.window.dimensions[d.spatial]
        for field, value, default in (
                ("size", w.size, 0), ("stride", w.stride, 1),
                ("padding_low", w.padding_low, 0), ("padding_high", w.padding_high, 0),
                ("window_dilation", w.window_dilation, 1),
                ("base_dilation", w.base_dilation, 1),
                ("window_reversal", w.window_reversal, False)):
            if (getattr(wd, field) or default) != value:
                setattr(wd, field, value)
    if c.feature_group_count > 1:
        attrs.feature_group_count = l.shape.dims[c.in_feature] // r.shape.dims[c.k_in]
    if c.batch_group_count > 1:
        attrs.batch_group_count = l.shape.dims[c.in_batch] // inst.shape.dims[c.out_batch]
    return ctx.b.op("convolution", [l, r], attrs, [], declared=array_shape(
        inst.shape.element_type, ()), name=inst.name)


__all__ = ["handle_convolution", "partition_convolution", "local_convolution"]
