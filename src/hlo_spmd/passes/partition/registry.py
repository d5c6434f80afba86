"""Handler table: opcode -> function(ctx, instruction) -> PValue.

Handler modules register themselves with ``@handles(...)``; the driver imports them all.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from hlo_spmd.ir.instruction import Instruction
    from hlo_spmd.passes.partition.context import PartitionContext
    from hlo_spmd.passes.partition.pvalue import PValue

Handler = Callable[["PartitionContext", "Instruction"], "PValue"]
HANDLERS: dict[str, Handler] = {}


def handles(*opcodes: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for op in opcodes:
            HANDLERS[op] = fn
        return fn
    return register
