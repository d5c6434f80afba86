"""Handler table: opcode -> function(ctx, instruction) -> PValue, and custom-call target ->
function for the ``custom-call`` handler. A handler returns None only when it has settled
every user of the instruction itself (``ModuleState.settled``), so no value is needed.

The table is strict: registering a second handler for an opcode (or custom-call target)
is an error, so two modules cannot silently override each other depending on import
order. Handler modules register themselves with ``@handles(...)``; the one list of
handler families is ``hlo_spmd.passes.partition.handlers.FAMILIES`` (imported by the
driver). XLA's counterpart is the per-opcode ``Handle*`` dispatch of
``SpmdPartitioningVisitor``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from hlo_spmd.ir.instruction import Instruction
    from hlo_spmd.passes.partition.context import PartitionContext
    from hlo_spmd.passes.partition.pvalue import PValue

Handler = Callable[["PartitionContext", "Instruction"], "PValue | None"]
HANDLERS: dict[str, Handler] = {}
CUSTOM_CALL_HANDLERS: dict[str, Handler] = {}
# opcode -> why it has no handler of its own (the driver runs the replicated fallback,
# handlers/basic.handle_replicated, on it): every opcode XLA defines is in exactly one of
# HANDLERS and NO_HANDLER once the families are imported.
NO_HANDLER: dict[str, str] = {}


class DuplicateHandlerError(RuntimeError):
    """A second handler registered for the same opcode or custom-call target (a bug)."""


def _name(fn: Handler) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"


def _register(table: dict[str, Handler], kind: str, keys: tuple[str, ...],
              fn: Handler) -> None:
    for key in keys:
        old = table.get(key)
        if old is not None and old is not fn:
            raise DuplicateHandlerError(f"{kind} {key!r} already has handler {_name(old)}; "
                                        f"refusing to register {_name(fn)}")
        if table is HANDLERS and key in NO_HANDLER:
            raise DuplicateHandlerError(f"{kind} {key!r} is declared without a handler "
                                        f"({NO_HANDLER[key]}); refusing to register {_name(fn)}")
    for key in keys:
        table[key] = fn


def handles(*opcodes: str) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of ``opcodes`` (once each)."""
    def register(fn: Handler) -> Handler:
        _register(HANDLERS, "opcode", opcodes, fn)
        return fn
    return register


def handles_custom_call(*targets: str) -> Callable[[Handler], Handler]:
    """Register the decorated function for custom-calls with these targets (once each)."""
    def register(fn: Handler) -> Handler:
        _register(CUSTOM_CALL_HANDLERS, "custom-call target", targets, fn)
        return fn
    return register


def without_handler(reason: str, *opcodes: str) -> None:
    """Declare that ``opcodes`` have no handler of their own, and why (``hlo-spmd rules``
    prints it; the driver runs the replicated fallback on them)."""
    for op in opcodes:
        if op in HANDLERS:
            raise DuplicateHandlerError(f"opcode {op!r} already has handler "
                                        f"{_name(HANDLERS[op])}; it cannot be declared "
                                        f"without one")
        if op in NO_HANDLER and NO_HANDLER[op] != reason:
            raise DuplicateHandlerError(f"opcode {op!r} is already declared without a "
                                        f"handler ({NO_HANDLER[op]})")
    for op in opcodes:
        NO_HANDLER[op] = reason
