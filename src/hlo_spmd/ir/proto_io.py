"""HloModuleProto <-> IR, lossless for every field the IR does not model."""
from __future__ import annotations

from typing import Any

from hlo_spmd.errors import InputError, ShardingError
from hlo_spmd.ir.comparison import complete_encodings
from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction, clear_owned
from hlo_spmd.ir.module import Module
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.ir.shape import Layout, Shape
from hlo_spmd.proto import hlo_pb2, xla_data_pb2

# Program shapes stay in attrs: they are rewritten on save only if the signature changed,
# because XLA's own copies carry names ("p0") and layout fields we would not reproduce.
_MODULE_OWNED = ("name", "entry_computation_name", "entry_computation_id", "computations", "id")
_COMPUTATION_OWNED = ("name", "instructions", "id", "root_id", "is_fusion_computation",
                      "execution_thread")


# -- shapes ---------------------------------------------------------------------------------
def shape_from_proto(msg: xla_data_pb2.ShapeProto, cache: dict | None = None) -> Shape:
    """The IR shape of ``msg``. With ``cache`` (serialized bytes -> Shape, one per load),
    equal protos give one shared Shape: shapes are immutable values, and a module repeats
    few distinct shapes over many instructions."""
    if cache is not None:
        key = msg.SerializeToString()
        shape = cache.get(key)
        if shape is None:
            shape = cache[key] = _shape_from_proto(msg, cache)
        return shape
    return _shape_from_proto(msg, None)


def _shape_from_proto(msg: xla_data_pb2.ShapeProto, cache: dict | None) -> Shape:
    try:
        element_type = PrimitiveType(msg.element_type)
    except ValueError:
        raise InputError(f"unknown element type {msg.element_type}") from None
    children = tuple(shape_from_proto(c, cache) for c in msg.tuple_shapes)
    layout = None
    if msg.HasField("layout"):
        lp = msg.layout
        layout = Layout(tuple(lp.minor_to_major), tuple(tuple(t.dimensions) for t in lp.tiles),
                        lp.element_size_in_bits, lp.memory_space)
    dyn = tuple(msg.is_dynamic_dimension) if any(msg.is_dynamic_dimension) else ()
    return Shape(element_type, tuple(msg.dimensions), children, layout, dyn, source_proto=msg)


def shape_to_proto(shape: Shape) -> xla_data_pb2.ShapeProto:
    if shape.source_proto is not None:
        out = xla_data_pb2.ShapeProto()
        out.CopyFrom(shape.source_proto)
        return out
    out = xla_data_pb2.ShapeProto(element_type=int(shape.element_type))
    out.dimensions.extend(shape.dims)
    for child in shape.tuple_shapes:
        out.tuple_shapes.add().CopyFrom(shape_to_proto(child))
    if shape.is_array:
        out.is_dynamic_dimension.extend(shape.dynamic_dims or [False] * shape.rank)
    if shape.layout is not None:
        lp = out.layout
        lp.minor_to_major.extend(shape.layout.minor_to_major)
        for tile in shape.layout.tiles:
            lp.tiles.add().dimensions.extend(tile)
        lp.element_size_in_bits = shape.layout.element_size_in_bits
        lp.memory_space = shape.layout.memory_space
        if not shape.layout.minor_to_major and not shape.layout.tiles:
            # An empty layout of a scalar is still a present layout.
            out.layout.SetInParent()
    return out


# -- shardings ------------------------------------------------------------------------------
def sharding_from_proto(msg: Any, where: str) -> Any:
    from hlo_spmd.sharding.proto import from_proto

    try:
        return from_proto(msg)
    except ShardingError as e:
        raise ShardingError(e.message, where) from None
    except (ValueError, IndexError) as e:
        raise ShardingError(f"invalid sharding: {e}", where) from None


def sharding_to_proto(sharding: Any) -> Any:
    from hlo_spmd.sharding.proto import to_proto

    return to_proto(sharding)


# -- module ---------------------------------------------------------------------------------
def _clear_fields(msg: Any, fields: tuple[str, ...]) -> Any:
    """``msg`` with ``fields`` (the ones the IR owns) cleared in place."""
    for f in fields:
        msg.ClearField(f)
    return msg


