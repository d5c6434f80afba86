"""Communication cost of one collective instruction, read off a per-device (partitioned)
module: ours or XLA's own.

Bytes per device are what ONE device sends (= receives, the patterns are symmetric) for ONE
execution of the instruction, with the standard bandwidth-optimal algorithms; ``S`` is the
local array size in bytes (summed over the operands of a variadic collective), ``g`` the
number of devices in a replica group:

===================  =====================================  ==============================
kind                 bytes per device                       S measured on
===================  =====================================  ==============================
all-reduce           2 (g-1)/g * S   (ring: reduce-scatter  the operand (= the result)
                     then all-gather)
all-gather           (g-1)/g * S                            the result (g times the operand)
reduce-scatter       (g-1)/g * S                            the operand (g times the result)
all-to-all           (g-1)/g * S                            the operand (= the result)
collective-permute   S  (for a device that sends; 0 when    the operand
                     there are no pairs)
===================  =====================================  ==============================

``g = 1`` costs nothing. The async forms (``all-reduce-start``, ``all-gather-start``,
``collective-permute-start``, and ``async-start`` wrapping one of the kinds) count as their
kind; the matching ``-done`` is not counted again. Other collectives
(``collective-broadcast``, ``ragged-all-to-all``) are not among the five kinds and are not
counted.

Group sizes come from the replica groups in any encoding (explicit, iota, mesh axes --
XLA's own partitioner writes the last). Empty groups mean every participant: the
``num_devices`` passed in (the partition count for channel collectives).
"""
from __future__ import annotations

from typing import NamedTuple

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.opcodes import ASYNC_STARTS, COST_FORMULA, COST_KINDS, async_pair
from hlo_spmd.ir.shape import Shape

#: The collective kinds reported, in report order.
COLLECTIVE_KINDS = COST_KINDS

#: The start half of each kind's asynchronous form -> the kind.
_ASYNC_STARTS = {pair[0]: kind for kind in COLLECTIVE_KINDS
                 if (pair := async_pair(kind)) is not None}


def collective_kind(inst: Instruction) -> str | None:
    """One of ``COLLECTIVE_KINDS`` if ``inst`` starts such a collective, else None."""
    op = inst.opcode
    if op in COLLECTIVE_KINDS:
        return op
    if op in _ASYNC_STARTS:
        return _ASYNC_STARTS[op]
    if op == "async-start" and inst.called_computations:
        root = inst.called_computations[0].root
        if root is not None and root.opcode in COLLECTIVE_KINDS:
            return root.opcode
    return None


def _wrapped(inst: Instruction) -> Instruction:
    """The instruction carrying the collective's attributes (the wrapped op of async-start)."""
    if inst.opcode == "async-start" and inst.called_computations:
        root = inst.called_computations[0].root
        if root is not None:
            return root
    return inst


def array_bytes(shape: Shape) -> int:
    """Bytes of every array leaf of ``shape`` (tokens count 0)."""
    return shape.byte_size()


def group_size(inst: Instruction, num_devices: int | None) -> int:
    """Devices per replica group (largest group if they differ); ``num_devices`` (or 1 when
    unknown) for empty groups; the number of distinct devices for collective-permute."""
    from hlo_spmd.ir.shape_inference import replica_groups

    inst = _wrapped(inst)
    if collective_kind(inst) == "collective-permute":
        pairs = inst.attrs.source_target_pairs
        return len({p.source for p in pairs} | {p.target for p in pairs})
    fast = _counted_group_size(inst.attrs)
    if fast is not None:
        return fast
    try:
        groups = replica_groups(inst.attrs)
    except (ValueError, IndexError):
        groups = None
    if groups is None:
        return int(num_devices) if num_devices else 1
    if groups.dtype == object:
        return max((len(g) for g in groups), default=1)
    return int(groups.shape[1]) if groups.ndim == 2 else 1


def _counted_group_size(attrs) -> int | None:
    """The size ``replica_groups`` would give, read off the proto without building the
    [groups, size] array (the report asks for every collective of a module); None when
    the encoding needs the full expansion (mesh lists, or iota lists ``replica_groups``
    would reject or whose expansion is not a plain reshape)."""
    from hlo_spmd.ir.shape_inference import _iota_proto, iota_list_problem, replica_group_list_kind

    kind = replica_group_list_kind(attrs)
    if kind == "explicit":
        groups = attrs.collective_device_list.replica_groups or attrs.replica_groups
        # Equal sizes give a 2-D array (its width); unequal ones an object array (the
        # largest): both are the largest group.
        return max(len(g.replica_ids) for g in groups)
    if kind != "iota":
        return None
    p = _iota_proto(attrs)
    # Only lists the expansion accepts: anything else takes the full path (which falls
    # back to ``num_devices`` when it fails).
    return None if iota_list_problem(p) is not None else int(p.num_devices_per_group)


def _operand_and_result_bytes(inst: Instruction, kind: str) -> tuple[int, int]:
    op = _wrapped(inst)
    operand = sum(array_bytes(o.shape) for o in op.operands)
    result_shape = op.shape
    if inst.opcode in ASYNC_STARTS and result_shape.is_tuple:
        # (operand(s), result[, contexts...]): element 1 is the output.
        result_shape = result_shape.tuple_shapes[1]
    if kind == "collective-permute" and len(op.operands) > 1:
        operand = array_bytes(op.operands[0].shape)  # in-place form: (input, output, ...)
    return operand, array_bytes(result_shape)


def bytes_per_device(kind: str, operand_bytes: float, result_bytes: float, g: int) -> float:
    """The formula of the module docstring (the kind's ``cost-*`` trait)."""
    formula = COST_FORMULA.get(kind)
    if formula == "sent":
        return float(operand_bytes)
    if g <= 1:
        return 0.0
    frac = (g - 1) / g
    if formula == "ring":
        return 2.0 * frac * operand_bytes
    if formula == "gathered":
        return frac * result_bytes
    if formula in ("scattered", "exchanged"):
        return frac * operand_bytes
    raise ValueError(f"not a collective kind: {kind}")


class CollectiveCost(NamedTuple):
    """One collective instruction's cost (one execution). A NamedTuple, not a dataclass:
    a dataclass costs ~1 ms of start-up (Python 3.11 compiles its methods)."""

    name: str
    kind: str
    computation: str
    group_size: int
    operand_bytes: int
    result_bytes: int
    bytes_per_device: float
    in_loop: bool = False


def collective_cost(inst: Instruction, num_devices: int | None = None,
                    in_loop: bool = False) -> CollectiveCost | None:
    """The cost of ``inst``, or None when it is not one of ``COLLECTIVE_KINDS``."""
    kind = collective_kind(inst)
    if kind is None:
        return None
    g = group_size(inst, num_devices)
    operand, result = _operand_and_result_bytes(inst, kind)
    if kind == "collective-permute" and not _wrapped(inst).attrs.source_target_pairs:
        cost = 0.0
    else:
        cost = bytes_per_device(kind, operand, result, g)
    comp = inst.parent.name if inst.parent is not None else ""
    return CollectiveCost(inst.name, kind, comp, g, operand, result, cost, in_loop)
