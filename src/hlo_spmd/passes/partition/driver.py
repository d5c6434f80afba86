"""Partitioning driver: build the per-device module from a completed one.

The output contract (README.md, "Commands"): one program for all devices; entry parameters have the
per-device shape ceil(dim/tiles) of their sharding, padded at the end; entry parameters
and root carry ``sharding={manual}`` so XLA compiles the program as written; the global
shardings are recorded in ``spmd_parameters_shardings`` / ``spmd_output_sharding``.
"""
from __future__ import annotations

from typing import Sequence

from hlo_spmd.collectives.factory import CollectiveFactory
from hlo_spmd.collectives.groups import DeviceGrouping
from hlo_spmd.errors import HloSpmdError, PartitionError
from hlo_spmd.ir.builder import Builder
from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.module import Module
from hlo_spmd.passes.partition.causes import CauseLog
from hlo_spmd.passes.partition.context import PartitionContext
from hlo_spmd.passes.partition.state import ModuleState, PartitionOptions, PartitionReport
from hlo_spmd.ir.opcodes import APPLIES, COLLECTIVES, MANUAL_OWN_HANDLER, SIDE_EFFECTING
from hlo_spmd.passes.partition.pvalue import PValue
from hlo_spmd.passes.partition.registry import HANDLERS
from hlo_spmd.passes.partition.reshard import reshard
from hlo_spmd.passes.partition.tidy import tidy_module
from hlo_spmd.proto import hlo_pb2
from hlo_spmd.sharding import HloSharding, to_proto

import hlo_spmd.passes.partition.handlers  # noqa: F401  (registers the handlers)


def manual_like(shape) -> HloSharding:
    if shape.is_tuple:
        return HloSharding.tuple([manual_like(s) for s in shape.tuple_shapes])
    return HloSharding.manual()


# Identity custom-calls that only carry annotations; meaningless (and rejected by XLA
# without their sharding) once the program is per-device.
_ANNOTATION_TARGETS = frozenset({"Sharding", "xla.sdy.FuncResultSharding",
                                 "xla.sdy.PropagationBarrier"})


def _remove_annotation_calls(comp: Computation) -> None:
    for inst in list(comp.instructions):
        if (inst.opcode == "custom-call" and inst.custom_call_target in _ANNOTATION_TARGETS
                and len(inst.operands) == 1 and inst.operands[0].shape.compatible(inst.shape)):
            comp.replace_all_uses(inst, inst.operands[0])


def _drop_sdy_attributes(fattrs) -> None:
    """Shardy's attributes describe global shardings; the per-device program has none."""
    for key in [k for k in fattrs.map if k.startswith("xla.sdy.")]:
        del fattrs.map[key]


def _fully_manual(s: HloSharding | None) -> bool:
    if s is None:
        return False
    return all(e.is_manual for e in s.tuple_elements) if s.is_tuple else s.is_manual


def runs_as_written(inst: Instruction) -> bool:
    """Inside a fully manual region shapes are already per-device, so an op runs as
    written. Control flow (partitioned recursively), collectives and custom-calls
    (region boundaries, side effects) keep their own handlers."""
    return _fully_manual(inst.sharding) and _manual_runs_as_written(inst)


def _manual_runs_as_written(inst: Instruction) -> bool:
    """``runs_as_written`` for an instruction already known to be fully manual.

    ``get-tuple-element`` keeps its own handler: its tuple operand may mix manual and
    non-manual leaves (a parameter ``{{devices=...}, {manual}}``), and only the element
    it reads has to be manual."""
    return ((not inst.called_computations or inst.opcode in APPLIES)
            and inst.opcode not in MANUAL_OWN_HANDLER
            and inst.opcode not in COLLECTIVES)


def handle_as_written(ctx: PartitionContext, inst: Instruction) -> PValue:
    ops = [ctx.operand(inst, i, manual_like(op.shape)) for i, op in enumerate(inst.operands)]
    return PValue(ctx.emit_like(inst, ops, inst.shape), inst.shape, inst.sharding)


_AS_WRITTEN = (handle_as_written, "handle_as_written")


def single_device(s: HloSharding | None) -> int | None:
    """The device of a ``{maximal device=k}`` sharding (every leaf of a tuple on the same
    one), else None."""
    if s is None or not s.is_maximal:
        return None
    return s.unique_device


def maximal_like(shape, device: int) -> HloSharding:
    if shape.is_tuple:
        return HloSharding.tuple([maximal_like(s, device) for s in shape.tuple_shapes])
    return HloSharding.maximal(device)


def _on_device_runs_as_written(inst: Instruction) -> bool:
    """Compute on one device runs as written there (XLA clones such an op on whole
    operands); side effects keep their handlers (run under a conditional on the owner),
    as do control flow, collectives, custom-calls and ops without operands (constants,
    iotas, device ids: made where they are needed, or refused, by their handlers)."""
    return (bool(inst.operands) and _manual_runs_as_written(inst)
            and inst.opcode not in SIDE_EFFECTING)


