"""Statistics of a per-device (partitioned) module: collectives and memory.

Works on any module in our IR: the partitioner's output, or XLA's own partitioned module
(``runtime.xla_reference.xla_partitioned_module`` bytes loaded with ``ir.io``), so the two
can be put side by side (:func:`comparison_rows`).

* Collectives, per kind (``collectives.cost.COLLECTIVE_KINDS``): the static instruction
  count, how many of them are inside loops (in a while body or condition, or in anything
  those call, transitively), and the bytes each device sends for one execution of each
  (formulas in :mod:`hlo_spmd.collectives.cost`), summed; ``bytes_in_loops`` is the part
  of that sum from instructions in loops -- per iteration, trip counts are not known.
* Memory: the largest array value (any computation) and a liveness estimate of the peak
  bytes live over the entry computation's program order. A value is live from its
  definition to its last use (the root's values to the end); tuple, get-tuple-element,
  bitcast, opt-barrier and add-dependency create no buffer but keep their operands'
  buffers alive; a while's state is its operand's buffers (XLA's buffer assignment gives
  the loop state, the body's parameter and root the buffers of the while's operand), so it
  creates none either; entry parameters are live from the start; at a while / conditional /
  call, the callee's own peak (parameters excluded: they alias the operands) is added
  on top of what is live at that point. Fusion and scheduling effects are ignored: it is
  an estimate for comparing two partitionings of the same program, not a simulation of
  XLA's buffer assignment.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

from hlo_spmd.collectives.cost import COLLECTIVE_KINDS, CollectiveCost, collective_cost
from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.module import Module
from hlo_spmd.ir.opcodes import CONTROL_FLOW, NO_OWN_BUFFER
from hlo_spmd.records import Record

#: Ops that create no buffer of their own (their result is, or forwards, operand buffers).
ALIASING_OPS = NO_OWN_BUFFER
# Values that make no buffer of their own (they keep others' alive).
_NO_OWN_BUFFER = ALIASING_OPS | {"while"}


# Records (hlo_spmd.records): created on every partition run's import path, where a
# dataclass costs ~0.4-0.8 ms to create.
class CollectiveSummary(Record):
    """One collective kind over the whole module."""
    __match_args__ = ("kind", "count", "count_in_loops", "bytes_per_device",
                      "bytes_in_loops", "max_group_size")
    __slots__ = __match_args__

    def __init__(self, kind: str, count: int = 0, count_in_loops: int = 0,
                 bytes_per_device: float = 0.0, bytes_in_loops: float = 0.0,
                 max_group_size: int = 0) -> None:
        self.kind = kind
        self.count = count
        self.count_in_loops = count_in_loops
        self.bytes_per_device = bytes_per_device
        self.bytes_in_loops = bytes_in_loops
        self.max_group_size = max_group_size


class ArrayInfo(NamedTuple):
    name: str
    computation: str
    shape: str
    bytes: int


class ModuleStats(Record):
    __match_args__ = ("module", "num_devices", "collectives", "records", "largest_array",
                      "peak_live_bytes", "instruction_count")
    __slots__ = __match_args__

    def __init__(self, module: str, num_devices: int | None,
                 collectives: dict[str, CollectiveSummary],
                 records: list[CollectiveCost] | None = None,
                 largest_array: ArrayInfo | None = None, peak_live_bytes: int = 0,
                 instruction_count: int = 0) -> None:
        self.module = module
        self.num_devices = num_devices
        self.collectives = collectives
        self.records = [] if records is None else records
        self.largest_array = largest_array
        self.peak_live_bytes = peak_live_bytes
        self.instruction_count = instruction_count

    @property
    def total_count(self) -> int:
        return sum(c.count for c in self.collectives.values())

    @property
    def total_count_in_loops(self) -> int:
        return sum(c.count_in_loops for c in self.collectives.values())

    @property
    def total_bytes_per_device(self) -> float:
        return sum(c.bytes_per_device for c in self.collectives.values())

    @property
    def total_bytes_in_loops(self) -> float:
        return sum(c.bytes_in_loops for c in self.collectives.values())

    def count(self, kind: str) -> int:
        return self.collectives[kind].count


# -- traversal --------------------------------------------------------------------------------
def _reachable(module: Module) -> tuple[list[Computation], set[int]]:
    """Computations reachable from the entry (module order) and the ids of those inside a
    loop (a while body / condition, or called from one, transitively)."""
    reach: set[int] = set()
    loop: set[int] = set()
    stack: list[tuple[Computation, bool]] = [(module.entry, False)] if module.entry else []
    seen: set[tuple[int, bool]] = set()
    while stack:
        comp, in_loop = stack.pop()
        if (id(comp), in_loop) in seen:
            continue
        seen.add((id(comp), in_loop))
        reach.add(id(comp))
        if in_loop:
            loop.add(id(comp))
        for inst in comp.instructions:
            inner = in_loop or inst.opcode == "while"
            for callee in inst.called_computations:
                stack.append((callee, inner))
    ordered = [c for c in module.computations if id(c) in reach]
    return ordered, loop


def _infer_num_devices(module: Module, comps: Sequence[Computation]) -> int | None:
    n = module.config.get("num_partitions") if isinstance(module.config, dict) else None
    if n:
        return int(n)
    from hlo_spmd.ir.shape_inference import replica_groups

    top = -1
    for comp in comps:
        for inst in comp.instructions:
            for p in inst.attrs.source_target_pairs:
                top = max(top, p.source, p.target)
            if inst.opcode.startswith(("all-", "reduce-scatter", "collective-")):
                try:
                    groups = replica_groups(inst.attrs)
                except (ValueError, IndexError):
                    groups = None
                if groups is not None and groups.size:
                    flat = [d for g in groups for d in g] if groups.dtype == object \
                        else groups.reshape(-1).tolist()
                    top = max(top, max(flat))
    return top + 1 if top >= 0 else None


# -- memory -----------------------------------------------------------------------------------
def _own_bytes(inst: Instruction, is_entry: bool) -> int:
    if inst.opcode in ALIASING_OPS or inst.opcode == "while":
        return 0
    if inst.opcode == "parameter" and not is_entry:
        return 0
    return inst.shape.byte_size()


def _peak(comp: Computation, is_entry: bool, memo: dict[int, int]) -> int:
    """Peak bytes live during ``comp`` (see the module docstring)."""
    key = id(comp)
    if not is_entry and key in memo:
        return memo[key]
    memo.setdefault(key, 0)  # guards against (invalid) recursion
    order = comp.instructions
    end = len(order)
    # Only the values that own no buffer (ALIASING_OPS, while) are in ``aliases``: the
    # buffers they keep alive. Every other value is its own one buffer, which saves a
    # set per instruction (this runs on every computation the combiner rewrites).
    # Keyed by the instructions themselves (they hash by identity; cheaper than id()).
    aliases: dict[Instruction, frozenset[Instruction]] = {}
    elements: dict[Instruction, list[frozenset[Instruction]]] = {}
    last: dict[Instruction, int] = {}
    own = [0] * end  # bytes each position's instruction makes there
    # Entry parameters are there before the first instruction runs: (value, bytes).
    params: list[tuple[Instruction, int]] = []
    byte_size: dict[int, int] = {}  # per shape object: many instructions share one
    for idx, inst in enumerate(order):
        opcode = inst.opcode
        if opcode in _NO_OWN_BUFFER:
            if opcode == "while":  # the loop state lives in its operand's buffers
                o = inst.operands[0]
                if o in elements:
                    elements[inst] = elements[o]
                aliases[inst] = _buffers(o, aliases)
            else:
                if opcode == "get-tuple-element" and inst.operands[0] in elements:
                    src = elements[inst.operands[0]][inst.tuple_index]
                elif opcode == "add-dependency" and inst.operands:
                    src = _buffers(inst.operands[0], aliases)
                else:
                    src = frozenset().union(*(_buffers(o, aliases) for o in inst.operands))
                if opcode == "tuple":
                    elements[inst] = [_buffers(o, aliases) for o in inst.operands]
                aliases[inst] = src
        else:
            last[inst] = idx  # unused values die right after they are made
            if opcode != "parameter":
                shape = inst.shape
                n = byte_size.get(id(shape))
                if n is None:
                    n = byte_size[id(shape)] = shape.byte_size()
                own[idx] = n
            elif is_entry:
                params.append((inst, inst.shape.byte_size()))
        # (operands and control predecessors are read here: both stay live until now).
        # A read of a value without a buffer is noted on the value itself and passed on
        # to the buffers it keeps alive below: the last read of either is what counts.
        for o in (inst.operands if not inst.control_predecessors
                  else (*inst.operands, *inst.control_predecessors)):
            last[o] = idx
    for value, bufs in aliases.items():
        read = last.get(value)
        if read is not None:
            for buf in bufs:
                if last[buf] < read:
                    last[buf] = read
    if comp.root is not None:
        for buf in _buffers(comp.root, aliases):
            last[buf] = end
    freed = [0] * (end + 1)  # bytes whose last use is at each position
    live = 0
    for inst, n in params:
        live += n
        freed[last[inst]] += n
    peak = live
    # A value's bytes are added where it is made and, in the same step, noted as freed
    # at its last use (never before its definition), which is reached later or now.
    for idx, inst in enumerate(order):
        n = own[idx]
        if n:
            live += n
            freed[last[inst]] += n
        if inst.opcode in CONTROL_FLOW:
            live_in = live + max((_peak(c, False, memo) for c in inst.called_computations),
                                 default=0)
            if live_in > peak:
                peak = live_in
        elif live > peak:
            peak = live
        live -= freed[idx]
    if not is_entry:
        memo[key] = peak
    return peak


def _buffers(inst: Instruction,
             aliases: dict[Instruction, frozenset[Instruction]]) -> frozenset[Instruction]:
    """The buffers value ``inst`` keeps alive: its own, or those it aliases."""
    bufs = aliases.get(inst)
    return frozenset((inst,)) if bufs is None else bufs


def computation_peak_bytes(comp: Computation, is_entry: bool) -> int:
    """The peak-live estimate of one computation (callees included), as module_stats."""
    return _peak(comp, is_entry, {})


def _largest_array(comps: Sequence[Computation]) -> ArrayInfo | None:
    best: ArrayInfo | None = None
    for comp in comps:
        for inst in comp.instructions:
            for _, leaf in inst.shape.leaves():
                if not leaf.is_array:
                    continue
                n = leaf.byte_size()
                if best is None or n > best.bytes:
                    best = ArrayInfo(inst.name, comp.name, leaf.to_text(print_layout=False), n)
    return best


# -- the entry point --------------------------------------------------------------------------
def module_stats(module: Module, num_devices: int | None = None, *,
                 memory: bool = True) -> ModuleStats:
    """Collective and memory statistics of a per-device module. ``num_devices`` resolves
    empty replica groups (default: the module's ``num_partitions`` when known, else the
    largest device id named by any collective, plus one). ``memory=False`` skips the
    memory figures (peak live bytes and largest array are left 0 / None) for callers
    that only read the collectives, as ``partition``'s report does."""
    comps, loop = _reachable(module)
    if num_devices is None:
        num_devices = _infer_num_devices(module, comps)
    summaries = {k: CollectiveSummary(k) for k in COLLECTIVE_KINDS}
    records: list[CollectiveCost] = []
    count = 0
    for comp in comps:
        in_loop = id(comp) in loop
        for inst in comp.instructions:
            count += 1
            cost = collective_cost(inst, num_devices, in_loop)
            if cost is None:
                continue
            records.append(cost)
            s = summaries[cost.kind]
            s.count += 1
            s.bytes_per_device += cost.bytes_per_device
            s.max_group_size = max(s.max_group_size, cost.group_size)
            if in_loop:
                s.count_in_loops += 1
                s.bytes_in_loops += cost.bytes_per_device
    if not memory:
        return ModuleStats(module.name, num_devices, summaries, records, None, 0, count)
    peak = _peak(module.entry, True, {}) if module.entry is not None else 0
    return ModuleStats(module.name, num_devices, summaries, records, _largest_array(comps),
                       peak, count)


