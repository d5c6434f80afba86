"""Dimension bookkeeping for dot, convolution, gather and scatter (XLA's
dot_as_convolution_util and the GatherScatterDims helpers of hlo_sharding_util)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from hlo_spmd.ir.instruction import Instruction


@dataclass(frozen=True)
class DimNums:
    """One logical dot dimension: its index in lhs, rhs and output (-1 if absent)."""

    lhs: int
    rhs: int
    output: int
    spatial: int = -1


@dataclass(frozen=True)
class DotDims:
    """DotConvolutionDimsInfo: a dot (or a conv read as a dot) split into dim classes."""

    batch: tuple[DimNums, ...]
    contracting: tuple[DimNums, ...]
    lhs_non_contracting: tuple[DimNums, ...]
    rhs_non_contracting: tuple[DimNums, ...]
    conv_spatial: tuple[DimNums, ...]
    lhs_rank: int
    rhs_rank: int
    output_rank: int


def parse_dot(inst: Instruction) -> DotDims:
    """ParseDotGeneralFromDot: output = batch dims, then lhs then rhs free dims."""
    dn = inst.attrs.dot_dimension_numbers
    lb, rb = list(dn.lhs_batch_dimensions), list(dn.rhs_batch_dimensions)
    lc, rc = list(dn.lhs_contracting_dimensions), list(dn.rhs_contracting_dimensions)
    lrank, rrank = inst.operands[0].shape.rank, inst.operands[1].shape.rank
    batch = tuple(DimNums(l, r, i) for i, (l, r) in enumerate(zip(lb, rb)))
    contracting = tuple(DimNums(l, r, -1) for l, r in zip(lc, rc))
    lhs_free = [d for d in range(lrank) if d not in lb and d not in lc]
    rhs_free = [d for d in range(rrank) if d not in rb and d not in rc]
    lnc = tuple(DimNums(d, -1, len(lb) + k) for k, d in enumerate(lhs_free))
    rnc = tuple(DimNums(-1, d, len(lb) + len(lhs_free) + k) for k, d in enumerate(rhs_free))
    return DotDims(batch, contracting, lnc, rnc, (), lrank, rrank, inst.shape.rank)


def _spatial_is_batch(lhs_size: int, wd: "WindowDim") -> bool:
    if (lhs_size == wd.size and lhs_size == wd.base_dilation
            and ((max(1, lhs_size - 1) == wd.stride and wd.window_dilation == 1)
                 or (max(1, lhs_size - 1) == wd.window_dilation and wd.stride == 1))
            and wd.padding_high == 0 and wd.padding_low == 0 and not wd.window_reversal):
        return True
    return (lhs_size == wd.size and wd.padding_high == lhs_size - 1
            and wd.padding_low == lhs_size - 1 and wd.window_reversal
            and wd.window_dilation == 1 and wd.stride == lhs_size
            and wd.base_dilation == lhs_size - 1)


@dataclass(frozen=True)
class WindowDim:
    """One window dimension with XLA's defaults for fields a proto leaves at 0."""

    size: int = 1
    stride: int = 1
    padding_low: int = 0
    padding_high: int = 0
    window_dilation: int = 1
    base_dilation: int = 1
    window_reversal: bool = False


def window_dims(inst: Instruction) -> list[WindowDim]:
    return [WindowDim(d.size or 1, d.stride or 1, d.padding_low, d.padding_high,
                      d.window_dilation or 1, d.base_dilation or 1, bool(d.window_reversal))
            for d in inst.attrs.window.dimensions]


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
    return DotDims(tuple(batch), tuple(contracting), tuple(lnc), tuple(rnc), tuple(spatial),
                   lhs.rank, rhs.rank, inst.shape.rank)


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


# -- gather / scatter ----------------------------------------------------------------------


@dataclass
class GSDims:
    """GatherScatterDims: aligned operand / indices / output (or update) dims."""

    operand: list[int] = field(default_factory=list)
    indices: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)

    def fill_output(self, index_vector_dim: int, offset_dims: Sequence[int]) -> None:
        """FillOutputDimsWithIndicesDims."""
        if not self.indices:
            return
        mapping: dict[int, int] = {}
        ind, out = 0, 0
        while ind <= max(self.indices):
            if ind == index_vector_dim:
                ind += 1
            while out in offset_dims:
                out += 1
            mapping[ind] = out
            ind += 1
            out += 1
        self.output = [mapping[i] for i in self.indices]

    def extend(self, other: "GSDims") -> None:
        self.operand += other.operand
        self.indices += other.indices
        self.output += other.output


def connected_index_dims(indices_rank: int, index_vector_dim: int, output_rank: int,
                         offset_dims: Sequence[int], excluded: Sequence[int] = ()) -> GSDims:
    """GetGatherConnectedDimsAcrossIndicesAndOutput."""
    res = GSDims()
    ind = 0
    for out in range(output_rank):
        if out in offset_dims:
            continue
        if ind == index_vector_dim:
            ind += 1
        if ind not in excluded:
            res.indices.append(ind)
            res.output.append(out)
        ind += 1
    return res


def operand_passthrough_dims(operand_dims: Sequence[int], collapsed: Sequence[int],
                             batching: Sequence[int], offset_dims: Sequence[int],
                             slice_sizes: Sequence[int]) -> GSDims:
    """GetGatherScatterOperandPassthroughDims: operand dims sliced whole into the output."""
    res = GSDims()
    skipped = 0
    for i, size in enumerate(operand_dims):
        if i in collapsed or i in batching:
            skipped += 1
            continue
        if slice_sizes[i] != size:
            continue
        res.operand.append(i)
        res.output.append(offset_dims[i - skipped])
    return res


def scatter_slice_sizes(operand_dims: Sequence[int], update_dims: Sequence[int],
                        inserted: Sequence[int], batching: Sequence[int],
                        window_dims: Sequence[int]) -> list[int]:
    """GetScatterSliceSize."""
    sizes = [1] * len(operand_dims)
    k = 0
    for i in range(len(operand_dims)):
        if i in inserted or i in batching:
            continue
        sizes[i] = update_dims[window_dims[k]]
        k += 1
    return sizes
