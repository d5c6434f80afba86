"""The partition report: every collective of the output program, what it costs and why
it is there (``hlo-spmd partition --report``, ``hlo_spmd.partition(...).report``).

Costs are :func:`hlo_spmd.stats.module_stats`'s records (one cost model, the figures
``stats`` prints); causes come from the partitioner's :class:`~hlo_spmd.passes.partition.
causes.CauseLog`. XLA has no counterpart: its partitioner only logs "involuntary full
rematerialization" lines without the op or shardings (openxla/xla#15207).
"""
from __future__ import annotations

from typing import Any

from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.module import Module

REPORT_VERSION = 1


def _const_int(inst: Instruction) -> int | None:
    if inst.opcode != "constant" or inst.shape.rank != 0:
        return None
    try:
        from hlo_spmd.ir.literal import literal_to_numpy

        return int(literal_to_numpy(inst.attrs.literal))
    except Exception:  # noqa: BLE001 - an unreadable literal just means "unknown"
        return None


def trip_count(loop: Instruction) -> int | None:
    """The while loop's trip count when it is known: XLA's ``known_trip_count`` backend
    config, or the counted-loop form ``i = k; while (i < n) i = i + 1`` (what JAX's
    fori_loop and scan lower to)."""
    cfg = loop.attrs.backend_config
    if isinstance(cfg, bytes):
        cfg = cfg.decode("utf-8", "replace")
    if cfg:
        import json  # (a partition run without loops never needs it)

        try:
            n = json.loads(cfg).get("known_trip_count", {}).get("n")
            if n is not None:
                return int(n)
        except (ValueError, AttributeError, TypeError):
            pass
    if len(loop.called_computations) != 2:
        return None
    body, cond = loop.called_computations  # XLA's order: body, condition
    init = loop.operands[0] if loop.operands else None
    root = cond.root if cond is not None else None
    if root is None or root.opcode != "compare" or init is None or init.opcode != "tuple":
        return None
    if root.attrs.comparison_direction != "LT":
        return None
    lhs, rhs = root.operands
    if lhs.opcode != "get-tuple-element" or lhs.operands[0].opcode != "parameter":
        return None
    k = lhs.tuple_index
    limit = _const_int(rhs)
    start = _const_int(init.operands[k]) if k < len(init.operands) else None
    broot = body.root if body is not None else None
    if limit is None or start is None or broot is None or broot.opcode != "tuple":
        return None
    step = broot.operands[k] if k < len(broot.operands) else None
    if step is None or step.opcode != "add":
        return None
    a, c = step.operands
    if not (a.opcode == "get-tuple-element" and a.tuple_index == k
            and a.operands[0].opcode == "parameter" and _const_int(c) == 1):
        return None
    return max(0, limit - start)


def loop_trips(module: Module) -> dict[int, int | bool]:
    """Per computation id inside a loop: the product of the enclosing trip counts, or
    True when one of them is unknown. Computations outside loops are absent."""
    out: dict[int, int | bool] = {}
    stack: list[tuple[Computation, int | bool | None]] = [(module.entry, None)]
    seen: set[tuple[int, Any]] = set()
    while stack:
        comp, trips = stack.pop()
        if comp is None or (id(comp), trips) in seen:
            continue
        seen.add((id(comp), trips))
        if trips is not None:
            prev = out.get(id(comp))
            out[id(comp)] = trips if prev is None or prev == trips else True
        for inst in comp.instructions:
            inner = trips
            if inst.opcode == "while":
                n = trip_count(inst)
                if trips is True or n is None:
                    inner = True
                else:
                    inner = n if trips is None else trips * n
            for callee in inst.called_computations:
                stack.append((callee, inner))
    return out


