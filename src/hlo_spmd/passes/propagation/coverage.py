"""Which rule handles each opcode, forward and backward (for reports and tests).

Mirrors the dispatch in ``engine.Propagator`` so that ``rule_coverage()`` answers "what
does propagation do with opcode X" without running it.
"""
from __future__ import annotations

from hlo_spmd.ir.opcodes import (ALL_OPCODES, COMPUTATION_SYNC, ELEMENTWISE, PASS_THROUGH,
                                 SHARDED_FROM_USERS, SPATIAL)
from hlo_spmd.passes.propagation.backward import BACKWARD_RULES
from hlo_spmd.passes.propagation.forward import FORWARD_RULES
from hlo_spmd.passes.propagation.sdy_manual import SDY_GLOBAL_TO_LOCAL, SDY_LOCAL_TO_GLOBAL
from hlo_spmd.passes.propagation.graph import (ALIASES, FULL_TO_SHARD, PASSTHROUGH_ALWAYS,
                                              PASSTHROUGH_SAME_RANK, SDY_BARRIER,
                                              SDY_SHARDING_GROUP, SHARD_TO_FULL, SHARDING, TOPK)

ELEMENTWISE_LIKE = ELEMENTWISE | {"rng"}


CONTROL_FLOW = {
    "call": "callee root <-> call result (computation sync); call operand -> parameter",
    "conditional": "branch roots <-> conditional result (computation sync)",
}
NO_OPERANDS = SHARDED_FROM_USERS


def forward_rule(opcode: str) -> str:
    """How an instruction with ``opcode`` gets a sharding from its operands."""
    op = ALIASES.get(opcode, opcode)
    if op in CONTROL_FLOW:
        return CONTROL_FLOW[op]
    if op in NO_OPERANDS:
        return "no operands: from users only"
    if op in FORWARD_RULES and op != "custom-call":
        rule = FORWARD_RULES[op].infer.__name__
        return rule + (" + computation sync" if op in COMPUTATION_SYNC else "")
    if op in ELEMENTWISE_LIKE:
        return "elementwise (default_rule)"
    if op in SPATIAL:
        return "representative operand (default_rule)"
    if op == "custom-call":
        return "Sharding: copy; passthrough targets: operand 0; others: none (unsupported)"
    return "unsupported: follows a replicated operand only (unsupported_rule)"


def backward_rule(opcode: str) -> str:
    """How an instruction's sharding propagates to an operand when it is the user."""
    op = ALIASES.get(opcode, opcode)
    gate = "always" if op in PASS_THROUGH or op in ELEMENTWISE_LIKE else (
        "level>=2" if op == "broadcast" else "level>=1")
    name = (BACKWARD_RULES[op].operand_of.__name__ if op in BACKWARD_RULES
            else "same_shape_rule")
    return f"{name} ({gate})"


def rule_coverage() -> dict[str, tuple[str, str]]:
    """opcode -> (forward rule, backward rule) for every opcode the IR knows."""
    return {op: (forward_rule(op), backward_rule(op)) for op in sorted(ALL_OPCODES)}


def custom_call_rule(target: str) -> tuple[str, str]:
    """(forward, backward) rule of a custom-call with ``target``, as ``forward_rule``."""
    backward = backward_rule("custom-call")
    if target == SHARDING:
        return forward_rule("copy") + " (a Sharding annotation is a copy)", backward_rule("copy")
    if target in (FULL_TO_SHARD, SHARD_TO_FULL):
        return "manual boundary: its sharding is the annotation's", backward
    if target in (SDY_GLOBAL_TO_LOCAL, SDY_LOCAL_TO_GLOBAL):
        return ("Shardy manual boundary: its sharding with open dims refined (sdy_manual)",
                backward)
    if target == SDY_BARRIER:
        return ("custom_call: operand 0, when xla.sdy.allowed_direction lets it forward",
                backward + ", when xla.sdy.allowed_direction lets it backward")
    if target in PASSTHROUGH_ALWAYS:
        return "custom_call: operand 0 (passthrough)", backward
    if target in PASSTHROUGH_SAME_RANK:
        return "custom_call: operand 0 (passthrough when the ranks match)", backward
    if target == TOPK:
        return forward_rule("topk") + " (a TopK custom-call is a topk)", backward_rule("topk")
    if target == SDY_SHARDING_GROUP:
        return "sharding group: its operands share one sharding (ProcessShardingInstruction)", backward
    return "none (unsupported)", backward


#: Custom-call targets propagation treats specially.
CUSTOM_CALL_TARGETS = frozenset({SHARDING, FULL_TO_SHARD, SHARD_TO_FULL, SDY_BARRIER,
                                 SDY_SHARDING_GROUP, SDY_GLOBAL_TO_LOCAL, SDY_LOCAL_TO_GLOBAL,
                                 TOPK}) | PASSTHROUGH_ALWAYS | PASSTHROUGH_SAME_RANK
