"""Structural and shape verification of a module (XLA's HloVerifier, layout-insensitive).

``verify_module(module)`` raises ``VerifierError`` naming the computation and the
instruction at the first problem found:

* the entry computation is set and part of the module; computation names and ids unique;
* instruction names and ids unique across the module; each instruction appears once and
  its ``parent`` is the computation holding it;
* operands and control predecessors are instructions of the same computation, defined
  before use (program order); the root is set and belongs to the computation;
* parameter numbers are unique and contiguous 0..n-1;
* the opcode is known; fixed-arity opcodes have that many operands;
* called computations are in the module and precede their caller (XLA loads computations
  in proto order); only caller opcodes call computations, with the right count;
* the instruction's shape equals the inferred shape, ignoring layout, for every opcode
  with a rule (this also checks callee signatures: while body/condition, reducers,
  comparators, conditional branches, call arguments);
* array dims are non-negative, an array's byte size fits in int64, and a layout is a
  permutation of the dims;
* shardings, when present, fit the instruction's shape (``HloSharding.validate_for_shape``,
  with ``num_devices`` when given).

The work is linear in the module size.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_spmd.errors import HloSpmdError, VerifierError
from hlo_spmd.ir.primitive_types import ARRAY_TYPES
from hlo_spmd.ir.shape import Shape
from hlo_spmd.ir.shape_inference import (
    ARITY,
    CALLED_COUNT,
    KNOWN_OPCODES,
    InferenceMemo,
    parameter_is_valid,
)

if TYPE_CHECKING:
    from hlo_spmd.ir.computation import Computation
    from hlo_spmd.ir.module import Module


#: The largest byte size of an array shape (XLA keeps sizes in int64).
_MAX_BYTES = 2 ** 63 - 1


def _where(comp: "Computation", inst=None) -> str:
    if inst is None:
        return f"computation {comp.name}"
    return f"computation {comp.name}, instruction {inst.name}"


def _check_shape_value(shape: Shape, comp: "Computation", inst) -> None:
    if shape.is_tuple:
        for child in shape.tuple_shapes:
            _check_shape_value(child, comp, inst)
        return
    for d in shape.dims:
        if d < 0:
            raise VerifierError(f"shape {shape} has a negative dimension", _where(comp, inst))
    if shape.dims and shape.element_type in ARRAY_TYPES and shape.byte_size() > _MAX_BYTES:
        # XLA's shape validation: an array's byte size must fit in int64
        raise VerifierError(f"shape {shape} is too large: {shape.byte_size()} bytes, more "
                            f"than an XLA array can hold (2^63-1)", _where(comp, inst))
    lay = shape.layout
    if lay is not None and shape.element_type in ARRAY_TYPES:
        if len(lay.minor_to_major) != len(shape.dims):
            raise VerifierError(f"shape {shape} has a layout with {len(lay.minor_to_major)} "
                                f"entries for rank {len(shape.dims)}", _where(comp, inst))
        if sorted(lay.minor_to_major) != list(range(len(shape.dims))):
            raise VerifierError(f"shape {shape} has a layout {list(lay.minor_to_major)} that "
                                f"is not a permutation of its dims", _where(comp, inst))


def verify_module(module: "Module", *, check_shapes: bool = True,
                  check_shardings: bool = True, check_computation_order: bool = True,
                  num_devices: int | None = None) -> None:
    """Raise VerifierError at the first inconsistency in ``module``; see the module doc.

    ``check_computation_order``: callees must precede callers in ``module.computations``
    (XLA rejects a proto otherwise; ``Module.sort_computations`` fixes it).
    ``num_devices``: also require shardings to use exactly that many devices.
    """
    where_m = f"module {module.name}"
    if module.entry is None:
        raise VerifierError("module has no entry computation", where_m)
    position: dict[int, int] = {}
    names: set[str] = set()
    ids: set[int] = set()
    for pos, comp in enumerate(module.computations):
        if id(comp) in position:
            raise VerifierError("computation is listed twice in the module", _where(comp))
        position[id(comp)] = pos
        if comp.name in names:
            raise VerifierError(f"duplicate computation name {comp.name!r}", _where(comp))
        names.add(comp.name)
        if comp.id in ids:
            raise VerifierError(f"duplicate computation id {comp.id}", _where(comp))
        ids.add(comp.id)
    if id(module.entry) not in position:
        raise VerifierError(f"entry computation {module.entry.name} is not in the module", where_m)

    state = _ModuleState(position, check_shapes, check_shardings, check_computation_order,
                         num_devices)
    for comp in module.computations:
        state.verify_computation(comp)


class _ModuleState:
    __slots__ = ("position", "names", "ids", "check_shapes", "check_shardings", "check_order",
                 "num_devices", "shapes_ok", "shardings_ok", "inferred", "matches")

    def __init__(self, position: dict[int, int], check_shapes: bool, check_shardings: bool,
                 check_order: bool, num_devices: int | None) -> None:
        self.position = position
        self.names: set[str] = set()
        self.ids: set[int] = set()
        self.check_shapes = check_shapes
        self.check_shardings = check_shardings
        self.check_order = check_order
        self.num_devices = num_devices
        # Shapes and shardings are immutable values shared by many instructions (one per
        # distinct proto on load): each distinct one is checked once. Keys hold the
        # objects, so an id is never reused during the run.
        self.shapes_ok: dict[int, Shape] = {}
        self.shardings_ok: dict[tuple[int, int], tuple] = {}
        # Most instructions repeat an (opcode, shapes, attributes read) key of another.
        self.inferred = InferenceMemo()
        # (inferred, declared) shape pairs found compatible, by identity (objects held).
        self.matches: dict[tuple[int, int], tuple[Shape, Shape]] = {}

    def verify_computation(self, comp: "Computation") -> None:
        insts = comp.instructions
        if not insts:
            raise VerifierError("computation has no instructions", _where(comp))
        # Instructions compare and hash by identity, so sets of them are identity sets
        # (a third of the cost of sets of ``id()``s, on every instruction of the module).
        members = set(insts)
        if len(members) != len(insts):
            seen: set = set()
            for inst in insts:
                if inst in seen:
                    raise VerifierError("instruction appears twice in the computation",
                                        _where(comp, inst))
                seen.add(inst)
        root = comp.root
        if root is None:
            raise VerifierError("computation has no root", _where(comp))
        if root not in members:
            raise VerifierError(f"root {root.name} is not an instruction of the computation",
                                _where(comp))

        names, ids = self.names, self.ids
        # Names and ids new and distinct, checked for the whole computation by C-level set
        # operations; only when that fails does the loop test them one by one (so the
        # error names the first offending instruction, after any earlier problem).
        batch_names = {inst.name for inst in insts}
        batch_ids = {inst.id for inst in insts}
        one_by_one = not (len(batch_names) == len(insts) == len(batch_ids)
                          and names.isdisjoint(batch_names) and ids.isdisjoint(batch_ids))
        if not one_by_one:
            names |= batch_names
            ids |= batch_ids
        add_name, add_id = names.add, ids.add
        comp_pos = self.position.get(id(comp), -1)
        param_numbers: dict[int, object] = {}
        defined: set = set()  # the instructions before the current one
        define = defined.add
        shapes_ok, matches, infer = self.shapes_ok, self.matches, self.inferred.infer
        check_shapes = self.check_shapes
        check_shardings = self.check_shardings
        shardings_ok = self.shardings_ok
        known, arities = KNOWN_OPCODES, ARITY
        valid_parameter = parameter_is_valid
        # One function naming the place, made once: asked (only on a failure) while
        # ``inst`` is the instruction being checked.
        where = lambda: _where(comp, inst)  # noqa: E731
        for inst in insts:
            opcode = inst.opcode
            if one_by_one:
                n_names = len(names)
                add_name(inst.name)
                if len(names) == n_names:
                    raise VerifierError(f"duplicate instruction name {inst.name!r}",
                                        _where(comp, inst))
                n_ids = len(ids)
                add_id(inst.id)
                if len(ids) == n_ids:
                    raise VerifierError(f"duplicate instruction id {inst.id}",
                                        _where(comp, inst))
            if inst.parent is not comp:
                other = inst.parent.name if inst.parent is not None else "no computation"
                raise VerifierError(f"instruction's parent is {other}", _where(comp, inst))
            if opcode not in known:
                raise VerifierError(f"unknown opcode {opcode!r}", _where(comp, inst))
            operands = inst.operands
            arity = arities.get(opcode)
            if arity is not None and len(operands) != arity:
                raise VerifierError(f"{opcode} takes {arity} operand(s), has {len(operands)}",
                                    _where(comp, inst))
            for o in operands:
                if o not in defined:
                    if o not in members:
                        raise VerifierError(f"operand {o.name} is not an instruction of this "
                                            f"computation", _where(comp, inst))
                    raise VerifierError(f"operand {o.name} is used before it is defined",
                                        _where(comp, inst))
            if inst.control_predecessors:
                for o in inst.control_predecessors:
                    if o not in defined:
                        raise VerifierError(f"control predecessor {o.name} is not defined "
                                            f"earlier in this computation", _where(comp, inst))
            define(inst)
            called = inst.called_computations
            if called:
                self._check_called(comp, comp_pos, inst)
            if opcode == "parameter":
                n = inst.attrs.parameter_number
                if n in param_numbers:
                    raise VerifierError(f"parameter number {n} is used twice",
                                        _where(comp, inst))
                param_numbers[n] = inst
            shape = inst.shape
            if id(shape) not in shapes_ok:
                _check_shape_value(shape, comp, inst)
                shapes_ok[id(shape)] = shape
            # A valid parameter's inferred shape is its declared one (the rule would only
            # return it): the rule runs when it would fail, and raises its error.
            if check_shapes and (opcode != "parameter" or not valid_parameter(len(operands), n)):
                try:
                    inferred = infer(opcode, [o.shape for o in operands], inst.attrs, called,
                                     shape, where)
                except VerifierError:
                    raise
                except (IndexError, KeyError, ValueError, TypeError) as e:
                    raise VerifierError(f"{opcode}: malformed attributes ({e})",
                                        _where(comp, inst)) from None
                if inferred is not shape and (id(inferred), id(shape)) not in matches:
                    if not inferred.compatible(shape):
                        raise VerifierError(f"shape {shape.to_text(False)} does not match the "
                                            f"inferred {inferred.to_text(False)}",
                                            _where(comp, inst))
                    matches[id(inferred), id(shape)] = (inferred, shape)
            if check_shardings and inst.sharding is not None:
                key = (id(inst.sharding), id(shape))
                if key not in shardings_ok:
                    self._check_sharding(comp, inst)
                    shardings_ok[key] = (inst.sharding, shape)
        if param_numbers and sorted(param_numbers) != list(range(len(param_numbers))):
            raise VerifierError(f"parameter numbers {sorted(param_numbers)} are not "
                                f"0..{len(param_numbers) - 1}", _where(comp))

    def _check_called(self, comp: "Computation", comp_pos: int, inst) -> None:
        called = inst.called_computations
        expected = CALLED_COUNT.get(inst.opcode, 0)
        if inst.opcode not in CALLED_COUNT:
            raise VerifierError(f"{inst.opcode} does not call computations but calls "
                                f"{', '.join(c.name for c in called)}", _where(comp, inst))
        if expected is not None and len(called) != expected:
            raise VerifierError(f"{inst.opcode} calls {expected} computation(s), has "
                                f"{len(called)}", _where(comp, inst))
        for c in called:
            pos = self.position.get(id(c))
            if pos is None:
                raise VerifierError(f"called computation {c.name} is not in the module",
                                    _where(comp, inst))
            if c is comp:
                raise VerifierError("instruction calls its own computation", _where(comp, inst))
            if self.check_order and pos > comp_pos:
                raise VerifierError(f"called computation {c.name} comes after its caller in "
                                    f"the module (callees must precede callers)",
                                    _where(comp, inst))

    def _check_sharding(self, comp: "Computation", inst) -> None:
        validate = getattr(inst.sharding, "validate_for_shape", None)
        if validate is None:
            return
        try:
            if inst.shape.is_tuple and not inst.sharding.is_tuple:
                # XLA reads a non-tuple sharding on a tuple as one per leaf (as
                # annotations.normalize does).
                for _, leaf in inst.shape.leaves():
                    validate(leaf, self.num_devices)
            else:
                validate(inst.shape, self.num_devices)
        except HloSpmdError as e:
            raise VerifierError(f"invalid sharding {inst.sharding}: {e.message}",
                                _where(comp, inst)) from None