def _copy_without(msg: Any, fields: tuple[str, ...]) -> Any:
    """A copy of ``msg`` without ``fields``: what the IR keeps as a node's other fields."""
    out = type(msg)()
    out.CopyFrom(msg)
    return _clear_fields(out, fields)


def module_from_proto(msg: hlo_pb2.HloModuleProto, source: str = "<proto>",
                      consume: bool = False) -> Module:
    """The IR of ``msg``. With ``consume`` the message is taken over rather than copied:
    each instruction's own proto becomes its ``attrs`` (owned fields cleared in place),
    and likewise for computations and the module, so a load makes no per-instruction
    copies. Only for a message nobody else uses (e.g. one just parsed)."""
    module = Module(msg.name)
    module.id = msg.id
    if not consume:
        module.attrs = _copy_without(msg, _MODULE_OWNED)

    by_id: dict[int, Computation] = {}
    pending: list[tuple[Instruction, list[int]]] = []
    # One Shape / HloSharding per distinct proto (serialized bytes) of this load.
    shapes: dict[bytes, Shape] = {}
    shardings: dict[bytes, Any] = {}
    # The message methods as plain functions (upb's, one for every message type): a call
    # through ``imsg.ClearField`` makes a bound method object each time (about a third
    # of the call, ~8 calls an instruction).
    msg_type = hlo_pb2.HloInstructionProto
    clear, has_field, serialize = msg_type.ClearField, msg_type.HasField, msg_type.SerializeToString
    new_instruction = object.__new__
    for cmsg in msg.computations:
        comp = Computation(cmsg.name)
        comp.id = cmsg.id
        comp.module = module
        comp.is_fusion_computation = cmsg.is_fusion_computation
        comp.execution_thread = cmsg.execution_thread
        if not consume:
            comp.attrs = _copy_without(cmsg, _COMPUTATION_OWNED)
        if cmsg.id in by_id:
            raise InputError(f"duplicate computation id {cmsg.id}", f"{source}: computation {cmsg.name}")
        by_id[cmsg.id] = comp
        module.note_computation_id(cmsg.id)
        module.reserve_name(cmsg.name)

        local: dict[int, Instruction] = {}
        operand = local.__getitem__
        insts = comp.instructions
        append = insts.append
        for imsg in cmsg.instructions:
            if consume:
                attrs_i = imsg  # owned fields are cleared below, once read
            else:
                attrs_i = hlo_pb2.HloInstructionProto()
                attrs_i.CopyFrom(imsg)
                clear_owned(attrs_i)
            smsg = imsg.shape
            key = serialize(smsg)
            shape = shapes.get(key)
            if shape is None:
                shape = shapes[key] = _shape_from_proto(smsg, shapes)
            # Every slot set here, as Instruction.__init__ would (without its call and
            # its copies of the empty operand and callee lists: set below).
            inst = new_instruction(Instruction)
            inst.name = imsg.name
            inst.opcode = imsg.opcode
            inst.shape = shape
            inst.attrs = attrs_i
            inst.id = iid = imsg.id
            inst.parent = comp
            if has_field(imsg, "sharding"):
                smsg = imsg.sharding
                key = serialize(smsg)
                sharding = shardings.get(key)
                if sharding is None:
                    sharding = shardings[key] = sharding_from_proto(
                        smsg, _where(source, cmsg, imsg))
                inst.sharding = sharding
                # A cleared field's message stays valid (detached) in the kept reference.
                inst.source_sharding = (sharding, smsg)
                if consume:
                    clear(imsg, "sharding")
            else:
                inst.sharding = None
                inst.source_sharding = None
            if iid in local:
                raise InputError(f"duplicate instruction id {iid}", _where(source, cmsg, imsg))
            local[iid] = inst
            try:
                # ``[:]`` copies a repeated field to a list in one call; iterating the
                # field itself goes through the container element by element.
                ids = imsg.operand_ids
                if ids:
                    inst.operands = list(map(operand, ids[:]))
                    if consume:
                        clear(imsg, "operand_ids")
                else:
                    inst.operands = []
                controls = imsg.control_predecessor_ids
                if controls:
                    inst.control_predecessors = list(map(operand, controls[:]))
                    if consume:
                        clear(imsg, "control_predecessor_ids")
                else:
                    inst.control_predecessors = []
            except KeyError as e:
                raise InputError(f"operand id {e.args[0]} is not defined before use",
                                 _where(source, cmsg, imsg)) from None
            append(inst)
            called = imsg.called_computation_ids
            if called:
                pending.append((inst, list(called)))
                if consume:
                    clear(imsg, "called_computation_ids")
            inst.called_computations = []
            if consume:
                # The other owned fields (OWNED_FIELDS), cleared only where set (above):
                # each call counts at 100k instructions.
                clear(imsg, "name")
                clear(imsg, "opcode")
                clear(imsg, "shape")
                clear(imsg, "id")
        if local:
            module.note_instruction_id(max(local))
            module.reserve_names([inst.name for inst in insts])
        if cmsg.root_id not in local:
            if not cmsg.instructions:
                raise InputError("computation has no instructions", f"{source}: computation {cmsg.name}")
            raise InputError(f"root id {cmsg.root_id} is not an instruction of the computation",
                             f"{source}: computation {cmsg.name}")
        comp.root = local[cmsg.root_id]
        module.computations.append(comp)

    for inst, called_ids in pending:
        try:
            inst.called_computations = [by_id[i] for i in called_ids]
        except KeyError as e:
            raise InputError(f"called computation id {e.args[0]} does not exist",
                             f"{source}: instruction {inst.name}") from None

    entry = by_id.get(msg.entry_computation_id)
    if entry is None or (msg.entry_computation_name and entry.name != msg.entry_computation_name):
        entry = next((c for c in module.computations if c.name == msg.entry_computation_name), entry)
    if entry is None:
        raise InputError("module has no entry computation", source)
    module.entry = entry
    if consume:
        # Detach the computation messages (and through them the instructions' attrs)
        # before clearing the module's owned fields: the kept references stay valid.
        for comp, cmsg in zip(module.computations, msg.computations):
            comp.attrs = _clear_fields(cmsg, _COMPUTATION_OWNED)
        module.attrs = _clear_fields(msg, _MODULE_OWNED)
    return module


