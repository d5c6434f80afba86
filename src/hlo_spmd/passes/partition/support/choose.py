"""Choosing between alternative partitionings of one instruction by what they cost.

Each alternative is emitted into the computation being built; the one that communicates
the fewest bytes per device (measured with ``collectives.cost``, the same model as
``hlo_spmd.stats`` and the XLA comparison) plus the bytes of its largest new tensor wins:
communication and per-device memory weigh the same, so a strategy that saves a little
traffic by materializing a whole operand on every device loses to one that keeps tensors
small (ties: fewer communicated bytes). The losers are dead code, removed by the driver's dead-code pass. XLA makes the
same kind of choice inside its gather / scatter / sort handlers by comparing estimated
communication of its strategies.
"""
from __future__ import annotations

from typing import Callable, Sequence

from hlo_spmd.collectives.cost import array_bytes, collective_cost
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.shape import Shape
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.pvalue import PValue


def cheapest(ctx: PartitionContext, candidates: Sequence[Callable[[], PValue]]) -> PValue:
    """Emit every candidate and keep the cheapest (module docstring). The others become
    dead code. A candidate returns
    None when it does not apply."""
    comp = ctx.b.computation
    # Each candidate starts from the reshard cache as it was: a reshard one candidate made
    # must not look free to the next (and a loser's dead reshards must not be reused).
    cache = ctx.state.reshard_cache
    before = dict(cache)
    best, best_key, best_cache = None, None, before
    for emit in candidates:
        start = len(comp.instructions)
        cache.clear()
        cache.update(before)
        pv = emit()
        if pv is None:
            continue
        new = comp.instructions[start:]
        nbytes = 0.0
        for inst in new:
            c = collective_cost(inst, ctx.state.num_devices)
            if c is not None:
                nbytes += c.bytes_per_device
        peak = max((array_bytes_of(i.shape) for i in new), default=0)
        key = (round(nbytes + peak, 3), round(nbytes, 3))
        if best_key is None or key < best_key:
            best, best_key, best_cache = pv, key, dict(cache)
    cache.clear()
    cache.update(best_cache)
    return best


def array_bytes_of(shape: Shape) -> int:
    """The largest array in ``shape`` (a tuple's largest element), in bytes."""
    if shape.is_tuple:
        return max((array_bytes_of(s) for s in shape.tuple_shapes), default=0)
    if not shape.is_array:
        return 0
    return array_bytes(shape)


def cheapest_or_replicated(ctx: PartitionContext, inst: Instruction,
                           cands: Sequence[Callable[[], PValue]]) -> PValue:
    """``cheapest``, reporting a replicated fallback only when it is the one kept."""
    report = ctx.state.report.replicated_fallbacks
    before = len(report)
    results: list[PValue] = []

    def keep(emit: Callable[[], PValue]) -> Callable[[], PValue]:
        def run() -> PValue:
            results.append(emit())
            return results[-1]
        return run

    pv = cheapest(ctx, [keep(c) for c in cands])
    del report[before:]
    if pv is results[-1]:  # the replicated candidate (always last) won
        report.append((inst.name, inst.opcode))
    return pv


