"""One dims model for dot and convolution, shared by completion and partitioning (XLA's
DotConvolutionDimsInfo of dot_as_convolution_util, and the dims mapping its dot handler
reuses for convolutions).

``DotDims`` classifies the dims of a dot, or of a convolution read as a dot, as XLA does:
batch (in lhs, rhs and output), contracting (lhs and rhs), lhs / rhs non-contracting (one
operand and the output) and windowed spatial dims (``conv_spatial``). Completion reads
these classes directly.

The partitioner's dot planner works on an *iteration space* derived from the same
object: iteration dim ``o < output_rank`` is output dim ``o``; then one dim per
contracting pair; then one per operand dim that is in neither (kernel spatial dims,
the kernel input feature of a grouped convolution, size-1 dims of degenerate spatial
dims). A tiled sharding of the iteration space says which block of the computation a
device does (see partition/support/dot_dims). For a convolution the planner classes
differ from the completion classes in one way: with ``feature_group_count`` > 1 the input
feature, kernel output feature and output feature form a *batch* dim (every shard holds
whole groups), and with ``batch_group_count`` > 1 so do the input batch, kernel output
feature and output feature. Dims the planner must never tile (windowed spatial dims,
extra dims, an output-only batch dim) are listed by ``untiled``; the convolution handler
partitions windowed dims itself (halo exchange) before it calls the planner.
"""
from __future__ import annotations

import math
from functools import cached_property
from typing import NamedTuple, Sequence

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.memo import BoundedMemo
from hlo_spmd.records import FrozenRecord

BATCH, LHS_NC, RHS_NC, CONTRACTING = "batch", "lhs_nc", "rhs_nc", "contracting"
KINDS = (BATCH, LHS_NC, RHS_NC, CONTRACTING)


# The plain records are NamedTuples, not dataclasses: ~1 ms less start-up each
# (Python 3.11 compiles a dataclass's methods); equality and hashing are the same.
class DimNums(NamedTuple):
    """One logical dot dimension: its index in lhs, rhs and output (-1 if absent), and for
    a convolution the index of its window dim (-1 if none)."""

    lhs: int
    rhs: int
    output: int
    spatial: int = -1


class WindowDim(NamedTuple):
    """One window dimension with XLA's defaults for fields a proto leaves at 0."""

    size: int = 1
    stride: int = 1
    padding_low: int = 0
    padding_high: int = 0
    window_dilation: int = 1
    base_dilation: int = 1
    window_reversal: bool = False

    def output_size(self, base: int) -> int:
        """Number of window positions over a base of ``base`` elements."""
        dilated = 0 if base == 0 else (base - 1) * self.base_dilation + 1
        padded = self.padding_low + dilated + self.padding_high
        span = (self.size - 1) * self.window_dilation + 1
        return 0 if padded < span else (padded - span) // self.stride + 1

    @property
    def span(self) -> int:
        """Elements of the (dilated) base one window covers."""
        return (self.size - 1) * self.window_dilation + 1


def window_dims(inst: Instruction) -> list[WindowDim]:
    return [WindowDim(d.size or 1, d.stride or 1, d.padding_low, d.padding_high,
                      d.window_dilation or 1, d.base_dilation or 1, bool(d.window_reversal))
            for d in inst.attrs.window.dimensions]


class ConvLabels(NamedTuple):
    """Where batch / feature / spatial dims sit in a convolution's three tensors."""

    in_batch: int
    in_feature: int
    k_in: int
    k_out: int
    out_batch: int
    out_feature: int
    in_spatial: tuple[int, ...]
    k_spatial: tuple[int, ...]
    out_spatial: tuple[int, ...]
    feature_group_count: int = 1
    batch_group_count: int = 1


