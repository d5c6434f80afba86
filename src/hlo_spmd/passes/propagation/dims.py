"""Dims models for completion's rules, re-exported from the models shared with the
partitioner: dot / convolution (hlo_spmd.passes.dot_conv_dims) and gather / scatter
(hlo_spmd.passes.gather_scatter_dims, XLA's hlo_sharding_util::GatherScatterDims)."""
from __future__ import annotations

from hlo_spmd.passes.dot_conv_dims import (  # noqa: F401  (re-exported)
    DimNums, DotDims, WindowDim, conv_kernel_is_small, parse_conv, parse_dot, window_dims,
    window_has)
from hlo_spmd.passes.gather_scatter_dims import (  # noqa: F401  (re-exported)
    GSDims, connected_index_dims, operand_passthrough_dims, scatter_slice_sizes)
