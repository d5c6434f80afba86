"""Resharding: the single way a partitioned value changes sharding.

A reshard is planned as data before anything is emitted (``reshard_plan``, pure in the
global dims, element size, source, target and device count): an ordered chain of steps,
each priced in bytes per device on the wire as collectives/cost.py prices what it emits
for ``stats``. Steps (cheapest route that applies):
  same sharding                 -> nothing
  replicated -> tiled           -> local cut: pad (uneven) + dynamic-slice at this
                                   device's offset, no traffic
  tiled -> replicated           -> all-gather per sharded dim (+ slice off padding)
  maximal -> another device     -> one collective-permute owner -> new owner
  maximal -> tiled              -> owner-only value, one reduce-scatter (+ all-gather among
                                   each tile's holders), when it beats:
  maximal -> anything else      -> select on the owner + all-reduce, then as replicated
  unreduced -> reduced          -> all-reduce over the groups of partial sums (or one
                                   reduce-scatter when the target tiles a dim across
                                   exactly the group), then the twin's own plan
  reduced -> unreduced          -> to the twin, then the group's first device keeps it
  tiled / partially replicated  -> the cheapest chain of reshard_routes (local cut,
    <-> tiled / partially          all-gather, all-to-all, collective-permute), when
    replicated                     it beats:
  anything else                 -> through the replicated value (remembered itself)
A value cheaper to re-make than to move (an iota, a small constant, a broadcast of what
is already there, elementwise ops of such; partition/recreate.py) is re-made in the
target instead: a 0-byte step, chosen per value (``_value_plan``). Tuple values reshard
per element.

``reshard`` walks exactly the plan it prices: ``reshard_cost`` is that plan's price,
``reshard_peak`` its largest new array (each step knows both), and ``reshard_price`` the
two for one value now (0 when cached; no bytes moved when re-made). Every planner prices
its candidates with them.

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
from hlo_spmd.ir.primitive_types import PrimitiveType, element_bytes
from hlo_spmd.memo import BoundedMemo
from hlo_spmd.passes.partition import recreate, reshard_routes, unreduced
from hlo_spmd.passes.partition.causes import replicate_scope, reshard_scope
from hlo_spmd.passes.partition.local_cut import pad_to, slice_replicated, slice_to
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.reshard_routes import array_bytes, layout_of, replicate_cost
from hlo_spmd.sharding import HloSharding, ShardingType, tile_shape

if TYPE_CHECKING:
    from hlo_spmd.passes.partition.state import ReshardContext


@reshard_scope
def reshard(ctx: "ReshardContext", pv: PValue, target: HloSharding) -> PValue:
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


def _cache_key(ctx: "ReshardContext", pv: PValue, target: HloSharding) -> tuple:
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


def _reshard_uncached(ctx: "ReshardContext", pv: PValue, target: HloSharding) -> PValue:
    shape = pv.base_shape
    if shape.is_tuple:
        return _reshard_tuple(ctx, pv, target)
    if not shape.is_array:
        return PValue(pv.hlo, shape, target)
    plan = _value_plan(ctx, pv, target)
    for step in plan.steps:
        pv = step.emit(ctx, pv)
    return pv


# -- the plan ---------------------------------------------------------------------------------
# A reshard is planned as data before anything is emitted: an ordered chain of steps, each
# taking the value from one sharding to the next and priced by collectives/cost.py the way
# ``stats`` counts what it emits. ``reshard`` walks exactly the plan ``reshard_cost``
# prices, so a planner's figure is the program's.

class Step:
    """One step of a reshard plan: ``src`` -> ``dst``, ``cost`` bytes per device on the
    wire, ``peak`` bytes per device of the largest array it makes from the value."""
    kind = ""

    def __init__(self, src: HloSharding, dst: HloSharding, cost: float = 0.0,
                 peak: float = 0.0) -> None:
        self.src = src
        self.dst = dst
        self.cost = cost
        self.peak = peak

    def __repr__(self) -> str:
        return f"{self.kind}({self.src} -> {self.dst}, {self.cost:g} B, peak {self.peak:g} B)"

    def emit(self, ctx: "ReshardContext", pv: PValue) -> PValue:
        raise NotImplementedError


class Relabel(Step):
    """The local value already is the target's (manual regions, a replicated value read
    as the owner's, ...): nothing moves."""
    kind = "relabel"

    def emit(self, ctx, pv):
        return PValue(pv.hlo, pv.base_shape, self.dst)