class DotDims(FrozenRecord):
    """DotConvolutionDimsInfo: a dot (or a conv read as a dot) split into dim classes,
    with the planner's iteration-space view (see the module docstring)."""
    # A records.FrozenRecord (equality, hash and repr as the frozen dataclass it was, ~1
    # ms less start-up); no __slots__ of its own: the cached properties need a __dict__.
    __match_args__ = ("batch", "contracting", "lhs_non_contracting", "rhs_non_contracting",
                      "conv_spatial", "lhs_rank", "rhs_rank", "output_rank", "window", "conv")

    batch: tuple[DimNums, ...]
    contracting: tuple[DimNums, ...]
    lhs_non_contracting: tuple[DimNums, ...]
    rhs_non_contracting: tuple[DimNums, ...]
    conv_spatial: tuple[DimNums, ...]
    lhs_rank: int
    rhs_rank: int
    output_rank: int
    window: tuple[WindowDim, ...]
    conv: ConvLabels | None

    def __init__(self, batch: tuple[DimNums, ...], contracting: tuple[DimNums, ...],
                 lhs_non_contracting: tuple[DimNums, ...],
                 rhs_non_contracting: tuple[DimNums, ...], conv_spatial: tuple[DimNums, ...],
                 lhs_rank: int, rhs_rank: int, output_rank: int,
                 window: tuple[WindowDim, ...] = (), conv: ConvLabels | None = None) -> None:
        self._set_fields(batch, contracting, lhs_non_contracting, rhs_non_contracting,
                         conv_spatial, lhs_rank, rhs_rank, output_rank, window, conv)

    @staticmethod
    def of(inst: Instruction) -> "DotDims":
        return parse_dot(inst) if inst.opcode == "dot" else parse_conv(inst)

    def with_window(self, window: Sequence[WindowDim]) -> "DotDims":
        """The same dims with another window (per-shard convolutions)."""
        return DotDims(*self._fields()[:-2], tuple(window), self.conv)

    # -- the planner's classes ---------------------------------------------------------
    @cached_property
    def _planner(self) -> tuple[tuple[DimNums, ...], ...]:
        """(batch, contracting, lhs_nc, rhs_nc) as the planner reads them."""
        c = self.conv
        if c is None:
            return (self.batch, self.contracting, self.lhs_non_contracting,
                    self.rhs_non_contracting)
        batch = [d for d in self.batch if self._shardable_spatial(d)]
        contracting = [d for d in self.contracting if d.spatial < 0 or self._shardable_spatial(d)]
        lnc = [d for d in self.lhs_non_contracting if d.spatial < 0 or self._shardable_spatial(d)]
        rnc = [d for d in self.rhs_non_contracting if d.spatial < 0 or self._shardable_spatial(d)]
        if c.feature_group_count > 1:
            contracting = [d for d in contracting if d.spatial >= 0]
            rnc = [d for d in rnc if d.spatial >= 0]
            batch.insert(0, DimNums(c.in_feature, c.k_out, c.out_feature))
        elif c.batch_group_count > 1:
            lnc = [d for d in lnc if d.spatial >= 0]
            rnc = [d for d in rnc if d.spatial >= 0]
            batch.insert(0, DimNums(c.in_batch, c.k_out, c.out_feature))
        return tuple(batch), tuple(contracting), tuple(lnc), tuple(rnc)

    def _shardable_spatial(self, d: DimNums) -> bool:
        """Degenerate spatial dims the planner may tile: contracting-like ones (the window
        covers the whole dim; the per-shard window shrinks with it), size-1 windows, and
        the kernel-wide reversed window over a size-1 input (output row o is kernel row o:
        the per-shard window is the same form at the shard's size, ``rhs_nc_window``)."""
        if d.spatial < 0:
            return True
        if d in self.contracting or d in self.batch:
            # (a batch-like window pairs input row i with kernel row i: rewritten for the
            # shard's size by batch_window)
            return True
        if d in self.lhs_non_contracting or d in self.rhs_non_contracting:
            return True
        return False

    def kind_dims(self, kind: str) -> tuple[DimNums, ...]:
        b, c, l, r = self._planner
        return {BATCH: b, CONTRACTING: c, LHS_NC: l, RHS_NC: r}[kind]

    @property
    def out_rank(self) -> int:
        return self.output_rank

    @cached_property
    def _extra(self) -> tuple[tuple[int, int], ...]:
        """(tensor, dim) of the operand dims mapped by no planner class (0 lhs, 1 rhs)."""
        b, c, l, r = self._planner
        used = ({d.lhs for d in (*b, *c, *l)}, {d.rhs for d in (*b, *c, *r)})
        out = []
        for w, rank in ((0, self.lhs_rank), (1, self.rhs_rank)):
            for d in range(rank):
                if d not in used[w] and not (w == 0 and self._lhs_spatial_out(d) >= 0):
                    out.append((w, d))
        return tuple(out)

    def _lhs_spatial_out(self, d: int) -> int:
        """The output dim a windowed lhs spatial dim maps to (-1 if ``d`` is none)."""
        for s in self.conv_spatial:
            if s.lhs == d:
                return s.output
        for s in self.batch + self.rhs_non_contracting:
            if s.spatial >= 0 and s.lhs == d and not self._shardable_spatial(s):
                return s.output
        return -1

    @property
    def iter_rank(self) -> int:
        return self.output_rank + len(self.kind_dims(CONTRACTING)) + len(self._extra)

    def kind_iter(self, kind: str) -> list[int]:
        """Iteration dims of one dimension class."""
        if kind == CONTRACTING:
            return list(range(self.output_rank, self.output_rank + len(self.kind_dims(kind))))
        return [d.output for d in self.kind_dims(kind)]

    def _tensor_map(self, which: int) -> tuple[int, ...]:
        b, c, l, r = self._planner
        rank = (self.lhs_rank, self.rhs_rank)[which]
        out = [-1] * rank
        pick = (lambda d: d.lhs) if which == 0 else (lambda d: d.rhs)
        for d in (*b, *(l if which == 0 else r)):
            out[pick(d)] = d.output
        for j, d in enumerate(c):
            out[pick(d)] = self.output_rank + j
        base = self.output_rank + len(c)
        for j, (w, d) in enumerate(self._extra):
            if w == which:
                out[d] = base + j
        if which == 0:
            for d in range(rank):
                if out[d] < 0:
                    out[d] = self._lhs_spatial_out(d)
        assert all(k >= 0 for k in out), (which, out)
        return tuple(out)

    @cached_property
    def lhs_iter(self) -> tuple[int, ...]:
        """Iteration dim of every lhs dim."""
        return self._tensor_map(0)

    @cached_property
    def rhs_iter(self) -> tuple[int, ...]:
        return self._tensor_map(1)

    @property
    def out_iter(self) -> tuple[int, ...]:
        return tuple(range(self.output_rank))

    def tensor_iter(self, which: int) -> tuple[int, ...]:
        """0 = lhs, 1 = rhs, 2 = output."""
        return (self.lhs_iter, self.rhs_iter, self.out_iter)[which]

    def untiled(self, which: int) -> tuple[int, ...]:
        """Dims of tensor ``which`` (0 lhs, 1 rhs, 2 out) the planner must not tile."""
        if which == 2:
            mapped = {d.output for k in (BATCH, LHS_NC, RHS_NC) for d in self.kind_dims(k)}
            return tuple(d for d in range(self.output_rank) if d not in mapped)
        mine = {d for w, d in self._extra if w == which}
        if which == 0:
            mine |= {d for d in range(self.lhs_rank) if self._lhs_spatial_out(d) >= 0}
        return tuple(sorted(mine))

    @cached_property
    def untiled_iter(self) -> tuple[int, ...]:
        """Iteration dims no block of the computation may tile: the output dims the planner
        must not tile (``untiled(2)``; iteration dim ``o`` is output dim ``o``) and the
        extra dims. Operands and result may still be tiled on them: the planner then
        prices their reshards to the blocks it picks."""
        base = self.output_rank + len(self.kind_dims(CONTRACTING))
        return self.untiled(2) + tuple(range(base, base + len(self._extra)))

    def out_dims(self, lhs: Sequence[int], rhs: Sequence[int]) -> tuple[int, ...]:
        """The output shape for operands of these shapes."""
        c = self.conv
        if c is None:
            out = [0] * self.output_rank
            for d in self.batch + self.lhs_non_contracting:
                out[d.output] = int(lhs[d.lhs])
            for d in self.rhs_non_contracting:
                out[d.output] = int(rhs[d.rhs])
            return tuple(out)
        out = [0] * self.output_rank
        out[c.out_batch] = int(lhs[c.in_batch]) // c.batch_group_count
        out[c.out_feature] = int(rhs[c.k_out])
        whole = self._whole_window_spatial
        paired = self._batch_window_spatial
        kernel_rows = self._rhs_nc_window_spatial
        for i, (l, r, o) in enumerate(zip(c.in_spatial, c.k_spatial, c.out_spatial)):
            # A contracting-like window spans the whole dim at any size (the per-shard
            # window shrinks with the shard, see local_convolution): one position; a
            # batch-like one pairs every input row with one output row, a kernel-wide
            # reversed one over a size-1 input every kernel row. The recorded window is
            # the global one, wider than a per-group shard.
            out[o] = 1 if i in whole else int(lhs[l]) if i in paired else \
                int(rhs[r]) if i in kernel_rows else self.window[i].output_size(int(lhs[l]))
        return tuple(out)

    @cached_property
    def _batch_window_spatial(self) -> frozenset[int]:
        """Window indices of the batch-like spatial dims (``_spatial_is_batch``)."""
        return frozenset(d.spatial for d in self.batch if d.spatial >= 0)

    @cached_property
    def _rhs_nc_window_spatial(self) -> frozenset[int]:
        """Window indices of the rhs-non-contracting spatial dims (kernel-wide reversed
        windows over a size-1 input)."""
        return frozenset(d.spatial for d in self.rhs_non_contracting if d.spatial >= 0)

    @cached_property
    def _whole_window_spatial(self) -> frozenset[int]:
        """Window indices of the contracting-like spatial dims (window = whole dim)."""
        return frozenset(d.spatial for d in self.contracting if d.spatial >= 0)

    def iter_sizes(self, lhs: Sequence[int], rhs: Sequence[int]) -> tuple[int, ...]:
        sizes = list(self.out_dims(lhs, rhs))
        sizes += [int(lhs[d.lhs]) for d in self.kind_dims(CONTRACTING)]
        sizes += [int((lhs, rhs)[w][d]) for w, d in self._extra]
        return tuple(sizes)

    def flops(self, lhs: Sequence[int], rhs: Sequence[int]) -> float:
        return float(math.prod(self.iter_sizes(lhs, rhs)))