def _where(source: str, cmsg: Any, imsg: Any) -> str:
    return f"{source}: computation {cmsg.name}, instruction {imsg.name or imsg.id}"


class _ShapeProtos:
    """The ShapeProto of each shape written by one save: its source proto, else built
    once per distinct leaf value (a tuple's bytes also depend on its children's source
    protos, which equality ignores, so tuples are built each time). Looked up by object
    first (shapes are shared), then by value; the objects are held meanwhile."""

    __slots__ = ("_by_id", "_by_value", "_fields")

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Shape, xla_data_pb2.ShapeProto]] = {}
        self._by_value: dict[Shape, xla_data_pb2.ShapeProto] = {}
        self._fields: dict[int, tuple[Shape, bytes]] = {}

    def shape_field(self, shape: Shape) -> bytes:
        """An HloInstructionProto holding only ``shape`` (``get``'s proto), serialized:
        merged into an instruction without a shape, it sets the shape as a copy of the
        proto would, in one call (no sub-message object made for the field)."""
        got = self._fields.get(id(shape))
        if got is None:
            holder = hlo_pb2.HloInstructionProto()
            holder.shape.CopyFrom(self.get(shape))
            got = self._fields[id(shape)] = (shape, holder.SerializeToString())
        return got[1]

    def get(self, shape: Shape) -> xla_data_pb2.ShapeProto:
        if shape.source_proto is not None:
            return shape.source_proto
        got = self._by_id.get(id(shape))
        if got is not None:
            return got[1]
        if shape.tuple_shapes:
            return shape_to_proto(shape)
        sp = self._by_value.get(shape)
        if sp is None:
            sp = self._by_value[shape] = shape_to_proto(shape)
        self._by_id[id(shape)] = (shape, sp)
        return sp


def _program_shape(comp: Computation,
                   shape_protos: _ShapeProtos | None = None) -> xla_data_pb2.ProgramShapeProto:
    protos = shape_protos if shape_protos is not None else _ShapeProtos()
    ps = xla_data_pb2.ProgramShapeProto()
    for p in comp.parameters:
        ps.parameters.add().CopyFrom(protos.get(p.shape))
        ps.parameter_names.append(p.name)
    ps.result.CopyFrom(protos.get(comp.root.shape))
    return ps