class Impossible(Step):
    """A pair no route joins (manual <-> non-manual): priced ``inf``, an error if emitted."""
    kind = "impossible"

    def emit(self, ctx, pv):
        raise PartitionError(f"cannot reshard between manual and non-manual "
                             f"({self.src} -> {self.dst})", f"instruction {pv.hlo.name}")


class OwnerAllReduce(Step):
    """Maximal -> replicated: the owner's value, zeros elsewhere, one all-reduce."""
    kind = "all-reduce-from-owner"

    def emit(self, ctx, pv):
        return maximal_to_replicated(ctx, pv)


class OwnerMove(Step):
    """Maximal -> another single device: one collective-permute owner -> new owner."""
    kind = "permute-to-owner"

    def emit(self, ctx, pv):
        return maximal_to_maximal(ctx, pv, self.dst)


class OwnerReduceScatter(Step):
    """Maximal -> tiled (possibly partially replicated) over every device: one
    reduce-scatter of the owner-only value, then an all-gather among each tile's holders
    (``maximal_to_tiled``)."""
    kind = "reduce-scatter-from-owner"

    def emit(self, ctx, pv):
        return maximal_to_tiled(ctx, pv, self.dst)


class Gather(Step):
    """Tiled -> replicated: one all-gather per tiled dim, padding sliced off at the end
    (the whole value, when the reshard cache already holds it, e.g. the value a tile was
    cut from)."""
    kind = "all-gather"

    def emit(self, ctx, pv):
        hit = ctx.state.reshard_cache.get(_cache_key(ctx, pv, HloSharding.replicate()))
        return hit[1] if hit is not None else replicate(ctx, pv)


class CutLocal(Step):
    """Replicated -> tiled: each device cuts its own tile, no communication."""
    kind = "local-cut"

    def emit(self, ctx, pv):
        return slice_replicated(ctx, pv, self.dst)


class Routes(Step):
    """A chain of reshard_routes (local cut, all-gather, all-to-all, collective-permute)
    between two tiled / partially replicated layouts."""
    kind = "routes"

    def __init__(self, src: HloSharding, dst: HloSharding, plan, peak: float) -> None:
        super().__init__(src, dst, plan.cost, peak)
        self.plan = plan

    def __repr__(self) -> str:
        return (f"routes[{self.plan.name}]({self.src} -> {self.dst}, {self.cost:g} B, "
                f"peak {self.peak:g} B)")

    def emit(self, ctx, pv):
        if not self.plan.steps:
            return PValue(pv.hlo, pv.base_shape, self.dst)
        return reshard_routes.reshard_with_plan(ctx, pv, self.dst, self.plan)


class Via(Step):
    """To an intermediate sharding through ``reshard`` itself, so that the intermediate
    value (the replicated value, the reduced twin of a partial sum) is remembered for
    later users; priced as that reshard's own plan."""
    kind = "via"

    def __init__(self, src: HloSharding, dst: HloSharding, plan: "ReshardPlan") -> None:
        super().__init__(src, dst, plan.cost, plan.peak)

    def emit(self, ctx, pv):
        return reshard(ctx, pv, self.dst)


class GroupAllReduce(Step):
    """Unreduced -> its reduced twin: all-reduce over each group of partial sums."""
    kind = "all-reduce"

    def emit(self, ctx, pv):
        groups = unreduced.groups_of(self.src, ctx.num_devices, pv.base_shape.rank)
        x = ctx.f.all_reduce(pv.hlo, _adder(pv.hlo), groups)
        return PValue(x, pv.base_shape, self.dst)


class GroupReduceScatter(Step):
    """Unreduced -> tiled on ``dim`` across each group: one reduce-scatter."""
    kind = "reduce-scatter"

    def __init__(self, src: HloSharding, dst: HloSharding, cost: float, peak: float,
                 dim: int) -> None:
        super().__init__(src, dst, cost, peak)
        self.dim = dim

    def emit(self, ctx, pv):
        groups = unreduced.groups_of(self.src, ctx.num_devices, pv.base_shape.rank)
        x = ctx.f.reduce_scatter(pv.hlo, self.dim, _adder(pv.hlo), groups)
        return PValue(x, pv.base_shape, self.dst)


