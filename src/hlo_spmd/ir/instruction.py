"""HLO instructions.

An instruction models what the passes own (name, opcode, shape, operands, called
computations, control predecessors, sharding). Every other field of XLA's
HloInstructionProto — opcode attributes, metadata, frontend attributes, backend config,
fields this version does not know — lives in ``attrs``, an HloInstructionProto with the
owned fields cleared. Saving writes ``attrs`` back and overrides the owned fields, which
makes load -> save lossless without modelling every attribute twice.

Instructions (and computations) compare and hash by identity -- no ``__eq__`` -- so the
passes keep sets and dicts of the instructions themselves: cheaper than sets of
``id()``s and never confused by a reused id. ``tests/test_ir_identity.py`` holds that.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

from hlo_spmd.ir.shape import Shape
from hlo_spmd.proto import hlo_pb2

if TYPE_CHECKING:
    from hlo_spmd.ir.computation import Computation
    from hlo_spmd.sharding import HloSharding

# HloInstructionProto fields that Instruction models itself; cleared in ``attrs``.
OWNED_FIELDS = ("name", "opcode", "shape", "id", "operand_ids", "called_computation_ids",
                "control_predecessor_ids", "sharding")


class Instruction:
    __slots__ = ("name", "opcode", "shape", "operands", "called_computations",
                 "control_predecessors", "sharding", "attrs", "id", "parent",
                 "source_sharding", "__weakref__")

    def __init__(self, opcode: str, shape: Shape, operands: Sequence["Instruction"] = (),
                 name: str = "", attrs: hlo_pb2.HloInstructionProto | None = None,
                 called_computations: Sequence["Computation"] = (),
                 sharding: "HloSharding | None" = None) -> None:
        self.name = name
        self.opcode = opcode
        self.shape = shape
        self.operands: list[Instruction] = list(operands)
        self.called_computations: list[Computation] = list(called_computations)
        self.control_predecessors: list[Instruction] = []
        self.sharding = sharding
        self.attrs = attrs if attrs is not None else hlo_pb2.HloInstructionProto()
        self.id: int = -1
        self.parent: Computation | None = None
        # (sharding object, OpSharding proto) as loaded: an unchanged sharding is written
        # back byte-for-byte (metadata and fields we do not model included).
        self.source_sharding: tuple[Any, Any] | None = None

    # -- common attributes (read from attrs so there is one source of truth) -------------
    @property
    def parameter_number(self) -> int:
        return self.attrs.parameter_number

    @property
    def tuple_index(self) -> int:
        return self.attrs.tuple_index

    @property
    def dimensions(self) -> list[int]:
        return list(self.attrs.dimensions)

    @property
    def custom_call_target(self) -> str:
        return self.attrs.custom_call_target

    @property
    def frontend_attributes(self) -> dict[str, str]:
        return dict(self.attrs.frontend_attributes.map)

    @property
    def is_root(self) -> bool:
        return self.parent is not None and self.parent.root is self

    def operand(self, i: int) -> "Instruction":
        return self.operands[i]

    def replace_operand(self, old: "Instruction", new: "Instruction") -> None:
        self.operands = [new if o is old else o for o in self.operands]

    def set_attrs(self, **fields: Any) -> "Instruction":
        """Set scalar / repeated attribute fields on ``attrs`` by name; returns self."""
        for key, value in fields.items():
            target = getattr(self.attrs, key)
            if hasattr(target, "extend") and not isinstance(value, (str, bytes)):
                del target[:]
                target.extend(value)
            elif hasattr(target, "CopyFrom"):
                target.CopyFrom(value)
            else:
                setattr(self.attrs, key, value)
        return self

    def __repr__(self) -> str:
        return f"<{self.name} = {self.shape} {self.opcode}({', '.join(o.name for o in self.operands)})>"


def clear_owned(proto: hlo_pb2.HloInstructionProto) -> hlo_pb2.HloInstructionProto:
    for f in OWNED_FIELDS:
        proto.ClearField(f)
    return proto


def iter_operand_users(instructions: Iterable[Instruction],
                       only: "set[Instruction] | None" = None) -> dict[int, list[Instruction]]:
    """id(instruction) -> users in program order, each user once. With ``only``, just the
    users of those instructions (a pass that asks about a few hundred values of a
    10k-instruction body builds only their lists)."""
    users: dict[int, list[Instruction]] = {}
    get = users.get
    if only is not None:
        for inst in instructions:
            for op in inst.operands:
                if op in only:
                    key = id(op)
                    lst = get(key)
                    if lst is None:
                        users[key] = [inst]
                    elif lst[-1] is not inst:
                        lst.append(inst)
        return users
    for inst in instructions:
        for op in inst.operands:
            key = id(op)
            lst = get(key)
            if lst is None:
                users[key] = [inst]
            elif lst[-1] is not inst:  # an operand read twice: its list already ends so
                lst.append(inst)
    return users