def _find(module: Module, records: list) -> dict[tuple[str, str], Instruction]:
    """(computation name, instruction name) -> instruction, for the named ``records``
    (a few hundred collectives, not every instruction of the module)."""
    wanted: dict[str, set[str]] = {}
    for rec in records:
        wanted.setdefault(rec.computation, set()).add(rec.name)
    out: dict[tuple[str, str], Instruction] = {}
    for c in module.computations:
        names = wanted.get(c.name)
        if names:
            for i in c.instructions:
                if i.name in names:
                    out[(c.name, i.name)] = i
    return out


def build_report(out: Module, causes: Any = None, num_devices: int | None = None,
                 source: Module | None = None, fallbacks: list | None = None,
                 unknown_custom_calls: list | None = None) -> dict:
    """The report dict of partitioned module ``out`` (see the module docstring)."""
    from hlo_spmd.passes.partition.causes import CAUSES
    from hlo_spmd.stats import module_stats

    stats = module_stats(out, num_devices, memory=False)  # the report lists collectives
    insts = _find(out, stats.records)
    trips = loop_trips(out)
    entries = []
    summary = {c: {"count": 0, "bytes_per_device": 0.0} for c in CAUSES}
    for rec in stats.records:
        inst = insts.get((rec.computation, rec.name))
        scope = causes.lookup(inst) if causes is not None and inst is not None else None
        cause = (scope.cause or "reshard") if scope is not None else "user"
        serves = scope.serves.name if scope is not None and scope.serves is not None else None
        if scope is None and source is not None and source.find(rec.name) is not None:
            serves = rec.name  # a collective the input already had, copied as written
        entry: dict[str, Any] = {
            "kind": rec.kind, "instruction": rec.name, "computation": rec.computation,
            "bytes_per_device": rec.bytes_per_device, "group_size": rec.group_size,
            "in_loop": trips.get(id(inst.parent)) if inst is not None and inst.parent is not None
            and id(inst.parent) in trips else None,
            "for": serves, "cause": cause}
        if scope is not None and scope.src is not None and cause in ("reshard", "fallback"):
            entry["from"] = str(scope.src)
            entry["to"] = str(scope.dst)
        entries.append(entry)
        summary[cause]["count"] += 1
        summary[cause]["bytes_per_device"] += rec.bytes_per_device
    remats = []
    seen = set()
    for r in (causes.remats if causes is not None else []):
        key = (r.serves, r.src, r.dst)
        if key not in seen:
            seen.add(key)
            remats.append({"for": r.serves, "opcode": r.opcode, "from": r.src, "to": r.dst,
                           "cause": r.cause, "message": r.message()})
    return {
        "version": REPORT_VERSION,
        "module": out.name,
        "num_partitions": stats.num_devices,
        "collectives": entries,
        "summary": {
            "total_count": len(entries),
            "total_bytes_per_device": sum(e["bytes_per_device"] for e in entries),
            "by_cause": {c: v for c, v in summary.items() if v["count"]},
        },
        "full_rematerializations": remats,
        "replicated_fallbacks": [{"instruction": n, "opcode": o} for n, o in (fallbacks or [])],
        "unknown_custom_calls": [{"instruction": n, "target": t}
                                 for n, t in (unknown_custom_calls or [])],
    }


def top_causes_line(report: dict, top: int = 3) -> str:
    """``23 collectives, 30.5 KiB/device: contraction 20.1 KiB (12), ...``"""
    from hlo_spmd.stats import format_bytes

    s = report["summary"]
    if not s["total_count"]:
        return "no collectives"
    ranked = sorted(s["by_cause"].items(), key=lambda kv: (-kv[1]["bytes_per_device"], kv[0]))
    parts = [f"{c} {format_bytes(v['bytes_per_device'])} ({v['count']})" for c, v in ranked[:top]]
    more = f", +{len(ranked) - top} more" if len(ranked) > top else ""
    return (f"{s['total_count']} collectives, {format_bytes(s['total_bytes_per_device'])}"
            f"/device: " + ", ".join(parts) + more)


__all__ = ["build_report", "top_causes_line", "trip_count", "loop_trips", "REPORT_VERSION"]