class KeepOnLeader(Step):
    """Reduced -> unreduced: each group's first device keeps the value, the others hold
    zeros (so the partial sums add up to it). No traffic."""
    kind = "keep-on-leader"

    def emit(self, ctx, pv):
        return unreduced.keep_on_leader(ctx, pv, self.dst)


class Remake(Step):
    """Re-make the value in the target on every device from what is already there
    (partition/recreate.py: iota, small constants, broadcasts of values available at no
    cost, elementwise ops of such): nothing moves."""
    kind = "recreate"

    def __init__(self, src: HloSharding, dst: HloSharding, origin: Instruction,
                 peak: float) -> None:
        super().__init__(src, dst, 0.0, peak)
        self.origin = origin

    def emit(self, ctx, pv):
        return recreate.remake(ctx, self.origin, self.dst)


def _value_plan(ctx: "ReshardContext", pv: PValue, target: HloSharding) -> "ReshardPlan":
    """The plan for this very value: ``reshard_plan`` of its shapes and shardings, or
    re-making it in ``target`` when that plan would move data and the value can be
    re-made from what is already on every device."""
    shape = pv.base_shape
    plan = reshard_plan(shape.dims, element_bytes(shape.element_type), pv.sharding, target,
                        ctx.num_devices)
    if plan.cost > 0 and math.isfinite(plan.cost):
        origin = recreate.origin(ctx, pv)
        if origin is not None and recreate.ops_to_remake(ctx, origin, target) is not None:
            # (its peak: the target's local array, as any value it makes in target)
            local = tile_shape(target, shape.dims) if target.is_tiled else shape.dims
            peak = array_bytes(local, element_bytes(shape.element_type))
            return ReshardPlan([Remake(pv.sharding, target, origin, peak)])
    return plan


def _adder(x: Instruction) -> str:
    return "or" if x.shape.element_type == PrimitiveType.PRED else "add"


class ReshardPlan:
    """The steps ``reshard`` emits for one array, their summed price (bytes per device on
    the wire, as ``stats`` counts the emitted program) and their peak (bytes per device of
    the largest array a step makes from the value)."""
    __slots__ = ("steps", "cost", "peak")

    def __init__(self, steps: Sequence[Step]) -> None:
        self.steps = tuple(steps)
        self.cost = float(sum(s.cost for s in self.steps))
        self.peak = float(max((s.peak for s in self.steps), default=0.0))

    def __repr__(self) -> str:
        return "ReshardPlan(" + ", ".join(map(repr, self.steps)) + ")"


def reshard_plan(dims: Sequence[int], itemsize: float, src: HloSharding, dst: HloSharding,
                 num_devices: int) -> ReshardPlan:
    """The plan ``reshard`` follows to take an array of global ``dims`` (``itemsize``
    bytes per element, packed: ``element_bytes``) from ``src`` to ``dst`` over
    ``num_devices`` logical devices. Pure in its (immutable) arguments; one plan per
    distinct key (every handler's planner asks for the same few in every layer)."""
    dims = tuple(int(d) for d in dims)
    if src.is_tuple or dst.is_tuple:
        raise ValueError("reshard_plan plans one array; plan tuple elements one by one")
    key = (dims, float(itemsize), src, dst, num_devices)
    hit = _PLANS.get(key)
    if hit is None:
        plan = ReshardPlan(_plan_steps(dims, float(itemsize), src, dst, num_devices))
        owner = _first_tile_owner(dims, src)
        if owner is not None and plan.cost > 0 and dst != owner:
            # All the data sits in the first tile: read it as that device's value
            # (maximal) when the owner's plan is cheaper (one all-reduce, not a gather
            # per tiled dim).
            via = reshard_plan(dims, itemsize, owner, dst, num_devices)
            if via.cost < plan.cost:
                plan = ReshardPlan([Relabel(src, owner), Via(owner, dst, via)])
        hit = _PLANS.put(key, plan)
    return hit


def _first_tile_owner(dims: tuple[int, ...], src: HloSharding) -> HloSharding | None:
    """``{maximal device=D}`` when tiled ``src`` holds all of an array of ``dims`` in its
    first tile (every tiled dim has at most one element), D that tile's first holder."""
    if not src.is_tiled or not dims or any(t != ShardingType.REPLICATED
                                           for t in src.subgroup_types):
        return None
    tiles = src.tile_dims_for_data()
    if all(int(t) == 1 for t in tiles) or any(int(d) > 1 and int(t) > 1
                                              for d, t in zip(dims, tiles)):
        return None
    return HloSharding.maximal(int(src.tile_assignment.first()))


