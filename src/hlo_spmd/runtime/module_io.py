"""Turning what the user gives us into ``HloModuleProto`` bytes, and small proto edits.

The runtime accepts a module as

* ``bytes`` - a serialized ``HloModuleProto`` (an XLA dump wrapper ``HloProto`` is
  unwrapped),
* ``str`` - HLO text in XLA's syntax (parsed by jaxlib),
* an ``os.PathLike`` - a ``.pb`` / ``.hlo`` file,
* a protobuf message (``hlo_pb2.HloModuleProto``) or any object with
  ``SerializeToString()`` / ``to_proto_bytes()``.

Proto edits use the project's own schema (:mod:`hlo_spmd.proto.hlo_pb2`); unknown fields
survive the round trip.

Note: XLA's HLO *text* cannot carry ``spmd_output_sharding`` /
``spmd_parameters_shardings`` (jaxlib 0.10.2's parser rejects those header attributes),
so a partitioned module given as text needs its global shardings passed explicitly, or
attached with :func:`with_spmd_shardings`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence, Union

import numpy as np

from hlo_spmd.errors import HloSpmdError, InputError

ModuleLike = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]", Any]


def _hlo_pb2():
    from hlo_spmd.proto import hlo_pb2

    return hlo_pb2


def _text_to_proto_bytes(text: str, where: str | None = None) -> bytes:
    from hlo_spmd.runtime._jax import load_jax

    hlo = load_jax().hlo
    try:
        return hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()
    except Exception as exc:  # jaxlib raises JaxRuntimeError (a RuntimeError)
        first = str(exc).strip().splitlines()
        raise InputError(
            "XLA could not parse the HLO text: " + " ".join(first[:4]), where
        ) from exc


def _unwrap(data: bytes, where: str | None) -> bytes:
    """Return ``HloModuleProto`` bytes, unwrapping an ``HloProto`` dump wrapper."""
    pb2 = _hlo_pb2()
    module = pb2.HloModuleProto()
    try:
        module.ParseFromString(data)
    except Exception:
        module = None
    if module is not None and len(module.computations) > 0:
        return data
    wrapper = pb2.HloProto()
    try:
        wrapper.ParseFromString(data)
    except Exception as exc:
        raise InputError("bytes are neither an HloModuleProto nor an HloProto", where) from exc
    if wrapper.HasField("hlo_module") and len(wrapper.hlo_module.computations) > 0:
        return wrapper.hlo_module.SerializeToString()
    raise InputError("module proto has no computations", where)


def to_proto_bytes(module: ModuleLike) -> bytes:
    """Serialized ``HloModuleProto`` for any accepted module form (see module docstring)."""
    if isinstance(module, (bytes, bytearray, memoryview)):
        return _unwrap(bytes(module), None)
    if isinstance(module, str):
        return _text_to_proto_bytes(module)
    if isinstance(module, os.PathLike):
        path = Path(module)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise InputError(f"cannot read module: {exc.strerror}", str(path)) from exc
        if path.suffix in (".hlo", ".txt") or data.lstrip().startswith(b"HloModule"):
            return _text_to_proto_bytes(data.decode("utf-8"), str(path))
        return _unwrap(data, str(path))
    for attr in ("to_proto_bytes", "SerializeToString"):
        method = getattr(module, attr, None)
        if callable(method):
            return _unwrap(bytes(method()), None)
    raise HloSpmdError(f"cannot use {type(module).__name__} as an HLO module")


def parse_module_proto(proto_bytes: bytes):
    """``hlo_pb2.HloModuleProto`` parsed from bytes."""
    pb2 = _hlo_pb2()
    module = pb2.HloModuleProto()
    module.ParseFromString(proto_bytes)
    return module


def read_spmd_shardings(proto_bytes: bytes):
    """``(parameter shardings or None, output sharding or None)`` as ``OpSharding`` messages.

    Reads ``HloModuleProto.spmd_parameters_shardings`` (field 14) and
    ``spmd_output_sharding`` (field 12).
    """
    module = parse_module_proto(proto_bytes)
    params = list(module.spmd_parameters_shardings) or None
    output = module.spmd_output_sharding if module.HasField("spmd_output_sharding") else None
    return params, output


def with_spmd_shardings(module: ModuleLike, param_shardings: Sequence[Any] | None,
                        output_sharding: Any | None) -> bytes:
    """Copy of ``module`` with fields 14 / 12 set from the given shardings.

    Each sharding may be anything :func:`hlo_spmd.runtime.slicing.as_sharding` accepts
    (project ``HloSharding``, XLA sharding text, ``OpSharding`` message). ``None``
    leaves the corresponding field unchanged.
    """
    from hlo_spmd.runtime.slicing import to_op_sharding

    proto = parse_module_proto(to_proto_bytes(module))
    if param_shardings is not None:
        del proto.spmd_parameters_shardings[:]
        for sharding in param_shardings:
            proto.spmd_parameters_shardings.add().CopyFrom(to_op_sharding(sharding))
    if output_sharding is not None:
        proto.spmd_output_sharding.CopyFrom(to_op_sharding(output_sharding))
    return proto.SerializeToString()


def strip_shardings(proto_bytes: bytes) -> bytes:
    """Copy with ``sharding`` cleared on every instruction and the spmd fields removed."""
    proto = parse_module_proto(proto_bytes)
    for computation in proto.computations:
        for instruction in computation.instructions:
            instruction.ClearField("sharding")
    proto.ClearField("spmd_output_sharding")
    proto.ClearField("spmd_parameters_shardings")
    return proto.SerializeToString()


def tile_form_shardings(proto_bytes: bytes) -> bytes:
    """Copy with every named (mesh-axis) sharding rewritten in the tile form, and mesh
    replica groups as device groups.

    The same values; for XLA passes that handle only the tile form (jaxlib 0.10.2's
    single-device compile of a manual region in named form fails a shape check).
    """
    from hlo_spmd.sharding.proto import from_proto, to_proto

    proto = parse_module_proto(proto_bytes)

    def tile(msg: Any) -> None:
        if msg.HasField("named_sharding") or any(e.HasField("named_sharding")
                                                 for e in msg.tuple_shardings):
            msg.CopyFrom(to_proto(from_proto(msg).without_named()))

    for computation in proto.computations:
        for instruction in computation.instructions:
            if instruction.HasField("sharding"):
                tile(instruction.sharding)
            if instruction.WhichOneof("replica_group_list") == "mesh_axes_replica_group_list":
                # Device groups: jaxlib's StableHLO import drops a mesh's device order.
                from hlo_spmd.ir.builder import set_replica_groups
                from hlo_spmd.ir.shape_inference import replica_groups
                set_replica_groups(instruction, replica_groups(instruction))
    if proto.HasField("spmd_output_sharding"):
        tile(proto.spmd_output_sharding)
    for msg in proto.spmd_parameters_shardings:
        tile(msg)
    return proto.SerializeToString()


def has_shardings(proto_bytes: bytes) -> bool:
    """True if any instruction carries a sharding."""
    proto = parse_module_proto(proto_bytes)
    return any(i.HasField("sharding") for c in proto.computations for i in c.instructions)


@dataclass(frozen=True)
class ArraySpec:
    """Shape and numpy dtype of one array parameter or result."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def __str__(self) -> str:
        return f"{self.dtype.name}[{','.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class Signature:
    """Entry computation signature: array parameters and flattened results."""

    parameters: tuple[ArraySpec, ...]
    results: tuple[ArraySpec, ...]
    result_is_tuple: bool