# DotDims per pure key (the four dimension-number lists and the two operand ranks): the
# result depends on nothing else and is immutable (its cached properties are pure too), so
# the repeated layers of a model share one value instead of re-deriving it per dot.
_DOT_DIMS = BoundedMemo(4096)


def parse_dot(inst: Instruction) -> DotDims:
    """ParseDotGeneralFromDot: output = batch dims, then lhs then rhs free dims."""
    dn = inst.attrs.dot_dimension_numbers
    lb, rb = tuple(dn.lhs_batch_dimensions), tuple(dn.rhs_batch_dimensions)
    lc, rc = tuple(dn.lhs_contracting_dimensions), tuple(dn.rhs_contracting_dimensions)
    lrank, rrank = inst.operands[0].shape.rank, inst.operands[1].shape.rank
    key = (lb, rb, lc, rc, lrank, rrank)
    d = _DOT_DIMS.get(key)
    if d is None:
        d = _DOT_DIMS.put(key, _parse_dot(lb, rb, lc, rc, lrank, rrank))
    return d


def _parse_dot(lb: tuple[int, ...], rb: tuple[int, ...], lc: tuple[int, ...],
               rc: tuple[int, ...], lrank: int, rrank: int) -> DotDims:
    batch = tuple(DimNums(l, r, i) for i, (l, r) in enumerate(zip(lb, rb)))
    contracting = tuple(DimNums(l, r, -1) for l, r in zip(lc, rc))
    lhs_free = [d for d in range(lrank) if d not in lb and d not in lc]
    rhs_free = [d for d in range(rrank) if d not in rb and d not in rc]
    lnc = tuple(DimNums(d, -1, len(lb) + k) for k, d in enumerate(lhs_free))
    rnc = tuple(DimNums(-1, d, len(lb) + len(lhs_free) + k) for k, d in enumerate(rhs_free))
    return DotDims(batch, contracting, lnc, rnc, (), lrank, rrank,
                   len(lb) + len(lhs_free) + len(rhs_free))