def instruction_to_proto(inst: Instruction, p: hlo_pb2.HloInstructionProto | None = None,
                         shape_protos: _ShapeProtos | None = None) -> hlo_pb2.HloInstructionProto:
    """``inst`` as a proto; written into ``p`` (an empty message, e.g. a fresh element of
    a computation's repeated field, saving a second copy) when given. ``shape_protos``
    (one per save) builds each distinct new array shape once."""
    if p is None:
        p = hlo_pb2.HloInstructionProto()
    _write_instructions(lambda: p, (inst,),
                        shape_protos if shape_protos is not None else _ShapeProtos())
    return p


# upb's message and repeated-field methods as plain functions (one for every message
# type): called through an instance, each call makes a bound method object first.
_copy_from = hlo_pb2.HloInstructionProto.CopyFrom
_merge_from_string = hlo_pb2.HloInstructionProto.MergeFromString
_extend_ids = type(hlo_pb2.HloInstructionProto().operand_ids).extend


def _write_instructions(new_message: Any, instructions: Any, shape_protos: _ShapeProtos) -> None:
    """Write each of ``instructions`` into the empty message ``new_message()`` returns
    (e.g. a computation's ``instructions.add``): its attrs, then the fields it owns."""
    copy_from, merge, extend = _copy_from, _merge_from_string, _extend_ids
    shape_field = shape_protos.shape_field
    for inst in instructions:
        p = new_message()
        copy_from(p, inst.attrs)
        p.name = inst.name
        opcode = p.opcode = inst.opcode
        if opcode == "compare" and inst.operands:
            # Both XLA generations must read the same ordering (ir/comparison.py).
            complete_encodings(p, inst.operands[0].shape.element_type)
        merge(p, shape_field(inst.shape))
        p.id = inst.id
        if inst.operands:
            extend(p.operand_ids, [o.id for o in inst.operands])
        if inst.control_predecessors:
            extend(p.control_predecessor_ids, [o.id for o in inst.control_predecessors])
        if inst.called_computations:
            extend(p.called_computation_ids, [c.id for c in inst.called_computations])
        sharding = inst.sharding
        if sharding is not None:
            source = inst.source_sharding
            if source is not None and source[0] is sharding:
                copy_from(p.sharding, source[1])
            else:
                copy_from(p.sharding, sharding_to_proto(sharding))


def module_to_proto(module: Module) -> hlo_pb2.HloModuleProto:
    out = hlo_pb2.HloModuleProto()
    if module.attrs is not None:
        out.CopyFrom(module.attrs)
    shapes: dict[bytes, Shape] = {}  # for comparing program shapes
    shape_protos = _ShapeProtos()  # new shapes, built once
    out.name = module.name
    out.id = module.id
    out.entry_computation_name = module.entry.name
    out.entry_computation_id = module.entry.id
    for comp in module.computations:
        c = out.computations.add()
        if comp.attrs is not None:
            c.CopyFrom(comp.attrs)
        c.name = comp.name
        c.id = comp.id
        c.root_id = comp.root.id
        c.is_fusion_computation = comp.is_fusion_computation
        c.execution_thread = comp.execution_thread
        _write_instructions(c.instructions.add, comp.instructions, shape_protos)
        _update_program_shape(c.program_shape, _program_shape(comp, shape_protos),
                              c.HasField("program_shape"), shapes)
    _update_program_shape(out.host_program_shape, _program_shape(module.entry, shape_protos),
                          out.HasField("host_program_shape"), shapes)
    return out


def _update_program_shape(current: xla_data_pb2.ProgramShapeProto,
                          fresh: xla_data_pb2.ProgramShapeProto, present: bool,
                          shapes: dict | None = None) -> None:
    """Keep a loaded program shape whose signature still matches, else write a fresh one."""
    if present and _same_signature(current, fresh, shapes):
        return
    current.CopyFrom(fresh)


def _same_signature(a: xla_data_pb2.ProgramShapeProto, b: xla_data_pb2.ProgramShapeProto,
                    shapes: dict | None = None) -> bool:
    if len(a.parameters) != len(b.parameters):
        return False
    pairs = list(zip(a.parameters, b.parameters)) + [(a.result, b.result)]
    return all(shape_from_proto(x, shapes).compatible(shape_from_proto(y, shapes))
               for x, y in pairs)
