"""Open dims of a Shardy manual computation's entry and exit (``xla.sdy.GlobalToLocalShape``
/ ``xla.sdy.LocalToGlobalShape``).

Shardy's ManualComputationOp keeps its in_shardings open (``{?}``) dims open for
propagation: they gain the free (non-manual) axes that tile the operand there, and the
body's value is then tiled by them too.  The classic export reaches the same result
through its ``Sharding`` + ``SPMDFullToShardShape`` pair (unspecified.py); the Shardy
export has one instruction, whose sharding is the local (manual) side at the entry and
the global side at the exit; the exit's out_shardings open dims gain the free axes
that tile its manual operand there.

Reads: the entry's / exit's operands' shardings and its own sharding (and its in_shardings /
manual_axes attributes, which never change).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_spmd.annotations.manual import (sdy_entry_refined_sharding, sdy_exit_local_shardings,
                                         sdy_exit_refined_sharding)
from hlo_spmd.ir.instruction import Instruction

if TYPE_CHECKING:
    from hlo_spmd.passes.propagation.interface import PropagatorInterface

SDY_GLOBAL_TO_LOCAL = "xla.sdy.GlobalToLocalShape"
SDY_LOCAL_TO_GLOBAL = "xla.sdy.LocalToGlobalShape"


def is_sdy_entry(inst: Instruction) -> bool:
    return inst.opcode == "custom-call" and inst.custom_call_target == SDY_GLOBAL_TO_LOCAL


def is_sdy_boundary(inst: Instruction) -> bool:
    """A Shardy manual computation's entry or exit."""
    return inst.opcode == "custom-call" and inst.custom_call_target in (SDY_GLOBAL_TO_LOCAL,
                                                                        SDY_LOCAL_TO_GLOBAL)


def refine_entry_from_operands(p: "PropagatorInterface", inst: Instruction) -> bool:
    """The boundary's sharding with its open dims refined from its operands."""
    new = sdy_entry_refined_sharding(inst) if is_sdy_entry(inst) else \
        sdy_exit_refined_sharding(inst)
    if new is None or new == inst.sharding:
        return False
    p.set(inst, new, "sdy-manual.refine_open_dims(operand)", tuple(inst.operands),
          direction="refine")
    return True


def pin_exit_operands(p: "PropagatorInterface", inst: Instruction) -> None:
    """An exit's unsharded operands get the out_shardings' local (manual) view, as
    Shardy's export to XLA puts a ``Sharding`` custom-call with it before
    ``SPMDShardToFullShape``: a manual computation with no operands (JAX's axis_index
    inside a partially manual shard_map) is otherwise reached by no manual sharding.
    Values with open dims are left to propagation, which refines them (and the exit)."""
    from hlo_spmd.annotations import sdy
    from hlo_spmd.annotations.normalize import ATTR_OUT_SHARDINGS

    if inst.custom_call_target != SDY_LOCAL_TO_GLOBAL:
        return
    local = sdy_exit_local_shardings(inst)
    text = inst.attrs.frontend_attributes.map.get(ATTR_OUT_SHARDINGS)
    if local is None or text is None:
        return
    values = sdy.parse_sharding_per_value(text, f"instruction {inst.name}")
    for op, s, v in zip(inst.operands, local, values):
        if op.sharding is None and not v.open_dims:
            p.set(op, s, "sdy-manual.exit_operand", (inst,), direction="preprocess")