def _spatial_is_batch(lhs_size: int, wd: WindowDim) -> bool:
    if (lhs_size == wd.size and lhs_size == wd.base_dilation
            and ((max(1, lhs_size - 1) == wd.stride and wd.window_dilation == 1)
                 or (max(1, lhs_size - 1) == wd.window_dilation and wd.stride == 1))
            and wd.padding_high == 0 and wd.padding_low == 0 and not wd.window_reversal):
        return True
    return (lhs_size == wd.size and wd.padding_high == lhs_size - 1
            and wd.padding_low == lhs_size - 1 and wd.window_reversal
            and wd.window_dilation == 1 and wd.stride == lhs_size
            and wd.base_dilation == lhs_size - 1)


def batch_window(w: WindowDim, size: int) -> WindowDim:
    """The batch-like window ``w`` (one of ``_spatial_is_batch``'s forms) for an input dim
    of ``size`` (a shard of the dim): input row i still meets kernel row i only."""
    if w.window_reversal:
        return WindowDim(size, size, size - 1, size - 1, 1, max(1, size - 1), True)
    if w.window_dilation > 1:
        return WindowDim(size, 1, 0, 0, max(1, size - 1), size, False)
    return WindowDim(size, max(1, size - 1), 0, 0, 1, size, False)


def rhs_nc_window(size: int) -> WindowDim:
    """The rhs-non-contracting window (``parse_conv``: a size-1 input padded by
    ``size - 1`` on both sides, read by a reversed kernel of ``size`` rows, so output row
    o is kernel row o) for a kernel dim of ``size`` (a shard of the dim)."""
    return WindowDim(size, 1, size - 1, size - 1, 1, 1, True)