def handle_on_device(ctx: PartitionContext, inst: Instruction) -> PValue:
    """An op whose sharding puts it on one device: whole operands on that device (free
    when they are already there or replicated; one transfer from another device), the op
    as written. Every device computes it, only the owner's result is the value."""
    device = single_device(inst.sharding)
    assert device is not None
    values = [ctx.value(op) for op in inst.operands]
    if values and all(_everywhere(v.sharding) for v in values):
        # Whole operands on every device: every device computes the owner's value, so
        # it is replicated (a later user anywhere reads it for free, as in XLA).
        out = ctx.emit_like(inst, [v.hlo for v in values], inst.shape)
        return PValue(out, inst.shape, _replicated_like(inst.shape))
    ops = [ctx.operand(inst, i, maximal_like(op.shape, device))
           for i, op in enumerate(inst.operands)]
    return PValue(ctx.emit_like(inst, ops, inst.shape), inst.shape, inst.sharding)


def _everywhere(s: HloSharding) -> bool:
    return all(e.is_replicated for e in s.tuple_elements) if s.is_tuple else s.is_replicated


def _replicated_like(shape) -> HloSharding:
    if shape.is_tuple:
        return HloSharding.tuple([_replicated_like(s) for s in shape.tuple_shapes])
    return HloSharding.replicate()


_ON_DEVICE = (handle_on_device, "handle_on_device")


def partition_instructions(ctx: PartitionContext, comp: Computation) -> None:
    """Run the handler of every non-parameter instruction of ``comp`` in program order."""
    from hlo_spmd.passes.partition.handlers.basic import handle_replicated

    # Looked up once: this loop runs once per instruction of the module.
    b = ctx.b
    values = ctx.values
    handler_of = ctx.state.report.handler_of
    origins = ctx.state.origins
    log = ctx.f.log
    handlers_get = HANDLERS.get
    # opcode -> (handler, its report name); id(sharding) -> (sharding, fully manual, on a
    # single device); shardings are shared objects (a few dozen per module), held so their
    # ids stay theirs.
    by_opcode: dict[str, tuple] = {}
    manual: dict[int, tuple] = {}
    settled = ctx.state.settled
    for inst in comp.instructions:
        opcode = inst.opcode
        if opcode == "parameter":
            continue
        if settled and id(inst) in settled:
            # Made by an earlier handler (state.settled); None: no value of its own.
            pv = settled.pop(id(inst))
            if pv is not None:
                values[id(inst)] = pv
            handler_of[inst.name] = "settled"
            continue
        entry = None
        s = inst.sharding
        if s is not None:
            got = manual.get(id(s))
            if got is None:
                got = manual[id(s)] = (s, _fully_manual(s), single_device(s) is not None)
            if got[1] and _manual_runs_as_written(inst):
                entry = _AS_WRITTEN
            elif got[2] and _on_device_runs_as_written(inst):
                entry = _ON_DEVICE
        if entry is None:
            entry = by_opcode.get(opcode)
            if entry is None:
                h = handlers_get(opcode, handle_replicated)
                entry = by_opcode[opcode] = (h, _handler_name(h))
        handler, name = entry
        attrs = inst.attrs
        b.metadata = attrs.metadata if attrs.HasField("metadata") else None
        log.enter_instruction(inst)
        try:
            pv = handler(ctx, inst)
        except HloSpmdError:
            raise
        except Exception as e:  # a bug: name the instruction it happened on
            raise PartitionError(f"internal error in the {opcode} handler: "
                                 f"{type(e).__name__}: {e}",
                                 f"computation {comp.name}, instruction {inst.name}") from e
        finally:
            log.leave()
        handler_of[inst.name] = name
        if pv is None:  # the handler settled every user of inst (state.settled)
            continue
        values[id(inst)] = pv
        # (first maker wins: a handler passing its operand's value through keeps the
        # operand as the origin, the same data; keyed by the global shape too, since a
        # slice inside one tile passes the local array through as a different value;
        # by its dims, which name it among the arrays one local array can stand for, and
        # which hash without walking the shape; tuples are never re-made: not kept)
        if not pv.base_shape.is_tuple:
            origins.setdefault((id(pv.hlo), pv.base_shape.dims), (pv.hlo, inst))
    b.metadata = None


_HANDLER_NAMES: dict = {}


def _handler_name(handler) -> str:
    """The handler's name for the report (a few dozen handlers, named once each)."""
    name = _HANDLER_NAMES.get(handler)
    if name is None:
        name = _HANDLER_NAMES[handler] = getattr(handler, "__name__", str(handler))
    return name


def partition_computation(ctx: PartitionContext, comp: Computation,
                          param_shardings: Sequence[HloSharding], root_sharding: HloSharding,
                          name: str | None = None) -> Computation:
    """A partitioned copy of a called computation (while body/condition, branch, call):
    parameters arrive with ``param_shardings``, the root leaves with ``root_sharding``."""
    out = Computation(name or comp.name)
    ctx.state.out.add_computation(out)
    b = Builder(out)
    inner = ctx.for_computation(b)
    for param, sharding in zip(comp.parameters, param_shardings):
        local = inner.local_shape(param.shape, sharding)
        new = b.parameter(param.parameter_number, local, name=param.name)
        inner.values[id(param)] = PValue(new, param.shape, sharding)
    partition_instructions(inner, comp)
    root = reshard(inner, inner.value(comp.root), root_sharding)
    b.set_root(root.hlo)
    return out