def _array_spec(shape, what: str) -> ArraySpec:
    if shape.is_tuple():
        raise HloSpmdError(f"{what} is a nested tuple; the runtime supports arrays only")
    if shape.is_token():
        raise HloSpmdError(f"{what} is a token; the runtime supports arrays only")
    return ArraySpec(tuple(int(d) for d in shape.dimensions()), np.dtype(shape.numpy_dtype()))


def entry_signature(module: ModuleLike) -> Signature:
    """Parameter and result shapes of the entry computation (tuple parameters and
    results flattened one level, as XLA's runtime passes them)."""
    from hlo_spmd.runtime._jax import load_jax

    proto_bytes = to_proto_bytes(module)
    xc = load_jax().xla_client
    try:
        program_shape = xc.XlaComputation(proto_bytes).program_shape()
    except Exception as exc:
        raise InputError(f"cannot read the entry signature: {exc}") from exc
    params: tuple[ArraySpec, ...] = ()
    for i, s in enumerate(program_shape.parameter_shapes()):
        # A tuple parameter (Shardy's tuple_args) is passed leaf by leaf: XLA's import
        # to StableHLO flattens it into one argument per leaf.
        params += tuple(_array_spec(leaf, f"parameter {i} element {j}")
                        for j, leaf in enumerate(s.tuple_shapes())) if s.is_tuple() else \
            (_array_spec(s, f"parameter {i}"),)
    result = program_shape.result_shape()
    if result.is_tuple():
        leaves = tuple(
            _array_spec(s, f"result {i}") for i, s in enumerate(result.tuple_shapes())
        )
        return Signature(params, leaves, True)
    return Signature(params, (_array_spec(result, "result"),), False)


def _is_manual(op_sharding) -> bool:
    from hlo_spmd.proto import xla_data_pb2

    if op_sharding.type == xla_data_pb2.OpSharding.MANUAL:
        return True
    if op_sharding.type == xla_data_pb2.OpSharding.TUPLE:
        return len(op_sharding.tuple_shardings) > 0 and all(
            _is_manual(s) for s in op_sharding.tuple_shardings)
    return False


def non_manual_entry_values(proto_bytes: bytes) -> list[str]:
    """Entry parameters / root that do not carry ``sharding={manual}`` (names).

    A per-device program must mark them manual; otherwise XLA, compiling with
    ``use_spmd_partitioning=True``, would partition the program a second time.
    """
    proto = parse_module_proto(proto_bytes)
    entry = None
    for computation in proto.computations:
        if (proto.entry_computation_id and computation.id == proto.entry_computation_id) or (
                not proto.entry_computation_id
                and computation.name == proto.entry_computation_name):
            entry = computation
    if entry is None:
        if not proto.computations:
            raise InputError("module has no computations")
        entry = proto.computations[-1]
    bad = []
    for instruction in entry.instructions:
        is_param = instruction.opcode == "parameter"
        is_root = instruction.id == entry.root_id
        if (is_param or is_root) and not (
                instruction.HasField("sharding") and _is_manual(instruction.sharding)):
            bad.append(("root " if is_root else "parameter ") + instruction.name)
    return bad
