"""Choosing how to partition a dot: candidate strategies and their cost.

Pure planning on shapes and shardings (no instructions are built), so strategies can be
compared before one is emitted, and recursive (grouped) sub-problems can be planned the
same way as the top-level one.

Strategies (see dot_dims for the iteration space):

* ``BasePlan(T)``: reshard lhs and rhs to the tiles of an iteration-space sharding ``T``,
  one local dot; if ``T`` tiles contracting dims the local results are partial sums,
  combined by an all-reduce over the contracting groups, or by a reduce-scatter that
  leaves the result tiled on one output dim; finally reshard to the output sharding.
  Candidates for ``T`` come from the operand and output shardings and their compatible
  merges, so (a) matched batch / non-contracting dims -> no communication, (b) matched
  contracting dims -> partial dot + all-reduce / reduce-scatter, (c) one operand matching
  the output -> gather the other operand, and 2D mixes (Megatron) are all base plans.
* ``GroupPlan``: GSPMD's recursive grouping (section 4.4). Dims sharded alike on several
  tensors (batch dims on lhs/rhs/output, a non-contracting dim on one operand and the
  output, contracting dims on both operands) split the devices into groups; the tensors
  are (re)sharded so each group holds one block, and the rest of the problem - per-group
  shapes, inner shardings over group-local ids - is planned recursively. Grouping on
  contracting dims ends with an all-reduce across groups.

Cost = bytes per device on the wire, then local flops, then a preference for grouping
(the paper's structure) on exact ties. Every figure comes from the one cost model: a
reshard costs ``reshard.reshard_cost`` (the route ``reshard`` will take), the partial sums
``collectives.cost.bytes_per_device`` of the all-reduce or reduce-scatter emitted, the
same figures ``stats`` reports for the partitioned program.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Union

import numpy as np

from hlo_spmd.collectives.cost import bytes_per_device
from hlo_spmd.memo import BoundedMemo
from hlo_spmd.sharding.array_key import array_token
from hlo_spmd.passes.partition.reshard import reshard_cost
from hlo_spmd.sharding import HloSharding, group_by_dims, partial_replicate
from hlo_spmd.sharding import merge_compatible as _merge
from hlo_spmd.passes.partition.support.dot_dims import (
    BATCH, CONTRACTING, LHS_NC, RHS_NC, DotDims, data_tiles, group0_view, is_plain, lift,
    per_group_dims, project, reduction_groups, regroup, scattered, ungroup_to)

MAX_DEPTH = 3          # grouping levels explored (each at least halves the devices)
LHS, RHS, OUT = 0, 1, 2


# Records are NamedTuples (value equality, hashable) and plain classes, not dataclasses:
# a dataclass costs ~1 ms of start-up each (Python 3.11 compiles its methods).
class Problem(NamedTuple):
    """One (sub-)problem: global (or per-group) shapes and shardings over ``n`` devices."""
    dims: DotDims
    lhs_shape: tuple[int, ...]
    rhs_shape: tuple[int, ...]
    lhs: HloSharding
    rhs: HloSharding
    out: HloSharding
    n: int
    ebytes: tuple[float, float, float]  # element bytes of lhs, rhs, output (packed)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.dims.out_dims(self.lhs_shape, self.rhs_shape)

    @property
    def iter_sizes(self) -> tuple[int, ...]:
        return self.dims.iter_sizes(self.lhs_shape, self.rhs_shape)

    def shape(self, which: int) -> tuple[int, ...]:
        # The output shape is derived (dims.out_dims): only made when it is asked for.
        if which == OUT:
            return self.out_shape
        return self.lhs_shape if which == LHS else self.rhs_shape

    def sharding(self, which: int) -> HloSharding:
        return (self.lhs, self.rhs, self.out)[which]

    def rank(self, which: int) -> int:
        return len(self.shape(which))


class Cost(NamedTuple):
    """Compared field by field in this order (bytes, then flops, then preference)."""
    bytes: float
    flops: float = 0.0
    pref: int = 0

    def __add__(self, other: "Cost") -> "Cost":  # type: ignore[override]  (sum, not concat)
        return Cost(self.bytes + other.bytes, self.flops + other.flops, self.pref + other.pref)


class BasePlan:
    def __init__(self, t: HloSharding, lhs_t: HloSharding, rhs_t: HloSharding, post: str,
                 scatter_dim: int, result: HloSharding, cost: Cost) -> None:
        self.t = t                      # iteration-space sharding
        self.lhs_t = lhs_t
        self.rhs_t = rhs_t
        self.post = post                # "none" | "all-reduce" | "reduce-scatter"
        self.scatter_dim = scatter_dim
        self.result = result            # output sharding before the final reshard
        self.cost = cost
        # (dims, the partial sums' reduction groups, read-only): made once per plan, which
        # every dot with the same problem shares (reduction_groups_of).
        self._reduction: tuple | None = None

    def describe(self) -> str:
        tail = {"none": "", "all-reduce": " + all-reduce",
                "reduce-scatter": f" + reduce-scatter(dim {self.scatter_dim})"}[self.post]
        return f"base(T={self.t}){tail}"


class GroupPlan:
    def __init__(self, kind: str, groups: np.ndarray, sizes: tuple[int, ...], x_dims: tuple,
                 lhs_t: HloSharding, rhs_t: HloSharding, inner: Problem, inner_plan: "Plan",
                 result: HloSharding, cost: Cost) -> None:
        self.kind = kind
        self.groups = groups            # [num_groups, group_size] logical ids
        self.sizes = sizes
        self.x_dims = x_dims            # per tensor (lhs, rhs, out): grouped dims or None
        self.lhs_t = lhs_t              # outer targets of the operands
        self.rhs_t = rhs_t
        self.inner = inner
        self.inner_plan = inner_plan
        self.result = result            # outer output sharding after the cross-group reduction
        self.cost = cost
        # What emission derives from the plan, made once per plan (plans are shared by
        # every dot with the same problem): id(outer grouping) -> (outer, inner grouping),
        # and the cross-group reduction groups.
        self.subgroups: dict[int, tuple] = {}
        self._cross: np.ndarray | None = None

    @property
    def cross_groups(self) -> np.ndarray:
        """``groups.T``: the devices that hold the same block in every group (read-only)."""
        if self._cross is None:
            cross = np.ascontiguousarray(self.groups.T)
            cross.flags.writeable = False
            self._cross = cross
        return self._cross

    def describe(self) -> str:
        return (f"group({self.kind} x{math.prod(self.sizes)}) -> "
                f"{self.inner_plan.describe()}")


Plan = Union[BasePlan, GroupPlan]


class Planner:
    """The search, with its memo of plans per (problem, depth); reshards are priced by
    ``reshard.reshard_cost`` (memoized there)."""

    def __init__(self) -> None:
        self.memo: dict = {}

    # -- search --------------------------------------------------------------------------
    def plan(self, p: Problem, depth: int = 0) -> Plan:
        key = (p, depth)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        # Candidates in the order of _base_plans then _group_plans, the first of equal
        # costs kept. Each is priced against the best so far (branch and bound): every
        # term of a cost is bytes >= 0, so once the bytes priced so far exceed the best's,
        # the candidate cannot win and the rest of it (reshard routes, inner problems) is
        # never priced. The plan chosen is the one the full comparison chooses.
        # The replicated candidate (always first: it gathers both operands whole) is
        # priced last, once a bound is known; ties still go to the earlier candidate of
        # the full order (best is kept by (cost, position)).
        ts = self._iteration_candidates(p)
        order = list(range(1, len(ts))) + [0]
        best: Plan | None = None
        best_key: tuple = ()
        for i in order:
            cand = self._base_plan(p, ts[i], math.inf if best is None else best.cost.bytes)
            if cand is not None and (best is None or (cand.cost, i) < best_key):
                best, best_key = cand, (cand.cost, i)
        if depth < MAX_DEPTH:
            for spec in self._group_specs(p):
                cand = self._group_plan(p, depth, *spec,
                                        bound=math.inf if best is None else best.cost.bytes)
                if cand is not None and (best is None or cand.cost < best.cost):
                    best = cand
        assert best is not None
        self.memo[key] = best
        return best

    # -- base plans ----------------------------------------------------------------------
    def _iteration_candidates(self, p: Problem) -> list[HloSharding]:
        d = p.dims
        ir = d.iter_rank
        lifts = [lift(p.sharding(w), d.tensor_iter(w), ir, p.n) for w in (LHS, RHS, OUT)]
        lhs_l, rhs_l, out_l = lifts
        cands: list[HloSharding | None] = [HloSharding.replicate(), *lifts]

        def merge(a, b):
            return _merge(a, b) if a is not None and b is not None else None

        contr = d.kind_iter(CONTRACTING)
        cands += [merge(lhs_l, rhs_l), merge(lhs_l, out_l), merge(rhs_l, out_l),
                  merge(merge(lhs_l, rhs_l), out_l)]
        for x in (lhs_l, rhs_l):
            if x is not None and not x.is_replicated:
                cands.append(merge(partial_replicate(x, contr), out_l))
        seen: list[HloSharding] = []
        untiled = d.untiled_iter
        for c in cands:
            if c is not None and untiled and c.is_tiled:
                # An output tiled on a dim no block may tile (a convolution's windowed
                # dim): the block leaves it whole, the final reshard is priced.
                tiles = data_tiles(c, ir)
                drop = [k for k in untiled if tiles[k] > 1]
                c = partial_replicate(c, drop) if drop else c
            if c is not None and c not in seen and (c.is_replicated or c.num_devices == p.n):
                seen.append(c)
        return seen

    def _base_plans(self, p: Problem) -> list[BasePlan]:
        """Every base candidate, fully priced."""
        return [self._base_plan(p, t) for t in self._iteration_candidates(p)]  # type: ignore

    def _base_plan(self, p: Problem, t: HloSharding,
                   bound: float = math.inf) -> BasePlan | None:
        """The base plan of ``t``; None once its bytes are known to exceed ``bound`` (it
        would lose to a plan of ``bound`` bytes: see ``plan``)."""
        d = p.dims
        ir, orank = d.iter_rank, d.out_rank
        lhs_t = project(t, d.lhs_iter, ir)
        inbytes = reshard_cost(p.lhs_shape, p.ebytes[LHS], p.lhs, lhs_t, p.n)
        if round(inbytes, 3) > bound:
            return None
        rhs_t = project(t, d.rhs_iter, ir)
        inbytes = inbytes + reshard_cost(p.rhs_shape, p.ebytes[RHS], p.rhs, rhs_t, p.n)
        if round(inbytes, 3) > bound:
            return None
        out_shape = p.out_shape
        tiles = data_tiles(t, ir)
        local = [-(-s // k) for s, k in zip(p.iter_sizes, tiles)]
        flops = float(math.prod(local))
        out_local = local[:orank]
        rbytes = float(math.prod(out_local) * p.ebytes[OUT])
        contr = d.kind_iter(CONTRACTING)
        k = math.prod(tiles[c] for c in contr)
        options: list[tuple[float, str, int, HloSharding]] = []
        res = project(t, d.out_iter, ir)
        fin = reshard_cost(out_shape, p.ebytes[OUT], res, p.out, p.n)
        if k == 1:
            options.append((fin, "none", -1, res))
        else:
            options.append((bytes_per_device("all-reduce", rbytes, rbytes, k) + fin,
                            "all-reduce", -1, res))
            for dim in range(orank):
                size = out_local[dim]
                if size == 0 or not (tiles[dim] == 1 or size % k == 0):
                    continue
                padded = rbytes / size * (-(-size // k) * k)
                rs = scattered(t, ir, orank, contr, dim)
                fin_rs = reshard_cost(out_shape, p.ebytes[OUT], rs, p.out, p.n)
                options.append((bytes_per_device("reduce-scatter", padded, padded / k, k)
                                + fin_rs, "reduce-scatter", dim, rs))
        post_bytes, post, sdim, result = min(options, key=lambda o: o[0])
        cost = Cost(round(inbytes + post_bytes, 3), flops, 0)
        return BasePlan(t, lhs_t, rhs_t, post, sdim, result, cost)

    # -- grouping --------------------------------------------------------------------------
    def _tensor_dims(self, p: Problem, which: int, iters: list[int]) -> tuple[int, ...] | None:
        ti = p.dims.tensor_iter(which)
        if not all(k in ti for k in iters):
            return None
        return tuple(ti.index(k) for k in iters)

    def _iter_tiles(self, p: Problem, which: int) -> list[int]:
        tiles = [1] * p.dims.iter_rank
        s = p.sharding(which)
        if is_plain(s):
            st = data_tiles(s, p.rank(which))
            for j, k in enumerate(p.dims.tensor_iter(which)):
                tiles[k] = st[j]
        return tiles

    def _group_candidates(self, p: Problem) -> list[tuple[str, list[int], int]]:
        d = p.dims
        tl, tr, to = (self._iter_tiles(p, w) for w in (LHS, RHS, OUT))
        tt = {LHS: tl, RHS: tr, OUT: to}
        out: list[tuple[str, list[int], int]] = []

        def matched(kind: str, whos: tuple[int, ...]) -> list[int]:
            return [k for k in d.kind_iter(kind)
                    if tt[whos[0]][k] > 1 and all(tt[w][k] == tt[whos[0]][k] for w in whos)]

        for whos in ((OUT, LHS, RHS), (OUT, LHS), (OUT, RHS), (LHS, RHS)):
            m = matched(BATCH, whos)
            if m:
                out.append((BATCH, m, whos[0]))
        for kind, op in ((LHS_NC, LHS), (RHS_NC, RHS)):
            m = matched(kind, (OUT, op))
            if m:
                out += [(kind, m, OUT), (kind, m, op)]
        m = matched(CONTRACTING, (LHS, RHS))
        if m:
            out += [(CONTRACTING, m, LHS), (CONTRACTING, m, RHS)]
        return out

    def _group_plans(self, p: Problem, depth: int) -> list[GroupPlan]:
        """Every group candidate, fully priced."""
        plans = [self._group_plan(p, depth, *spec) for spec in self._group_specs(p)]
        return [g for g in plans if g is not None]

    def _group_specs(self, p: Problem):
        """The distinct groupings to try: (kind, iters, groups, sizes)."""
        seen: set = set()
        for kind, iters, ref in self._group_candidates(p):
            ref_dims = self._tensor_dims(p, ref, iters)
            assert ref_dims is not None
            ref_s = p.sharding(ref)
            if not is_plain(ref_s) or not ref_s.is_tiled:
                continue
            groups = _device_groups(ref_s, ref_dims)
            ref_tiles = data_tiles(ref_s, p.rank(ref))
            sizes = tuple(int(ref_tiles[x]) for x in ref_dims)
            key = (kind, tuple(iters), array_token(groups))
            if key in seen or math.prod(sizes) <= 1:
                continue
            seen.add(key)
            yield kind, iters, groups, sizes

    def _grouped(self, p: Problem, which: int, groups: np.ndarray, x_dims, sizes,
                 target: bool = True) -> tuple[HloSharding, HloSharding | None]:
        """(inner sharding, outer target) of tensor ``which`` for ``groups``: its own
        sharding when it is grouped exactly, else group 0's view, regrouped (the target
        only when asked for: the output's is never read)."""
        s, rank = p.sharding(which), p.rank(which)
        exact = regroup(s, rank, groups, x_dims, sizes)
        if exact is not None:
            return exact, s
        guess = group0_view(s, rank, groups, x_dims)
        return guess, ungroup_to(groups, rank, x_dims, sizes, guess) if target else None

    def _group_plan(self, p: Problem, depth: int, kind: str, iters: list[int],
                    groups: np.ndarray, sizes: tuple[int, ...],
                    bound: float = math.inf) -> GroupPlan | None:
        """The group plan; None when it does not apply, or once its bytes are known to
        exceed ``bound`` (the inner problem is then not planned: see ``plan``)."""
        x_dims = tuple(self._tensor_dims(p, w, iters) for w in (LHS, RHS, OUT))
        (lhs_i, lhs_t), (rhs_i, rhs_t) = (self._grouped(p, w, groups, x_dims[w], sizes)
                                          for w in (LHS, RHS))
        align = (reshard_cost(p.lhs_shape, p.ebytes[LHS], p.lhs, lhs_t, p.n)
                 + reshard_cost(p.rhs_shape, p.ebytes[RHS], p.rhs, rhs_t, p.n))
        if round(align, 3) > bound:  # (before the output is grouped)
            return None
        out_i, _ = self._grouped(p, OUT, groups, x_dims[OUT], sizes, target=False)
        inner = Problem(p.dims, per_group_dims(p.lhs_shape, x_dims[LHS], sizes),
                        per_group_dims(p.rhs_shape, x_dims[RHS], sizes),
                        lhs_i, rhs_i, out_i, int(groups.shape[1]), p.ebytes)
        reduce = 0.0
        if kind == CONTRACTING:
            ng = int(groups.shape[0])
            local = float(math.prod(_local_dims(inner.out_shape, inner.out)) * p.ebytes[OUT])
            reduce = bytes_per_device("all-reduce", local, local, ng)
        result = ungroup_to(groups, p.rank(OUT), x_dims[OUT], sizes, inner.out)
        fin = reshard_cost(p.out_shape, p.ebytes[OUT], result, p.out, p.n)
        outer = round(align + reduce + fin, 3)
        if outer > bound:  # the inner plan's bytes only add to it
            return None
        inner_plan = self.plan(inner, depth + 1)
        cost = Cost(outer, 0.0, -1) + inner_plan.cost
        return GroupPlan(kind, groups, sizes, x_dims, lhs_t, rhs_t, inner, inner_plan,
                         result, cost)