_PLANS = BoundedMemo(1 << 15)


def _plan_steps(dims: tuple[int, ...], itemsize: float, src: HloSharding, dst: HloSharding,
                n: int) -> list[Step]:
    if src == dst:
        return []
    if src.is_manual or dst.is_manual:
        if src.is_manual and dst.is_manual:
            return [Relabel(src, dst)]
        if dst.is_manual and (src.is_replicated or src.is_maximal):
            # Inside a manual region shapes are already local: a whole value (a constant,
            # an iota) is every device's manual value as it is.
            return [Relabel(src, dst)]
        return [Impossible(src, dst, math.inf)]
    rank = len(dims)
    if unreduced.is_unreduced(src):
        groups = unreduced.groups_of(src, n, rank)
        k = int(groups.shape[1])
        twin = unreduced.reduced(src)
        local = tile_shape(twin, dims) if twin.is_tiled else list(dims)
        part = array_bytes(local, itemsize)
        if not unreduced.is_unreduced(dst) and dst.is_tiled:
            for d in range(rank):
                if local[d] % k == 0 and unreduced.scattered(src, n, rank, d) == dst:
                    piece = list(local)
                    piece[d] //= k
                    return [GroupReduceScatter(src, dst, bytes_per_device(
                        "reduce-scatter", part, part / k, k), array_bytes(piece, itemsize), d)]
        steps: list[Step] = [GroupAllReduce(src, twin, bytes_per_device(
            "all-reduce", part, part, k), part)]
        if twin != dst:
            steps.append(Via(twin, dst, reshard_plan(dims, itemsize, twin, dst, n)))
        return steps
    if unreduced.is_unreduced(dst):
        twin = unreduced.reduced(dst)
        steps = []
        if twin != src:
            steps.append(Via(src, twin, reshard_plan(dims, itemsize, src, twin, n)))
        local = tile_shape(twin, dims) if twin.is_tiled else list(dims)
        return steps + [KeepOnLeader(twin, dst, 0.0, array_bytes(local, itemsize))]
    full = array_bytes(dims, itemsize)
    if src.is_maximal and dst.is_maximal:
        return [OwnerMove(src, dst, bytes_per_device("collective-permute", full, full, 2),
                          full)]
    scatter = maximal_to_tiled_price(dims, itemsize, dst, n) if src.is_maximal else None
    if scatter is not None and scatter[0] < bytes_per_device("all-reduce", full, full, n):
        return [OwnerReduceScatter(src, dst, *scatter)]
    steps = []
    if src.is_maximal:
        rep = HloSharding.replicate()
        steps.append(OwnerAllReduce(src, rep, bytes_per_device("all-reduce", full, full, n),
                                    full))
        src = rep
        if src == dst:
            return steps
    tiles = src.tile_dims_for_data() if src.is_tiled else [1] * rank
    if dst.is_maximal:
        # A replicated value is valid on the owner device as well.
        rep = HloSharding.replicate()
        if not src.is_replicated:
            steps.append(Gather(src, rep, replicate_cost(dims, itemsize, tiles),
                                _gathered_bytes(dims, itemsize, tiles)))
        return steps + [Relabel(rep, dst)]
    if rank and src.is_tiled:
        plan = reshard_routes.chosen_plan(dims, itemsize, src, dst, n)
        if plan is not None:
            return steps + [Routes(src, dst, plan,
                                   reshard_routes.plan_peak(plan, dims, itemsize))]
    if dst.is_replicated:
        return steps + [Gather(src, dst, replicate_cost(dims, itemsize, tiles),
                               _gathered_bytes(dims, itemsize, tiles))]
    # Through the replicated value, itself remembered for later users.
    rep = HloSharding.replicate()
    if not src.is_replicated:
        steps.append(Via(src, rep, reshard_plan(dims, itemsize, src, rep, n)))
    return steps + [CutLocal(rep, dst, 0.0, _cut_bytes(dims, itemsize, dst))]