def parse_conv(inst: Instruction) -> DotDims:
    """ParseConvolutionDimsInfo: classify conv dims as dot dims where the window allows."""
    cd = inst.attrs.convolution_dimension_numbers
    lhs, rhs = inst.operands[0].shape, inst.operands[1].shape
    batch: list[DimNums] = []
    contracting = [DimNums(cd.input_feature_dimension, cd.kernel_input_feature_dimension, -1)]
    lnc = [DimNums(cd.input_batch_dimension, -1, cd.output_batch_dimension)]
    rnc = [DimNums(-1, cd.kernel_output_feature_dimension, cd.output_feature_dimension)]
    spatial: list[DimNums] = []
    wdims = window_dims(inst)
    for i, (l, r, o) in enumerate(zip(cd.input_spatial_dimensions, cd.kernel_spatial_dimensions,
                                      cd.output_spatial_dimensions)):
        ls, rs = lhs.dims[l], rhs.dims[r]
        wd = wdims[i] if i < len(wdims) else WindowDim()
        dn = DimNums(l, r, o, i)
        if _spatial_is_batch(ls, wd):
            batch.append(dn)
        elif (ls == wd.size and wd.base_dilation == 1 and wd.window_dilation == 1
              and wd.padding_high == 0 and wd.padding_low == 0 and not wd.window_reversal):
            contracting.append(dn)
        elif wd.stride == 1 and wd.window_dilation == 1 and wd.base_dilation == 1:
            if (rs == 1 and wd.size == 1 and wd.padding_high == 0 and wd.padding_low == 0
                    and not wd.window_reversal):
                lnc.append(dn)
            elif (ls == 1 and wd.size == rs and wd.padding_high == rs - 1
                  and wd.padding_low == rs - 1 and wd.window_reversal):
                rnc.append(dn)
            else:
                spatial.append(dn)
        else:
            spatial.append(dn)
    labels = ConvLabels(cd.input_batch_dimension, cd.input_feature_dimension,
                        cd.kernel_input_feature_dimension, cd.kernel_output_feature_dimension,
                        cd.output_batch_dimension, cd.output_feature_dimension,
                        tuple(cd.input_spatial_dimensions), tuple(cd.kernel_spatial_dimensions),
                        tuple(cd.output_spatial_dimensions),
                        inst.attrs.feature_group_count or 1, inst.attrs.batch_group_count or 1)
    return DotDims(tuple(batch), tuple(contracting), tuple(lnc), tuple(rnc), tuple(spatial),
                   lhs.rank, rhs.rank, inst.shape.rank, tuple(wdims), labels)


def conv_kernel_is_small(inst: Instruction) -> bool:
    """IsConvolutionKernelSmall: the kernel is smaller than the output spatially."""
    cd = inst.attrs.convolution_dimension_numbers
    rhs = inst.operands[1].shape
    kprod = oprod = 1
    for i, (k, o) in enumerate(zip(cd.kernel_spatial_dimensions, cd.output_spatial_dimensions)):
        kd, od = rhs.dims[k], inst.shape.dims[o]
        kprod *= kd
        oprod *= od
        if kd >= od and (i < 2 or kd > 3 or kprod >= oprod):
            return False
    return True


def window_has(inst: Instruction, what: str) -> bool:
    """Any window dim with base (``base``) or base/window (``any``) dilation > 1."""
    for d in window_dims(inst):
        if d.base_dilation > 1 or (what == "any" and d.window_dilation > 1):
            return True
    return False