# -- rendering --------------------------------------------------------------------------------
def format_bytes(n: float | None) -> str:
    """``1536`` -> ``1.5 KiB``; None -> ``-``."""
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def stats_rows(stats: ModuleStats) -> list[dict]:
    """Table rows, all with the keys ``item``, ``count``, ``in_loops``, ``bytes``,
    ``bytes_in_loops``, ``max_group``, ``detail`` (None where a column does not apply):
    one per collective kind, a ``total`` row, then ``largest array`` and ``peak live``
    (bytes per device). ``bytes`` of a collective row is bytes per device."""
    rows = []
    for kind in COLLECTIVE_KINDS:
        c = stats.collectives[kind]
        rows.append({"item": kind, "count": c.count, "in_loops": c.count_in_loops,
                     "bytes": c.bytes_per_device, "bytes_in_loops": c.bytes_in_loops,
                     "max_group": c.max_group_size or None, "detail": None})
    rows.append({"item": "total", "count": stats.total_count,
                 "in_loops": stats.total_count_in_loops, "bytes": stats.total_bytes_per_device,
                 "bytes_in_loops": stats.total_bytes_in_loops, "max_group": None,
                 "detail": None})
    big = stats.largest_array
    rows.append({"item": "largest array", "count": None, "in_loops": None,
                 "bytes": big.bytes if big else 0, "bytes_in_loops": None, "max_group": None,
                 "detail": f"{big.shape} {big.name} ({big.computation})" if big else None})
    rows.append({"item": "peak live", "count": None, "in_loops": None,
                 "bytes": stats.peak_live_bytes, "bytes_in_loops": None, "max_group": None,
                 "detail": "estimate over the entry's program order"})
    return rows


