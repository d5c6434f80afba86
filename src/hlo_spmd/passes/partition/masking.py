"""Masking the padding of unevenly sharded values.

A partitioned value's local buffer is ``ceil(dim / tiles)`` long on every tiled dim; on
the devices whose tile runs past the real end (and on devices whose tile is all padding)
the tail holds garbage. Ops that combine elements (reduce, dot contractions, windowed
ops) must first replace it with a neutral value: ``mask_padding(ctx, pv, dims, value)``.

The mask is built per dim from a 1-D iota compared with this device's number of real
elements on that dim (a per-device table read through ``partition-id``, so it works in any
device group), broadcast and and-ed across dims; then one select.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from hlo_spmd.ir.builder import element_type_of
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.opcodes import REDUCTION_KINDS
from hlo_spmd.ir.primitive_types import (COMPLEX, FLOATING, SIGNED_INTEGRAL, UNSIGNED_INTEGRAL,
                                         PrimitiveType, numpy_dtype)
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.sharding import device_offsets

if TYPE_CHECKING:
    from hlo_spmd.passes.partition.context import PartitionContext

__all__ = ["padded_dims", "valid_lengths", "valid_mask", "mask_padding", "pad_value_identity"]


def padded_dims(pv: PValue, dims: Sequence[int] | None = None) -> list[int]:
    """The dims (of ``dims``, default all) on which some device's tile holds padding."""
    s = pv.sharding
    shape = pv.base_shape
    if not shape.is_array or not s.is_tiled or s.is_tuple:
        return []
    tiles = s.tile_dims_for_data()
    candidates = range(shape.rank) if dims is None else dims
    return [int(k) for k in candidates if int(shape.dims[k]) % int(tiles[k])]


def valid_lengths(pv: PValue, dim: int, num_devices: int) -> np.ndarray:
    """``[num_devices]``: how many leading elements of the local buffer along ``dim`` are
    real on each logical device (0 for a tile that is all padding)."""
    dims = [int(d) for d in pv.base_shape.dims]
    local = int(pv.hlo.shape.dims[dim])
    off = device_offsets(pv.sharding, dims, num_devices=num_devices)[:, dim]
    return np.clip(dims[dim] - off, 0, local)


def valid_mask(ctx: "PartitionContext", pv: PValue,
               dims: Sequence[int] | None = None) -> Instruction:
    """``pred[local shape]``: true on real elements, false on the padding of ``dims``
    (default: every dim). All true (a broadcast constant) when nothing is padded."""
    b = ctx.b
    local = [int(d) for d in pv.hlo.shape.dims]
    mask: Instruction | None = None
    for k in padded_dims(pv, dims):
        limit = ctx.logical_table(valid_lengths(pv, k, ctx.num_devices))
        iota = b.iota(PrimitiveType.S32, [local[k]], 0)
        lim = b.broadcast(limit, [local[k]], [])
        m = b.compare(iota, lim, "LT")
        if len(local) > 1:
            m = b.broadcast(m, local, [k])
        mask = m if mask is None else b.binary("and", mask, m)
    if mask is None:
        true = b.constant(True, PrimitiveType.PRED)
        return b.broadcast(true, local, []) if local else true
    return mask


def mask_padding(ctx: "PartitionContext", pv: PValue, dims: Sequence[int] | None,
                 value: Any) -> Instruction:
    """``pv``'s local value with the padding of ``dims`` (None: all dims) replaced by
    ``value`` (a Python / numpy scalar, or a scalar instruction of the element type).
    Returns ``pv.hlo`` itself when those dims divide evenly."""
    if not padded_dims(pv, dims):
        return pv.hlo
    x = pv.hlo
    b = ctx.b
    mask = valid_mask(ctx, pv, dims)
    if isinstance(value, Instruction):
        fill = value
    else:
        et = x.shape.element_type
        fill = b.constant(np.asarray(value, dtype=numpy_dtype(et)), et)
    if fill.shape.rank == 0 and x.shape.rank:
        fill = b.broadcast(fill, list(x.shape.dims), [])
    return b.select(mask, x, fill)


_ALIASES = {"max": "maximum", "min": "minimum", "sum": "add", "mul": "multiply",
            "prod": "multiply", "product": "multiply"}


def _float_extreme(dtype: np.dtype, negative: bool) -> Any:
    """-inf / +inf, or the most negative / positive finite value for types without inf."""
    inf = np.asarray(-np.inf if negative else np.inf).astype(dtype)
    if np.isinf(inf.astype(np.float64)):
        return inf[()]
    try:
        info = np.finfo(dtype)
    except (TypeError, ValueError):
        import ml_dtypes

        info = ml_dtypes.finfo(dtype)
    return np.asarray(info.min if negative else info.max).astype(dtype)[()]


def _int_info(dtype: np.dtype):
    try:
        return np.iinfo(dtype)
    except (TypeError, ValueError):
        import ml_dtypes

        return ml_dtypes.iinfo(dtype)


def pad_value_identity(reducer_opcode: str, element_type: Any) -> Any:
    """The identity of the reduction ``reducer_opcode`` (add, multiply, maximum, minimum,
    and, or, xor; short names max/min/sum/mul accepted) for ``element_type``, as a numpy
    scalar of that type: the value padding must hold so it does not change the result."""
    op = _ALIASES.get(reducer_opcode, reducer_opcode)
    et = element_type_of(element_type)
    dtype = numpy_dtype(et)

    def val(v: Any) -> Any:
        return np.asarray(v).astype(dtype)[()]

    if et == PrimitiveType.PRED:
        table = {"add": False, "or": False, "xor": False, "maximum": False,
                 "multiply": True, "and": True, "minimum": True}
        if op in table:
            return val(table[op])
    elif et in FLOATING or et in COMPLEX:
        if op == "add":
            return val(0)
        if op == "multiply":
            return val(1)
        if et in FLOATING and REDUCTION_KINDS.get(op) in ("max", "min"):
            return _float_extreme(dtype, op == "maximum")
    elif et in SIGNED_INTEGRAL or et in UNSIGNED_INTEGRAL:
        info = _int_info(dtype)
        table = {"add": 0, "or": 0, "xor": 0, "multiply": 1, "maximum": info.min,
                 "minimum": info.max, "and": -1 if et in SIGNED_INTEGRAL else info.max}
        if op in table:
            return val(table[op])
    raise ValueError(f"no identity for reduction {reducer_opcode!r} on element type "
                     f"{PrimitiveType(et).name.lower()}")