def entry_interface(module: Module) -> tuple[list[HloSharding], HloSharding]:
    """The global shardings of a completed module's entry parameters and root, as the
    partitioned module records them (unannotated means replicated)."""
    params = [p.sharding if p.sharding is not None else HloSharding.replicate()
              for p in module.entry.parameters]
    root = module.entry.root.sharding
    return params, root if root is not None else HloSharding.replicate()


def partition_module(module: Module, num_partitions: int,
                     options: PartitionOptions | None = None) -> tuple[Module, PartitionReport]:
    out = Module(module.name)
    out.attrs = hlo_pb2.HloModuleProto()
    if module.attrs is not None:
        out.attrs.CopyFrom(module.attrs)
        for f in ("spmd_parameters_shardings", "spmd_output_sharding", "schedule",
                  "host_program_shape"):
            out.attrs.ClearField(f)
    state = ModuleState(module, out, num_partitions, PartitionReport(),
                        options=options or PartitionOptions())
    entry = Computation(module.entry.name)
    out.add_computation(entry)
    out.entry = entry
    b = Builder(entry)
    ctx = PartitionContext(state, b, CollectiveFactory(b, DeviceGrouping.flat(num_partitions),
                                                       CauseLog()))
    state.report.causes = ctx.f.log

    param_shardings: list[HloSharding] = []
    new_params: list[Instruction] = []
    for param in module.entry.parameters:
        sharding = param.sharding
        if sharding is None:
            sharding = HloSharding.replicate()
            state.report.unsharded_inputs.append(param.name)
        local = ctx.local_shape(param.shape, sharding)
        new = b.parameter(param.parameter_number, local, name=param.name)
        ctx.values[id(param)] = PValue(new, param.shape, sharding)
        param_shardings.append(sharding)
        new_params.append(new)

    partition_instructions(ctx, module.entry)
    root = module.entry.root
    root_sharding = ctx.sharding_of(root)
    result = reshard(ctx, ctx.value(root), root_sharding).hlo
    if result.opcode == "parameter":
        result = b.op("copy", [result], declared=result.shape)  # a root must not double as input
    b.set_root(result)

    for comp in out.computations:
        for inst in comp.instructions:
            inst.sharding = None
            inst.source_sharding = None
            attrs = inst.attrs
            # Most instructions carry an empty frontend_attributes message (copied from
            # the input): only a non-empty map can hold Shardy keys.
            if attrs.HasField("frontend_attributes") and attrs.frontend_attributes.map:
                _drop_sdy_attributes(attrs.frontend_attributes)
    _drop_sdy_attributes(out.attrs.frontend_attributes)
    for new, param in zip(new_params, module.entry.parameters):
        new.sharding = manual_like(param.shape)
    result.sharding = manual_like(root.shape)
    protos: dict[int, tuple] = {}  # one proto per sharding object (loads share them)
    for s in param_shardings:
        got = protos.get(id(s))
        if got is None:
            got = protos[id(s)] = (s, to_proto(s))
        out.attrs.spmd_parameters_shardings.add().CopyFrom(got[1])
    out.attrs.spmd_output_sharding.CopyFrom(to_proto(root_sharding))

    for comp in out.computations:
        _remove_annotation_calls(comp)
        comp.remove_dead()
    combine_mib = state.options.combine_threshold_mib or 0
    tidy_module(out, num_partitions, ctx.f.log,  # fewer bytes once every user is known
                combine_threshold_bytes=int(combine_mib * 2 ** 20))
    out.remove_unreachable_computations()
    _mark_branch_operands_manual(out)
    out.sort_computations()
    return out, state.report


def _mark_branch_operands_manual(module: Module) -> None:
    """Give every value a conditional passes to its branches ``sharding={manual}``.

    XLA's StableHLO form of a conditional has branch regions that capture the operands'
    elements; turned back into HLO they become a tuple whose leaf shardings are those of
    the captured values, ``{replicated}`` for a value without one. When some captures
    carry ``{manual}`` (an entry parameter) and others none, XLA's partitioner meets a
    replicated leaf in the per-device program: it rejects a partition-id feeding it
    ("PartitionId instruction is not supported for SPMD partitioning") or fails a check
    on the mixed tuple. Every value of the per-device program is manual; saying so on
    the captured ones makes the tuple uniformly manual."""
    for comp in module.computations:
        for inst in comp.instructions:
            if inst.opcode != "conditional":
                continue
            stack = list(inst.operands[1:])
            while stack:
                x = stack.pop()
                if x.opcode == "tuple":
                    stack.extend(x.operands)
                if x.sharding is None:
                    x.sharding = manual_like(x.shape)