# (sharding, dims) -> the device groups of grouping it on those dims (read-only): asked
# for every grouping candidate of every problem, a few distinct ones per model. The groups
# depend on the tile assignment only: keyed by value.
_GROUPS = BoundedMemo(1024)


def _device_groups(s: HloSharding, dims: tuple[int, ...]) -> np.ndarray:
    key = (s, dims)
    hit = _GROUPS.get(key)
    if hit is None:
        hit = np.array(group_by_dims(s, list(dims)).device_groups, np.int64)  # a copy
        hit.flags.writeable = False
        hit = _GROUPS.put(key, hit)
    return hit


def _local_dims(shape: tuple[int, ...], s: HloSharding) -> tuple[int, ...]:
    tiles = data_tiles(s, len(shape))
    return tuple(-(-d // t) for d, t in zip(shape, tiles))


def reduction_groups_of(plan: BasePlan, dims: DotDims) -> np.ndarray:
    """The groups that sum ``plan``'s partial results (read-only; made once per plan)."""
    got = plan._reduction
    if got is None or (got[0] is not dims and got[0] != dims):
        groups = np.ascontiguousarray(
            reduction_groups(plan.t, dims.iter_rank, dims.kind_iter(CONTRACTING)))
        groups.flags.writeable = False
        got = plan._reduction = (dims, groups)
    return got[1]