def comparison_rows(a: ModuleStats, b: ModuleStats,
                    labels: tuple[str, str] = ("ours", "xla")) -> list[dict]:
    """Side-by-side rows of two modules' stats: ``item`` plus ``<label>_count`` and
    ``<label>_bytes`` for each label (rows as in :func:`stats_rows`)."""
    out = []
    for ra, rb in zip(stats_rows(a), stats_rows(b)):
        out.append({"item": ra["item"],
                    f"{labels[0]}_count": ra["count"], f"{labels[1]}_count": rb["count"],
                    f"{labels[0]}_bytes": ra["bytes"], f"{labels[1]}_bytes": rb["bytes"]})
    return out


def stats_json(stats: ModuleStats) -> dict:
    """``stats --json``: the table's figures plus one entry per collective instruction."""
    big = stats.largest_array
    return {
        "module": stats.module,
        "num_devices": stats.num_devices,
        "instruction_count": stats.instruction_count,
        "collectives": {k: {"count": c.count, "in_loops": c.count_in_loops,
                            "bytes_per_device": c.bytes_per_device,
                            "bytes_in_loops": c.bytes_in_loops,
                            "max_group_size": c.max_group_size}
                        for k, c in stats.collectives.items()},
        "total": {"count": stats.total_count, "in_loops": stats.total_count_in_loops,
                  "bytes_per_device": stats.total_bytes_per_device,
                  "bytes_in_loops": stats.total_bytes_in_loops},
        "largest_array": ({"name": big.name, "computation": big.computation,
                           "shape": big.shape, "bytes": big.bytes} if big else None),
        "peak_live_bytes": stats.peak_live_bytes,
        "instructions": [{"kind": r.kind, "instruction": r.name, "computation": r.computation,
                          "group_size": r.group_size, "bytes_per_device": r.bytes_per_device,
                          "in_loop": r.in_loop} for r in stats.records],
    }


__all__ = ["ModuleStats", "stats_json", "CollectiveSummary", "ArrayInfo", "module_stats", "stats_rows",
           "comparison_rows", "format_bytes", "ALIASING_OPS"]


# -- gates ------------------------------------------------------------------------------------
def gate_failures(stats: ModuleStats, *, max_bytes_per_device: int | None = None,
                  max_peak_memory: int | None = None) -> list[str]:
    """What exceeds its limit, one phrase each naming the figure and the limit; the
    figures are the ones ``stats`` prints (total bytes per device of the collectives, the
    peak live bytes), so a gate and the table never disagree. Empty when all pass."""
    out = []
    checks = (("bytes per device", stats.total_bytes_per_device, max_bytes_per_device),
              ("peak memory", stats.peak_live_bytes, max_peak_memory))
    for figure, value, limit in checks:
        if limit is not None and value > limit:
            out.append(f"{figure} {format_bytes(value)} ({int(value)} bytes) exceeds the limit "
                       f"{format_bytes(limit)} ({int(limit)} bytes)")
    return out
