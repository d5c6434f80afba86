"""The map a reader needs, generated from the registries: for every opcode and every
custom-call target, its completion rules (forward: from operands; backward: from a user;
``propagation.coverage``) and its partition handler (module and function;
``partition.registry``). ``hlo-spmd rules [OPCODE]`` prints it; XLA's counterpart is
reading ``sharding_propagation.cc`` and the ``Handle*`` methods of
``SpmdPartitioningVisitor`` side by side."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from hlo_spmd.ir.opcodes import ALL_OPCODES
from hlo_spmd.passes.partition.handlers import handler_tables
from hlo_spmd.passes.partition.registry import NO_HANDLER, Handler
from hlo_spmd.passes.propagation.coverage import (CUSTOM_CALL_TARGETS, backward_rule,
                                                  custom_call_rule, forward_rule)


@dataclass(frozen=True)
class RuleRow:
    """One opcode (``kind`` "opcode") or custom-call target (``kind`` "custom-call")."""
    kind: str
    name: str
    forward: str
    backward: str
    handler_module: str
    handler_function: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _where(fn: Handler) -> tuple[str, str]:
    return fn.__module__, fn.__qualname__


def rules_table(name: str | None = None) -> list[RuleRow]:
    """Every opcode's and custom-call target's rules, opcodes first (each sorted); with
    ``name``, only the rows of that opcode or target (empty when it is neither)."""
    by_opcode, by_target = handler_tables()
    # The fallbacks the driver and the custom-call handler use for what has no entry.
    from hlo_spmd.passes.partition.handlers.basic import handle_replicated

    rows = []
    for op in sorted(ALL_OPCODES | set(by_opcode)):
        if name is not None and op != name:
            continue
        module, function = _where(by_opcode.get(op, handle_replicated))
        if op in NO_HANDLER:
            function += f" (no handler: {NO_HANDLER[op]})"
        rows.append(RuleRow("opcode", op, forward_rule(op), backward_rule(op), module,
                            function))
    for target in sorted(CUSTOM_CALL_TARGETS | set(by_target)):
        if name is not None and target != name:
            continue
        fn = by_target.get(target)
        module, function = _where(fn) if fn is not None else _where(handle_replicated)
        rows.append(RuleRow("custom-call", target, *custom_call_rule(target), module,
                            function if fn is not None else function + " (unknown target)"))
    return rows
