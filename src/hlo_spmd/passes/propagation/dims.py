"""Dimension bookkeeping for gather and scatter (the GatherScatterDims helpers of XLA's
hlo_sharding_util). The dot / convolution dims model is shared with the partitioner and
lives in hlo_spmd.passes.dot_conv_dims; it is re-exported here for completion's rules."""
from __future__ import annotations

from typing import Sequence

from hlo_spmd.passes.dot_conv_dims import (  # noqa: F401  (re-exported)
    DimNums, DotDims, WindowDim, conv_kernel_is_small, parse_conv, parse_dot, window_dims,
    window_has)
from hlo_spmd.records import Record


# -- gather / scatter ----------------------------------------------------------------------


class GSDims(Record):
    """GatherScatterDims: aligned operand / indices / output (or update) dims."""
    # A records.Record: equality and repr as the dataclass it was, ~1 ms less start-up.
    __match_args__ = ("operand", "indices", "output")
    __slots__ = __match_args__

    def __init__(self, operand: list[int] | None = None, indices: list[int] | None = None,
                 output: list[int] | None = None) -> None:
        self.operand = [] if operand is None else operand
        self.indices = [] if indices is None else indices
        self.output = [] if output is None else output

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
