"""Per-instruction sharding differences between two modules (matched by name)."""
from __future__ import annotations

from dataclasses import dataclass

from hlo_spmd.ir.module import Module
from hlo_spmd.sharding import HloSharding


@dataclass(frozen=True)
class ShardingDiff:
    name: str
    computation: str
    opcode: str
    before: HloSharding | None
    after: HloSharding | None
    status: str  # "changed" | "added" (sharded only in b) | "removed" | "only-a" | "only-b"


def _index(module: Module) -> dict[str, tuple[str, str, HloSharding | None]]:
    return {i.name: (c.name, i.opcode, i.sharding) for c in module.computations for i in c}


def sharding_diff(a: Module, b: Module, *, include_missing: bool = True) -> list[ShardingDiff]:
    """Instructions whose sharding differs between ``a`` and ``b``, in ``a``'s order.

    Equality is by value (device placement), not by text: ``{devices=[2]0,1}`` and
    ``{devices=[2]<=[2]}`` are the same sharding.
    """
    ia, ib = _index(a), _index(b)
    out: list[ShardingDiff] = []
    for name, (comp, opcode, sa) in ia.items():
        if name not in ib:
            if include_missing:
                out.append(ShardingDiff(name, comp, opcode, sa, None, "only-a"))
            continue
        sb = ib[name][2]
        if sa == sb:
            continue
        status = "added" if sa is None else "removed" if sb is None else "changed"
        out.append(ShardingDiff(name, comp, opcode, sa, sb, status))
    if include_missing:
        for name, (comp, opcode, sb) in ib.items():
            if name not in ia:
                out.append(ShardingDiff(name, comp, opcode, None, sb, "only-b"))
    return out
