"""Resharding: the single way a partitioned value changes sharding.

Routes (cheapest that applies):
  same sharding                 -> nothing
  replicated -> tiled           -> pad (uneven) + dynamic-slice at this device's offset, no traffic
  tiled -> replicated           -> all-gather per sharded dim (+ slice off padding)
  maximal -> another device     -> one collective-permute owner -> new owner
  maximal -> anything else      -> select on the owner + all-reduce, then as replicated
  tiled / partially replicated  -> the cheapest plan of reshard_routes (dynamic-slice,
    <-> tiled / partially          all-gather, all-to-all, collective-permute and chains
    replicated                     of them, costed in bytes per device), when it beats:
  anything else                 -> through replicated (correct for every pair)
Tuple values reshard per element.

``reshard_cost`` is the one cost function: the bytes per device on the wire (the figure
collectives/cost.py gives ``stats``) of exactly the route ``reshard`` takes. Every planner
prices its candidates with it.

Reshards are remembered (XLA's PartitionedHlo reshard cache): per computation and device
grouping, a value resharded to a target once is reused by every later user, and the
reverse direction is recorded too (resharding the result back to the source gives the
source value, with no traffic).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from hlo_spmd.collectives.cost import bytes_per_device
from hlo_spmd.errors import PartitionError

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.primitive_types import PrimitiveType, bit_width
from hlo_spmd.memo import BoundedMemo
from hlo_spmd.passes.partition.causes import replicate_scope, reshard_scope
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.sharding import HloSharding, ShardingType, device_offsets, tile_shape

if TYPE_CHECKING:
    from hlo_spmd.passes.partition.context import PartitionContext

# Extra routes (all-to-all, collective-permute, partial replication changes) register here:
# each takes (ctx, pv, target) and returns a PValue or None when it does not apply.
SPECIAL_ROUTES: list = []


@reshard_scope
def reshard(ctx: "PartitionContext", pv: PValue, target: HloSharding) -> PValue:
    """``pv`` with sharding ``target`` (the single way a value changes sharding)."""
    if pv.sharding == target:
        return pv
    cache = ctx.state.reshard_cache
    key = _cache_key(ctx, pv, target)
    hit = cache.get(key)
    if hit is not None:
        return hit[1]
    out = _reshard_uncached(ctx, pv, target)
    # The cached entry keeps the source instruction alive, so its id is never reused.
    cache[key] = (pv.hlo, out)
    if out.hlo is not pv.hlo and _reversible(pv.sharding) and _reversible(target):
        cache.setdefault(_cache_key(ctx, out, pv.sharding), (out.hlo, pv))
    return out


def _cache_key(ctx: "PartitionContext", pv: PValue, target: HloSharding) -> tuple:
    shape = pv.base_shape
    return (id(ctx.b.computation), ctx.grouping.key, id(pv.hlo),
            shape.element_type, tuple(shape.dims), pv.sharding, target)


def _reversible(s: HloSharding) -> bool:
    """Shardings whose value is the same data on every holder (so the source of a reshard
    is a valid answer for the way back): not maximal (valid on one device only), not
    manual nor with manual / unreduced subgroups, not tuples."""
    if s.is_replicated:
        return True
    return s.is_tiled and all(t == ShardingType.REPLICATED for t in s.subgroup_types)


def _reshard_uncached(ctx: "PartitionContext", pv: PValue, target: HloSharding) -> PValue:
    src = pv.sharding
    if pv.base_shape.is_tuple:
        return _reshard_tuple(ctx, pv, target)
    if not pv.base_shape.is_array:
        return PValue(pv.hlo, pv.base_shape, target)
    if src.is_manual or target.is_manual:
        if src.is_manual and target.is_manual:
            return PValue(pv.hlo, pv.base_shape, target)
        if target.is_manual and (src.is_replicated or src.is_maximal):
            # Inside a manual region shapes are already local: a whole value (a constant,
            # an iota) is every device's manual value as it is.
            return PValue(pv.hlo, pv.base_shape, target)
        raise PartitionError(f"cannot reshard between manual and non-manual ({src} -> {target})",
                             f"instruction {pv.hlo.name}")
    from hlo_spmd.passes.partition import unreduced  # partial sums: their own routes
    if unreduced.is_unreduced(src) or unreduced.is_unreduced(target):
        return unreduced.reshard_unreduced(ctx, pv, target)
    if src.is_maximal and target.is_maximal:
        return maximal_to_maximal(ctx, pv, target)
    if src.is_maximal and _scatter_dim(target, pv.base_shape.dims, ctx.num_devices) is not None:
        return maximal_to_tiled(ctx, pv, target)
    if src.is_maximal:
        pv = maximal_to_replicated(ctx, pv)
        src = pv.sharding
        if src == target:
            return pv
    if target.is_maximal:
        # A replicated value is valid on the owner device as well (a remembered one, e.g.
        # the whole value a tile was cut from, costs nothing).
        hit = ctx.state.reshard_cache.get(_cache_key(ctx, pv, HloSharding.replicate()))
        whole = hit[1] if hit is not None else replicate(ctx, pv)
        return PValue(whole.hlo, pv.base_shape, target)
    for route in SPECIAL_ROUTES:
        out = route(ctx, pv, target)
        if out is not None:
            return out
    if target.is_replicated:
        return replicate(ctx, pv)
    # Through the replicated value, itself remembered for later users.
    return slice_replicated(ctx, reshard(ctx, pv, HloSharding.replicate()), target)


def reshard_cost(dims: Sequence[int], itemsize: float, src: HloSharding,
                 dst: HloSharding, num_devices: int) -> float:
    """Bytes per device on the wire of ``reshard`` taking an array of global ``dims`` (of
    ``itemsize`` bytes per element) from ``src`` to ``dst`` over ``num_devices`` logical
    devices: the route ``reshard`` itself chooses, each collective costed by
    collectives/cost.py (so a plan's price is what ``stats`` reports for its program).
    The reshard cache is not consulted: this is the price of a fresh reshard. ``inf``
    for pairs ``reshard`` rejects (manual <-> non-manual)."""
    if src == dst:
        return 0.0
    dims = tuple(int(d) for d in dims)
    if src.is_tuple or dst.is_tuple:
        raise ValueError("reshard_cost prices one array; price tuple elements one by one")
    # Pure in its (immutable) arguments and asked for by every handler's planner, with the
    # same few keys in every layer of a model: one pricing per distinct key.
    key = (dims, float(itemsize), src, dst, num_devices)
    hit = _COSTS.get(key)
    if hit is None:
        hit = _COSTS.put(key, _reshard_cost(dims, itemsize, src, dst, num_devices))
    return hit


_COSTS = BoundedMemo(1 << 15)


def _reshard_cost(dims: tuple[int, ...], itemsize: float, src: HloSharding,
                  dst: HloSharding, num_devices: int) -> float:
    if src.is_manual or dst.is_manual:
        if src.is_manual and dst.is_manual:
            return 0.0
        return 0.0 if dst.is_manual and (src.is_replicated or src.is_maximal) else math.inf
    total = 0.0
    full = float(math.prod(dims)) * itemsize
    if src.is_maximal and dst.is_maximal:
        return bytes_per_device("collective-permute", full, full, 2)
    if src.is_maximal and _scatter_dim(dst, dims, num_devices) is not None:
        return bytes_per_device("reduce-scatter", full, full / num_devices, num_devices)
    if src.is_maximal:
        total += bytes_per_device("all-reduce", full, full, num_devices)
        src = HloSharding.replicate()
        if src == dst:
            return total
    tiles = src.tile_dims_for_data() if src.is_tiled else [1] * len(dims)
    if dst.is_maximal:
        return total + replicate_cost(dims, itemsize, tiles)
    from hlo_spmd.passes.partition import reshard_routes

    plan = reshard_routes.chosen_plan(dims, itemsize, src, dst, num_devices)
    if plan is not None:
        return total + plan.cost
    return total + replicate_cost(dims, itemsize, tiles)


def reshard_price(ctx: "PartitionContext", pv: PValue, target: HloSharding) -> tuple[float, float]:
    """(bytes per device on the wire, bytes of the largest new array) that
    ``reshard(ctx, pv, target)`` would cost now: nothing when the reshard cache already
    holds it, else ``reshard_cost`` and ``reshard_peak`` (the price a planner compares
    before emitting only its winner)."""
    if pv.sharding == target or _cache_key(ctx, pv, target) in ctx.state.reshard_cache:
        return 0.0, 0.0
    shape = pv.base_shape
    size = bit_width(shape.element_type) / 8.0
    if pv.sharding.is_tuple or target.is_tuple:
        n = len(shape.tuple_shapes)
        parts = [reshard_price(ctx, PValue(pv.hlo, s, a), b) for s, a, b in
                 zip(shape.tuple_shapes, _tuple_elems(pv.sharding, n), _tuple_elems(target, n))]
        return sum(p[0] for p in parts), max((p[1] for p in parts), default=0.0)
    n = ctx.num_devices
    return (reshard_cost(shape.dims, size, pv.sharding, target, n),
            reshard_peak(shape.dims, size, pv.sharding, target, n))


def reshard_peak(dims: Sequence[int], itemsize: float, src: HloSharding,
                 dst: HloSharding, num_devices: int) -> float:
    """Bytes per device of the largest array ``reshard`` creates taking ``dims`` from
    ``src`` to ``dst``: the local array of every layout its route passes through, or the
    whole array when it goes through the replicated value (the memory side of
    ``reshard_cost``, for planners that weigh the largest new tensor)."""
    if src == dst or src.is_manual or dst.is_manual or src.is_tuple or dst.is_tuple:
        return 0.0
    dims = tuple(int(d) for d in dims)
    full = float(math.prod(dims)) * itemsize
    if src.is_maximal or dst.is_maximal:
        return full
    from hlo_spmd.passes.partition import reshard_routes

    plan = reshard_routes.chosen_plan(dims, itemsize, src, dst, num_devices)
    if plan is None:
        return full
    return max((math.prod(-(-d // t) for d, t in zip(dims, lay.tiles)) * itemsize
                for lay in plan.layouts[1:]), default=0.0)


def replicate_cost(dims: Sequence[int], itemsize: float, tiles: Sequence[int]) -> float:
    """What ``replicate`` moves from data tiles ``tiles``: one all-gather per tiled dim, in
    dim order, of the padded local array (the padding is sliced off at the end); cutting a
    tile out of the replicated value afterwards is free."""
    local = [-(-int(d) // int(t)) for d, t in zip(dims, tiles)]
    total = 0.0
    for k, t in enumerate(tiles):
        if t > 1:
            gathered = float(math.prod(local)) * t * itemsize
            total += bytes_per_device("all-gather", gathered / t, gathered, int(t))
            local[k] *= t
    return total


def _reshard_tuple(ctx: "PartitionContext", pv: PValue, target: HloSharding) -> PValue:
    n = len(pv.base_shape.tuple_shapes)
    src_elems = _tuple_elems(pv.sharding, pv.base_shape)
    dst_elems = _tuple_elems(target, pv.base_shape)
    parts = []
    for i in range(n):
        elem = PValue(ctx.b.get_tuple_element(pv.hlo, i), pv.base_shape.tuple_shapes[i], src_elems[i])
        parts.append(reshard(ctx, elem, dst_elems[i]).hlo)
    return PValue(ctx.b.tuple(parts), pv.base_shape, target)


def _tuple_elems(s: HloSharding, shape) -> list[HloSharding]:
    """The sharding of each element of tuple ``shape`` (a tuple sharding lists the leaves
    of the whole nested tuple; an element that is a tuple gets a tuple of its leaves)."""
    from hlo_spmd.passes.propagation.sharding_ops import sub_sharding

    return [sub_sharding(s, shape, i) for i in range(len(shape.tuple_shapes))]


def gather_groups(s: HloSharding, dim: int) -> np.ndarray:
    """Logical device groups that differ only in their tile index along ``dim``, each in
    tile-index order (the order all-gather concatenates)."""
    arr = s.tile_assignment.array()
    return np.moveaxis(arr, dim, -1).reshape(-1, arr.shape[dim])


@replicate_scope
def replicate(ctx: "PartitionContext", pv: PValue) -> PValue:
    """Tiled (possibly partially replicated) -> replicated via all-gathers."""
    s = pv.sharding
    if s.is_replicated:
        return pv
    x = pv.hlo
    if s.is_tiled:
        tiles = s.tile_dims_for_data()
        for dim, t in enumerate(tiles):
            if t > 1:
                x = ctx.f.all_gather(x, dim, gather_groups(s, dim))
        x = slice_to(ctx, x, pv.base_shape.dims)
    return PValue(x, pv.base_shape, HloSharding.replicate())


def slice_to(ctx: "PartitionContext", x: Instruction, dims) -> Instruction:
    """Slice off end padding so ``x`` has exactly ``dims``."""
    if tuple(x.shape.dims) == tuple(dims):
        return x
    return ctx.b.slice(x, [0] * len(dims), list(dims), [1] * len(dims))


def pad_to(ctx: "PartitionContext", x: Instruction, dims) -> Instruction:
    """Pad at the end with zeros so ``x`` has ``dims`` (each >= the current size)."""
    if tuple(x.shape.dims) == tuple(dims):
        return x
    zero = ctx.b.scalar(0, x)
    high = [int(d) - int(c) for d, c in zip(dims, x.shape.dims)]
    return ctx.b.pad(x, zero, [0] * len(dims), high)


def offsets_for(ctx: "PartitionContext", s: HloSharding, dims) -> list[Instruction]:
    """This device's start offsets (padded coordinates) of sharding ``s`` on ``dims``."""
    table = device_offsets(s, dims, num_devices=ctx.num_devices)
    tiles = s.tile_dims_for_data() if s.is_tiled else [1] * len(dims)
    out = []
    for dim in range(len(dims)):
        if tiles[dim] > 1:
            out.append(ctx.logical_table(table[:, dim]))
        else:
            out.append(ctx.b.constant(np.int64(0), PrimitiveType.S32))
    return out


def slice_replicated(ctx: "PartitionContext", pv: PValue, target: HloSharding) -> PValue:
    """Replicated -> tiled: each device cuts its own tile, no communication."""
    dims = pv.base_shape.dims
    local = tile_shape(target, dims)
    tiles = target.tile_dims_for_data()
    padded = [int(l) * int(t) for l, t in zip(local, tiles)]
    x = pad_to(ctx, pv.hlo, padded)
    if tuple(local) == tuple(x.shape.dims):
        return PValue(x, pv.base_shape, target)
    out = ctx.b.dynamic_slice(x, offsets_for(ctx, target, dims), list(local))
    return PValue(out, pv.base_shape, target)


def _scatter_dim(s: HloSharding, dims, n: int) -> int | None:
    """The dim ``s`` tiles evenly over all ``n`` devices (and no other), if any."""
    if not s.is_tiled or s.subgroup_types or s.is_partial_replicated or n < 2:
        return None
    tiles = s.tile_dims_for_data()
    tiled = [k for k, t in enumerate(tiles) if t > 1]
    if len(tiled) != 1 or tiles[tiled[0]] != n or int(dims[tiled[0]]) % n:
        return None
    return tiled[0]


def _owner_only(ctx: "PartitionContext", pv: PValue) -> Instruction:
    """The owner's value on the owner, zero elsewhere."""
    owner = pv.sharding.device
    n = ctx.num_devices
    is_owner = ctx.logical_table((np.arange(n) == owner).astype(np.int64))
    one = ctx.b.constant(np.int64(1), PrimitiveType.S32)
    pred = ctx.b.compare(is_owner, one, "EQ")
    x = pv.hlo
    if x.shape.rank:
        pred = ctx.b.broadcast(pred, list(x.shape.dims), [])
    zero = ctx.b.broadcast(ctx.b.scalar(0, x), list(x.shape.dims), []) if x.shape.rank else ctx.b.scalar(0, x)
    return ctx.b.select(pred, x, zero)


def maximal_to_maximal(ctx: "PartitionContext", pv: PValue, target: HloSharding) -> PValue:
    """The owner's value to another single device: one collective-permute owner -> new
    owner (the other devices send nothing and keep what they had, which means nothing)."""
    out = ctx.f.collective_permute(pv.hlo, [(pv.sharding.device, target.device)])
    return PValue(out, pv.base_shape, target)


def maximal_to_tiled(ctx: "PartitionContext", pv: PValue, target: HloSharding) -> PValue:
    """The owner's value, tiled on one dim over every device: one reduce-scatter of the
    owner-only value (half the bytes of all-reduce + slice)."""
    d = _scatter_dim(target, pv.base_shape.dims, ctx.num_devices)
    x = _owner_only(ctx, pv)
    op = "or" if x.shape.element_type == PrimitiveType.PRED else "add"
    out = ctx.f.reduce_scatter(x, d, op, gather_groups(target, d))
    return PValue(out, pv.base_shape, target)


def maximal_to_replicated(ctx: "PartitionContext", pv: PValue) -> PValue:
    """The owner's value to every device: zero elsewhere, then all-reduce."""
    n = ctx.num_devices
    selected = _owner_only(ctx, pv)
    op = "or" if selected.shape.element_type == PrimitiveType.PRED else "add"
    out = ctx.f.all_reduce(selected, op, np.arange(n).reshape(1, n))
    return PValue(out, pv.base_shape, HloSharding.replicate())


# The routes register themselves in SPECIAL_ROUTES (imported last: they use this module).
from hlo_spmd.passes.partition import reshard_routes  # noqa: E402,F401