def _gathered_bytes(dims: Sequence[int], itemsize: float, tiles: Sequence[int]) -> float:
    """The largest array ``replicate`` makes from data tiles ``tiles``: the last
    all-gather's, every tiled dim whole with its padding (sliced off after)."""
    return array_bytes([-(-int(d) // int(t)) * int(t) for d, t in zip(dims, tiles)], itemsize)


def _cut_bytes(dims: Sequence[int], itemsize: float, dst: HloSharding) -> float:
    """The largest array ``slice_replicated`` makes cutting ``dst``'s tile: the padded
    value (uneven dims) or the tile."""
    local = [int(v) for v in tile_shape(dst, dims)]
    padded = [l * int(t) for l, t in zip(local, dst.tile_dims_for_data())]
    return max(array_bytes(padded, itemsize) if padded != [int(d) for d in dims] else 0.0,
               array_bytes(local, itemsize) if local != padded else 0.0)


def reshard_cost(dims: Sequence[int], itemsize: float, src: HloSharding,
                 dst: HloSharding, num_devices: int) -> float:
    """Bytes per device on the wire of ``reshard`` taking an array of global ``dims`` (of
    ``itemsize`` bytes per element) from ``src`` to ``dst`` over ``num_devices`` logical
    devices: the price of the plan ``reshard`` walks (``reshard_plan``). The reshard
    cache is not consulted: this is the price of a fresh reshard. ``inf`` for pairs
    ``reshard`` rejects (manual <-> non-manual)."""
    if src == dst:
        return 0.0
    return reshard_plan(dims, itemsize, src, dst, num_devices).cost


def reshard_price(ctx: "ReshardContext", pv: PValue, target: HloSharding,
                  recreate: bool = True) -> tuple[float, float]:
    """(bytes per device on the wire, bytes of the largest new array) that
    ``reshard(ctx, pv, target)`` would cost now: nothing when the reshard cache already
    holds it, else ``reshard_cost`` and ``reshard_peak`` (the price a planner compares
    before emitting only its winner); no bytes on the wire when the value would be
    re-made in ``target`` (``recreate=False``: the price of moving it)."""
    if pv.sharding == target or _cache_key(ctx, pv, target) in ctx.state.reshard_cache:
        return 0.0, 0.0
    shape = pv.base_shape
    size = element_bytes(shape.element_type)
    if pv.sharding.is_tuple or target.is_tuple:
        n = len(shape.tuple_shapes)
        parts = [reshard_price(ctx, PValue(pv.hlo, s, a), b) for s, a, b in
                 zip(shape.tuple_shapes, _tuple_elems(pv.sharding, n), _tuple_elems(target, n))]
        return sum(p[0] for p in parts), max((p[1] for p in parts), default=0.0)
    n = ctx.num_devices
    if recreate:
        plan = _value_plan(ctx, pv, target)
    else:
        plan = reshard_plan(shape.dims, size, pv.sharding, target, n)
    return plan.cost, plan.peak


def reshard_peak(dims: Sequence[int], itemsize: float, src: HloSharding,
                 dst: HloSharding, num_devices: int) -> float:
    """Bytes per device of the largest array ``reshard`` makes from the value taking
    ``dims`` from ``src`` to ``dst``: the peak of the plan it walks (``reshard_plan``),
    the memory side of ``reshard_cost``, for planners that weigh the largest new
    tensor."""
    if src == dst or src.is_tuple or dst.is_tuple:
        return 0.0
    return reshard_plan(dims, itemsize, src, dst, num_devices).peak


def _reshard_tuple(ctx: "ReshardContext", pv: PValue, target: HloSharding) -> PValue:
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
def replicate(ctx: "ReshardContext", pv: PValue) -> PValue:
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


def _scatter_layout(s: HloSharding, dims, n: int):
    """The reshard_routes layout of tiled ``s`` (replicated subgroups only) when the owner's
    value can be scattered to it (a balanced layout over all ``n`` devices), else None."""
    if not s.is_tiled or n < 2 or not dims or any(int(d) == 0 for d in dims):
        return None
    if any(t != ShardingType.REPLICATED for t in s.subgroup_types):
        return None
    lay = layout_of(s, n, len(dims))
    if lay is None or not lay.balanced() or all(t == 1 for t in lay.tiles):
        return None
    return lay


def _scatter_sizes(dims, tiles, replication: int) -> tuple[list[int], int, int]:
    """(local tile dims, elements per tile, elements per device's reduce-scatter chunk)."""
    local = [-(-int(d) // int(t)) for d, t in zip(dims, tiles)]
    per_tile = math.prod(local)
    return local, per_tile, -(-per_tile // replication)


def _owner_only(ctx: "ReshardContext", pv: PValue) -> Instruction:
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


def maximal_to_maximal(ctx: "ReshardContext", pv: PValue, target: HloSharding) -> PValue:
    """The owner's value to another single device: one collective-permute owner -> new
    owner (the other devices send nothing and keep what they had, which means nothing)."""
    out = ctx.f.collective_permute(pv.hlo, [(pv.sharding.device, target.device)])
    return PValue(out, pv.base_shape, target)


def maximal_to_tiled(ctx: "ReshardContext", pv: PValue, target: HloSharding) -> PValue:
    """The owner's value to a tiled (possibly partially replicated) sharding over every
    device: the owner-only value (zeros elsewhere), cut into its tiles laid out one after
    another (each split in as many chunks as it has holders), one reduce-scatter over all
    devices ordered by (tile, holder), then an all-gather among each tile's holders:
    (n-1)/n of the value plus the tile, where all-reduce + slice moves 2 (n-1)/n."""
    lay = _scatter_layout(target, pv.base_shape.dims, ctx.num_devices)
    assert lay is not None
    b = ctx.b
    dims = [int(d) for d in pv.base_shape.dims]
    tiles = list(lay.tiles)
    r = lay.replication
    local, per_tile, chunk = _scatter_sizes(dims, tiles, r)
    x = pad_to(ctx, _owner_only(ctx, pv), [l * t for l, t in zip(local, tiles)])
    # [t0, l0, t1, l1, ...] -> [t0, t1, ..., l0, l1, ...] -> [tiles, per tile] (padded to
    # the holders' chunks) -> [tiles * holders, chunk].
    split = [v for pair in zip(tiles, local) for v in pair]
    rank = len(dims)
    x = b.reshape(x, split)
    x = b.transpose(x, [2 * k for k in range(rank)] + [2 * k + 1 for k in range(rank)])
    x = b.reshape(x, [math.prod(tiles), per_tile])
    x = pad_to(ctx, x, [math.prod(tiles), chunk * r])
    x = b.reshape(x, [math.prod(tiles) * r, chunk])
    tile = lay.tile_ids()
    order = np.lexsort((np.arange(ctx.num_devices), tile))  # devices by (tile, device)
    op = "or" if x.shape.element_type == PrimitiveType.PRED else "add"
    x = ctx.f.reduce_scatter(x, 0, op, order.reshape(1, -1))
    if r > 1:
        x = ctx.f.all_gather(x, 0, order.reshape(-1, r))
    x = b.reshape(x, [chunk * r])
    x = slice_to(ctx, x, [per_tile])
    return PValue(b.reshape(x, local), pv.base_shape, target)


def maximal_to_tiled_price(dims, itemsize: float, target: HloSharding,
                           n: int) -> tuple[float, float] | None:
    """(what ``maximal_to_tiled`` moves, its largest array: the owner-only value cut into
    its tiles and holders' chunks, one row per device), or None when it does not apply."""
    lay = _scatter_layout(target, dims, n)
    if lay is None:
        return None
    _, _, chunk = _scatter_sizes(dims, lay.tiles, lay.replication)
    # (each array rounded up to whole bytes, as ``stats`` counts packed types)
    part = array_bytes([chunk], itemsize)
    total = bytes_per_device("reduce-scatter", array_bytes([n * chunk], itemsize), part, n)
    if lay.replication > 1:
        r = lay.replication
        total += bytes_per_device("all-gather", part, array_bytes([r * chunk], itemsize), r)
    return total, array_bytes([n * chunk], itemsize)


def maximal_to_replicated(ctx: "ReshardContext", pv: PValue) -> PValue:
    """The owner's value to every device: zero elsewhere, then all-reduce."""
    n = ctx.num_devices
    selected = _owner_only(ctx, pv)
    op = "or" if selected.shape.element_type == PrimitiveType.PRED else "add"
    out = ctx.f.all_reduce(selected, op, np.arange(n).reshape(1, n))
    return PValue(out, pv.base_shape, HloSharding.replicate())

