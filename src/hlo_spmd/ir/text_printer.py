"""HLO text printer: the long form XLA prints with ``HloPrintOptions`` defaults
(``%`` name prefixes, layouts on instruction shapes, no operand shapes, metadata, full
constants when ``print_large_constants``) -- what jaxlib's ``HloModule.to_string``
produces for the same module.

Layout of the output, as in XLA's HloModule::Print::

    HloModule <name>[, is_scheduled=true][, input_output_alias={ ... }]
        [, buffer_donor={ ... }], entry_computation_layout={(...)->...}
        [, <config>][, frontend_attributes={...}]
    [FileNames / FunctionNames / FileLocations / StackFrames tables]

    %callee (p: f32[]) -> f32[] {
      %p = f32[] parameter(0)
      ROOT ...
    }

    ENTRY %main (...) -> ... {
      ...
    }

Computations come in XLA's DFS post order (callees first), instructions in XLA's
post order from the roots (or the module schedule).  Attributes follow
``PrintExtraAttributesImpl`` of each opcode, then called computations, ``sharding``,
``frontend_attributes``, ``control-predecessors``, ``statistics``, ``result_accuracy``,
``origin``, ``metadata`` and ``backend_config``.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from hlo_spmd.ir import text_attrs as A
from hlo_spmd.ir.comparison import default_order
from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.literal import format_literal, format_literal_with_shape
from hlo_spmd.ir.module import Module
from hlo_spmd.ir.opcodes import (ASYNC_CHAIN_LATER, ASYNC_WRAPPERS, JAXLIB_ARITY,
                                 RESULT_ACCURACY, SYNC_COLLECTIVES, TO_APPLY, TRAITS)
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.ir.text_lexer import c_escape, lexes_as_json_dict
from hlo_spmd.ir.text_shapes import _tuple_text, format_shape, format_shape_proto
from hlo_spmd.proto import hlo_pb2, xla_data_pb2

__all__ = ["print_module", "print_computation", "print_instruction", "ModuleConfig"]

# Unary opcodes that carry a ResultAccuracy (printed only when not DEFAULT).
RESULT_ACCURACY_OPCODES = RESULT_ACCURACY
# Collectives whose channel ids tie them together in XLA's post order
# (HloComputation::ComputeChannelDependencies: the synchronous ones it knows).
_CHANNEL_DEP_OPCODES = frozenset(SYNC_COLLECTIVES & JAXLIB_ARITY.keys())
_TO_APPLY_OPCODES = TO_APPLY


class ModuleConfig(dict):
    """HloModuleConfig fields XLA prints in the header and HloModuleProto cannot hold:
    ``replica_count``, ``num_partitions``, ``alias_passthrough_params``,
    ``allow_spmd_sharding_propagation_to_parameters`` / ``..._to_output`` (bool lists).
    """


def _config_of(module: Module, config: dict | None) -> dict:
    if config is not None:
        return config
    return getattr(module, "config", None) or {}


class _Printer:
    def __init__(self, module: Module | None, print_large_constants: bool,
                 print_metadata: bool) -> None:
        self.module = module
        self.large = print_large_constants
        self.metadata = print_metadata
        self._shape_cache: dict[int, str] = {}

    # -- pieces ----------------------------------------------------------------------------
    def shape(self, shape) -> str:
        key = id(shape)
        s = self._shape_cache.get(key)
        if s is None:
            s = format_shape(shape)
            self._shape_cache[key] = s
        return s

    def sharding_text(self, sharding: Any) -> str:
        to_string = getattr(sharding, "to_string", None)
        if to_string is not None:
            return to_string(self.metadata)
        return str(sharding)

    def op_sharding_text(self, proto: xla_data_pb2.OpSharding) -> str:
        from hlo_spmd.sharding.proto import from_proto  # the sharding package owns this

        return self.sharding_text(from_proto(proto))

    # -- instructions ----------------------------------------------------------------------
    def instruction(self, inst: Instruction) -> str:
        a = inst.attrs
        op = inst.opcode
        op_text = op
        if op in _ASYNC_OPCODES:
            wrapped = sugared_async_root(inst)
            if wrapped is not None:
                op_text = wrapped.opcode + _ASYNC_SUFFIX[op]
        parts = ["%", inst.name, " = ", self.shape(inst.shape), " ", op_text, "("]
        if op == "parameter":
            parts.append(str(a.parameter_number))
        elif op == "constant":
            parts.append(self.constant_text(inst))
        else:
            ops = inst.operands
            for i, o in enumerate(ops):
                if i:
                    parts.append(", /*index=%d*/%%" % i if i % 5 == 0 else ", %")
                else:
                    parts.append("%")
                parts.append(o.name)
        parts.append(")")
        attrs: list[str] = []
        self.extra_attributes(inst, attrs)
        self.tail(inst, attrs)
        if attrs:
            parts.append(", ")
            parts.append(", ".join(attrs))
        return "".join(parts)

    def constant_text(self, inst: Instruction) -> str:
        a = inst.attrs
        if not a.HasField("literal"):
            return "{...}"
        shape = inst.shape
        if self.large or (shape.is_array and shape.num_elements <= 10):
            return format_literal(a.literal)
        return "{...}"

    def extra_attributes(self, inst: Instruction, out: list[str]) -> None:
        """XLA's PrintExtraAttributes: opcode attributes, called computations, sharding,
        frontend attributes, control predecessors, statistics, result accuracy."""
        op = inst.opcode
        sugared = None
        if op == "async-start":
            a = inst.attrs
            if a.async_execution_thread and a.async_execution_thread != "main":
                out.append(f'async_execution_thread="{a.async_execution_thread}"')
            sugared = sugared_async_root(inst)
            if sugared is not None:
                self.extra_attributes(sugared, out)
        else:
            fn = _OPCODE_ATTRS.get(op)
            if fn is not None:
                fn(self, inst, out)
        if sugared is None:
            self.called(inst, out)
        self.generic(inst, out)

    def called(self, inst: Instruction, out: list[str]) -> None:
        comps = inst.called_computations
        op = inst.opcode
        if op == "while":
            # XLA's order in called_computations: body (0), condition (1).
            if len(comps) >= 2:
                out.append("condition=%" + comps[1].name)
                out.append("body=%" + comps[0].name)
        elif op == "select-and-scatter":
            if len(comps) >= 2:
                out.append("select=%" + comps[0].name)
                out.append("scatter=%" + comps[1].name)
        elif op == "conditional":
            if inst.operands and inst.operands[0].shape.element_type == PrimitiveType.PRED \
                    and len(comps) == 2:
                out.append("true_computation=%" + comps[0].name)
                out.append("false_computation=%" + comps[1].name)
            else:
                out.append("branch_computations={" + ", ".join("%" + c.name for c in comps) + "}")
        elif op in _TO_APPLY_OPCODES:
            if comps:
                out.append("to_apply=%" + comps[0].name)
            if op == "call" and inst.attrs.is_composite:
                out.append("is_composite=true")
        elif op == "custom-call":
            if comps:
                out.append("called_computations={" + ", ".join("%" + c.name for c in comps) + "}")
        elif op in ASYNC_WRAPPERS:
            if op == "async-start" and comps:
                out.append("calls=%" + comps[0].name)
        elif comps:
            out.append("calls=" + ", ".join("%" + c.name for c in comps))

    def generic(self, inst: Instruction, out: list[str]) -> None:
        a = inst.attrs
        if inst.sharding is not None:
            out.append("sharding=" + self.sharding_text(inst.sharding))
        if len(a.frontend_attributes.map):
            out.append("frontend_attributes=" + A.frontend_attributes_text(a.frontend_attributes))
        if inst.control_predecessors:
            out.append("control-predecessors={" +
                       ", ".join("%" + p.name for p in inst.control_predecessors) + "}")
        if len(a.statistics_viz.statistics):
            out.append("statistics=" + A.statistics_text(a.statistics_viz))
        if inst.opcode in RESULT_ACCURACY_OPCODES and a.HasField("result_accuracy"):
            ra = A.result_accuracy_text(a.result_accuracy)
            if ra is not None:
                out.append("result_accuracy=" + ra)

    def tail(self, inst: Instruction, out: list[str]) -> None:
        a = inst.attrs
        if a.HasField("original_value"):
            out.append("origin={" + A.original_value_text(a.original_value) + "}")
        if self.metadata and A.metadata_is_printed(a.metadata):
            out.append("metadata={" + A.metadata_text(a.metadata) + "}")
        if a.backend_config:
            config = a.backend_config.decode("utf-8", errors="surrogateescape")
            if lexes_as_json_dict(config):
                out.append("backend_config=" + config)
            else:
                out.append('backend_config="' + c_escape(a.backend_config) + '"')

    # -- computations ------------------------------------------------------------------------
    def computation(self, comp: Computation, entry: bool, order: list[Instruction],
                    keep: Callable[[Instruction], bool] | None = None) -> str:
        params = comp.parameters
        sig = ", ".join(f"{p.name}: {format_shape(p.shape, False)}" for p in params)
        result = format_shape(comp.root.shape, False) if comp.root is not None else "()"
        lines = [("ENTRY %" if entry else "%") + comp.name + f" ({sig}) -> {result} {{"]
        root = comp.root
        for inst in order:
            if keep is not None and not keep(inst):
                continue
            lines.append(("  ROOT " if inst is root else "  ") + self.instruction(inst))
        tail = "}"
        if comp.execution_thread and comp.execution_thread != "main":
            tail += f', execution_thread="{comp.execution_thread}"'
        lines.append(tail)
        return "\n".join(lines)


# -- per-opcode extra attributes (XLA's PrintExtraAttributesImpl) -----------------------------
def _dims(p: _Printer, inst: Instruction, out: list[str]) -> None:
    out.append("dimensions=" + A.int_list(inst.attrs.dimensions))


def _sort(p: _Printer, inst: Instruction, out: list[str]) -> None:
    out.append("dimensions=" + A.int_list(inst.attrs.dimensions))
    if inst.attrs.is_stable:
        out.append("is_stable=true")


def _reshape(p: _Printer, inst: Instruction, out: list[str]) -> None:
    d = inst.attrs.dimensions
    if len(d) and d[0] != -1:
        out.append(f"inferred_dimension={d[0]}")


def _iota(p: _Printer, inst: Instruction, out: list[str]) -> None:
    d = inst.attrs.dimensions
    out.append(f"iota_dimension={d[0] if len(d) else 0}")


def _single_dim(p: _Printer, inst: Instruction, out: list[str]) -> None:
    d = inst.attrs.dimensions
    out.append("dimensions={" + (str(d[0]) if len(d) else "0") + "}")


def _slice(p: _Printer, inst: Instruction, out: list[str]) -> None:
    out.append("slice=" + A.slice_text(inst.attrs.slice_dimensions))


def _gte(p: _Printer, inst: Instruction, out: list[str]) -> None:
    out.append(f"index={inst.attrs.tuple_index}")


def _parameter(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    if a.HasField("parameter_replication"):
        out.append("parameter_replication={" + ",".join(
            "true" if b else "false" for b in a.parameter_replication.replicated_at_leaf_buffers)
            + "}")


def _compare(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    out.append("direction=" + a.comparison_direction)
    if a.comparison_order and inst.operands:
        # Newer XLA's spelling, kept when the module came with it; printed, like XLA
        # does, only when it is not the element type's default.
        if a.comparison_order != default_order(inst.operands[0].shape.element_type):
            out.append("order=" + a.comparison_order)
    elif a.comparison_type and inst.operands:
        if a.comparison_type != A.default_comparison_type(inst.operands[0].shape.element_type):
            out.append("type=" + a.comparison_type)


def _channel(a: hlo_pb2.HloInstructionProto, out: list[str]) -> None:
    if a.channel_id > 0:
        out.append(f"channel_id={a.channel_id}")


def _collective_base(a: hlo_pb2.HloInstructionProto, out: list[str]) -> None:
    _channel(a, out)
    out.append("replica_groups=" + A.replica_groups_text(a))
    if a.constrain_layout:
        out.append("constrain_layout=true")


def _all_gather(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    _collective_base(a, out)
    out.append("dimensions={" + (str(a.dimensions[0]) if len(a.dimensions) else "0") + "}")
    if a.use_global_device_ids:
        out.append("use_global_device_ids=true")


def _all_reduce(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    _collective_base(a, out)
    if a.use_global_device_ids:
        out.append("use_global_device_ids=true")


def _reduce_scatter(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    _all_reduce(p, inst, out)
    out.append("dimensions={" + (str(a.dimensions[0]) if len(a.dimensions) else "0") + "}")


def _all_to_all(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    _collective_base(a, out)
    if len(a.dimensions):
        out.append("dimensions={" + str(a.dimensions[0]) + "}")


def _collective_plain(p: _Printer, inst: Instruction, out: list[str]) -> None:
    _collective_base(inst.attrs, out)


def _collective_permute(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    _channel(a, out)
    out.append("source_target_pairs=" + A.source_target_pairs_text(a.source_target_pairs))
    if len(a.dynamic_slice_sizes):
        rank = inst.operands[0].shape.rank if inst.operands and inst.operands[0].shape.is_array \
            else len(a.dynamic_slice_sizes)
        sizes = list(a.dynamic_slice_sizes)
        rank = rank or len(sizes)
        groups = [sizes[i:i + rank] for i in range(0, len(sizes), rank)]
        out.append("slice_sizes={" + ",".join(A.int_list(g) for g in groups) + "}")


def _send_recv(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    _channel(a, out)
    if a.is_host_transfer:
        out.append("is_host_transfer=true")


def _window_only(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    if len(a.window.dimensions):
        out.append("window=" + A.window_text(a.window))


def _convolution(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    if len(a.window.dimensions):
        out.append("window=" + A.window_text(a.window))
    out.append("dim_labels=" + A.dim_labels_text(a.convolution_dimension_numbers))
    if a.feature_group_count not in (0, 1):
        out.append(f"feature_group_count={a.feature_group_count}")
    if a.batch_group_count not in (0, 1):
        out.append(f"batch_group_count={a.batch_group_count}")
    if a.conv_kind:
        out.append("convolution_kind=" + A.CONV_KIND_NAMES.get(a.conv_kind, "unset"))
    out.extend(A.precision_attrs(a.precision_config))
    _scaling_and_sparsity(a, out)


def _scaling_and_sparsity(a: hlo_pb2.HloInstructionProto, out: list[str]) -> None:
    """sparsity_config, then (newer XLA) block_scaling_config, each only when it has a side."""
    if a.HasField("sparsity_config") and A.has_sides(a.sparsity_config):
        out.append("sparsity_config={" + A.sparsity_config_text(a.sparsity_config) + "}")
    if a.HasField("block_scaling_config") and A.has_sides(a.block_scaling_config):
        out.append("block_scaling_config={"
                   + A.block_scaling_config_text(a.block_scaling_config) + "}")


def _dot(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    out.extend(A.dot_dims_attrs(a.dot_dimension_numbers))
    out.extend(A.precision_attrs(a.precision_config))
    _scaling_and_sparsity(a, out)
    # (XLA no longer prints or parses the deprecated dot_sparsity descriptors.)


def _shuffle(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    out.append("dimensions=" + A.int_list(a.dimensions))
    if a.shuffle_mode.WhichOneof("mode") == "rotate":
        out.append("mode=rotate")
        out.append("shifts=" + A.int_list(a.shuffle_mode.rotate.shifts))


def _collective_broadcast(p: _Printer, inst: Instruction, out: list[str]) -> None:
    _collective_base(inst.attrs, out)
    if inst.attrs.has_dynamic_root:  # newer XLA's attribute: only when set (older XLA parses)
        out.append("has_dynamic_root=true")


def _collective_reduce(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    _collective_base(a, out)
    out.append("has_dynamic_root=" + ("true" if a.has_dynamic_root else "false"))


def _ragged_dot(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    r = a.ragged_dot_dimension_numbers
    out.extend(A.dot_dims_attrs(r.dot_dimension_numbers))
    if len(r.lhs_ragged_dimensions):
        out.append("lhs_ragged_dims=" + A.int_list(r.lhs_ragged_dimensions))
    if len(r.rhs_group_dimensions):
        out.append("rhs_group_dims=" + A.int_list(r.rhs_group_dimensions))
    out.extend(A.precision_attrs(a.precision_config))


def _custom_call(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    if a.HasField("window"):
        out.append("window=" + A.window_text(a.window))
    if a.HasField("convolution_dimension_numbers"):
        out.append("dim_labels=" + A.dim_labels_text(a.convolution_dimension_numbers))
    if a.feature_group_count not in (0, 1):
        out.append(f"feature_group_count={a.feature_group_count}")
    if a.batch_group_count not in (0, 1):
        out.append(f"batch_group_count={a.batch_group_count}")
    out.extend(A.precision_attrs(a.precision_config))
    if a.padding_type:
        out.append("padding_type=" + xla_data_pb2.PaddingType.Name(a.padding_type))
    out.append('custom_call_target="' + c_escape(a.custom_call_target) + '"')
    if a.constrain_layout:
        out.append("operand_layout_constraints={" + ", ".join(
            format_shape_proto(s) for s in a.operand_shapes_with_layout) + "}")
    if a.custom_call_has_side_effect:
        out.append("custom_call_has_side_effect=true")
    if a.HasField("literal"):
        out.append("literal=" + format_literal_with_shape(a.literal, format_shape_proto))
    if len(a.output_operand_aliasing):
        out.append("output_to_operand_aliasing=" +
                   A.instruction_aliasing_text(a.output_operand_aliasing))
    if a.custom_call_schedule:
        out.append("schedule=" + hlo_pb2.CustomCallSchedule.Name(a.custom_call_schedule))
    if a.custom_call_api_version != hlo_pb2.API_VERSION_ORIGINAL:
        out.append("api_version=" + hlo_pb2.CustomCallApiVersion.Name(a.custom_call_api_version))


def _fusion(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    out.append("kind=" + (a.fusion_kind or "kLoop"))
    if len(a.output_operand_aliasing):
        out.append("output_to_operand_aliasing=" +
                   A.instruction_aliasing_text(a.output_operand_aliasing))


def _copy_start(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    if a.HasField("cross_program_prefetch_index"):
        out.append(f"cross_program_prefetch_index={a.cross_program_prefetch_index}")


def _pad(p: _Printer, inst: Instruction, out: list[str]) -> None:
    out.append("padding=" + A.padding_text(inst.attrs.padding_config))


def _dynamic_slice(p: _Printer, inst: Instruction, out: list[str]) -> None:
    out.append("dynamic_slice_sizes=" + A.int_list(inst.attrs.dynamic_slice_sizes))


def _gather(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    out.append(A.gather_dims_text(a.gather_dimension_numbers))
    out.append("slice_sizes=" + A.int_list(a.gather_slice_sizes))
    if a.indices_are_sorted:
        out.append("indices_are_sorted=true")


def _scatter(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    out.append(A.scatter_dims_text(a.scatter_dimension_numbers))
    if a.indices_are_sorted:
        out.append("indices_are_sorted=true")
    if a.unique_indices:
        out.append("unique_indices=true")


def _fft(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    out.append("fft_type=" + xla_data_pb2.FftType.Name(a.fft_type))
    out.append("fft_length=" + A.int_list(a.fft_length))


def _batch_norm(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    out.append("epsilon=" + A._absl_double(a.epsilon))
    out.append(f"feature_index={a.feature_index}")


def _triangular_solve(p: _Printer, inst: Instruction, out: list[str]) -> None:
    out.extend(A.triangular_solve_attrs(inst.attrs.triangular_solve_options))


def _cholesky(p: _Printer, inst: Instruction, out: list[str]) -> None:
    if inst.attrs.cholesky_options.lower:
        out.append("lower=true")


def _topk(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    out.append(f"k={a.k}")
    out.append("largest=" + ("true" if a.largest else "false"))
    if a.is_stable:  # newer XLA's attribute: printed only when set, so older XLA parses
        out.append("is_stable=true")


def _rng(p: _Printer, inst: Instruction, out: list[str]) -> None:
    out.append("distribution=" + A.lower_enum_name(xla_data_pb2.RandomDistribution,
                                                   inst.attrs.distribution))


def _rng_bit_generator(p: _Printer, inst: Instruction, out: list[str]) -> None:
    out.append("algorithm=" + A.lower_enum_name(xla_data_pb2.RandomAlgorithm,
                                                inst.attrs.rng_algorithm))


def _rng_state(p: _Printer, inst: Instruction, out: list[str]) -> None:
    out.append(f"delta={inst.attrs.delta}")


def _reduce_precision(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    out.append(f"exponent_bits={a.exponent_bits}")
    out.append(f"mantissa_bits={a.mantissa_bits}")


def _infeed(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    if a.infeed_config:
        out.append('infeed_config="' + c_escape(a.infeed_config) + '"')


def _outfeed(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    if a.HasField("outfeed_shape"):
        out.append("outfeed_shape=" + format_shape_proto(a.outfeed_shape))
    elif inst.operands:
        out.append("outfeed_shape=" + format_shape(inst.operands[0].shape))
    if a.outfeed_config:
        out.append('outfeed_config="' + c_escape(a.outfeed_config) + '"')


def _domain(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    if a.HasField("domain_entry_sharding") and a.HasField("domain_exit_sharding"):
        # XLA prints the user side (proto exit) as entry= and the operand side as exit=.
        out.append('domain={kind="sharding", entry=' + p.op_sharding_text(a.domain_exit_sharding)
                   + ", exit=" + p.op_sharding_text(a.domain_entry_sharding) + "}")


def _scan(p: _Printer, inst: Instruction, out: list[str]) -> None:
    a = inst.attrs
    out.append("dimensions=" + A.int_list(a.dimensions))
    out.append(f"num_carries={a.num_carries}")
    if a.is_reverse:
        out.append("is_reverse=true")
    if a.is_associative == hlo_pb2.TRI_STATE_TRUE:
        out.append("is_associative=true")
    elif a.is_associative == hlo_pb2.TRI_STATE_FALSE:
        out.append("is_associative=false")


_OPCODE_ATTRS: dict[str, Callable[[_Printer, Instruction, list[str]], None]] = {
    "batch-norm-training": _batch_norm, "batch-norm-inference": _batch_norm,
    "batch-norm-grad": _batch_norm,
    "fft": _fft,
    "copy-start": _copy_start,
    "compare": _compare,
    "triangular-solve": _triangular_solve,
    "cholesky": _cholesky,
    "topk": _topk,
    "send": _send_recv, "send-done": _send_recv, "recv": _send_recv, "recv-done": _send_recv,
    "all-gather": _all_gather, "all-gather-start": _all_gather,
    "all-reduce": _all_reduce, "all-reduce-start": _all_reduce,
    "reduce-scatter": _reduce_scatter,
    "all-to-all": _all_to_all,
    "ragged-all-to-all": _collective_plain,
    "collective-broadcast": _collective_broadcast,
    "collective-permute": _collective_permute, "collective-permute-start": _collective_permute,
    "reverse": _dims, "concatenate": _dims, "reduce": _dims, "transpose": _dims,
    "broadcast": _dims, "map": _dims,
    "sort": _sort,
    "reshape": _reshape,
    "slice": _slice,
    "fusion": _fusion,
    "rng": _rng,
    "rng-bit-generator": _rng_bit_generator,
    "rng-get-and-update-state": _rng_state,
    "parameter": _parameter,
    "get-tuple-element": _gte,
    "reduce-precision": _reduce_precision,
    "infeed": _infeed,
    "outfeed": _outfeed,
    "convolution": _convolution,
    "reduce-window": _window_only, "select-and-scatter": _window_only,
    "custom-call": _custom_call,
    "pad": _pad,
    "dynamic-slice": _dynamic_slice,
    "gather": _gather,
    "scatter": _scatter,
    "iota": _iota,
    "dot": _dot, "scaled-dot": _dot,
    "shuffle": _shuffle, "collective-reduce": _collective_reduce,
    "ragged-dot": _ragged_dot,
    "domain": _domain,
    "get-dimension-size": _single_dim, "set-dimension-size": _single_dim,
    "scan": _scan,
}


# -- async syntax sugar --------------------------------------------------------------------------
_ASYNC_OPCODES = ASYNC_WRAPPERS
_ASYNC_SUFFIX = {op: "-" + TRAITS[op].async_stage for op in ASYNC_WRAPPERS}


def _can_expand(comp: Computation) -> bool:
    root = comp.root
    return root is not None and all(i is root or i.opcode == "parameter" for i in comp.instructions)


def sugared_async_root(inst: Instruction) -> Instruction | None:
    """The wrapped instruction XLA prints in place of an async op (``foo-start``), if any."""
    start = inst
    seen = 0
    while start.opcode in ASYNC_CHAIN_LATER and start.operands and seen < 1000:
        start = start.operands[0]
        seen += 1
    if start.opcode != "async-start" or not start.called_computations:
        return None
    comp = start.called_computations[0]
    return comp.root if _can_expand(comp) else None


def _sugared_async_computations(module: Module) -> set[int]:
    out: set[int] = set()
    for comp in module.computations:
        for inst in comp.instructions:
            if inst.opcode == "async-start" and inst.called_computations:
                callee = inst.called_computations[0]
                if _can_expand(callee):
                    out.add(id(callee))
    return out


# -- orders ------------------------------------------------------------------------------------
def _channel_dependencies(comp: Computation) -> dict[int, list[Instruction]]:
    groups: dict[int, list[Instruction]] = {}
    deps: dict[int, list[Instruction]] = {}
    for inst in comp.instructions:
        if inst.opcode in _CHANNEL_DEP_OPCODES:
            ch = inst.attrs.channel_id
            if ch > 0:
                group = groups.setdefault(ch, [])
                deps[id(inst)] = list(group)
                group.append(inst)
    return deps


def _id_order(comp: Computation) -> list[Instruction]:
    """The instruction list XLA builds from a proto: sorted by instruction id."""
    insts = comp.instructions
    for a, b in zip(insts, insts[1:]):
        if a.id > b.id:
            return sorted(insts, key=lambda i: i.id)
    return insts


def instruction_post_order(comp: Computation, channel_deps: bool = True) -> list[Instruction]:
    """XLA's ForEachInstructionPostOrder: DFS from every user-less instruction in order."""
    insts = _id_order(comp)
    has_user: set[int] = set()
    for inst in insts:
        for o in inst.operands:
            has_user.add(id(o))
    deps = _channel_dependencies(comp) if channel_deps else {}
    state: dict[int, int] = {}  # 1 visiting, 2 visited
    order: list[Instruction] = []
    for start in insts:
        if id(start) in has_user or state.get(id(start)) == 2:
            continue
        stack = [start]
        while stack:
            cur = stack[-1]
            key = id(cur)
            st = state.get(key)
            if st is None:
                state[key] = 1
            else:
                stack.pop()
                if st != 2:
                    state[key] = 2
                    order.append(cur)
                continue
            if deps and cur is not start:
                for d in deps.get(key, ()):
                    if state.get(id(d)) != 2:
                        stack.append(d)
            for o in reversed(cur.operands):
                if state.get(id(o)) != 2:
                    stack.append(o)
            for c in cur.control_predecessors:
                if state.get(id(c)) != 2:
                    stack.append(c)
    if len(order) != len(insts):
        # Instructions unreachable from any user-less one (a cycle): keep list order.
        seen = {id(i) for i in order}
        order.extend(i for i in insts if id(i) not in seen)
    return order


def _scheduled_order(module: Module, comp: Computation) -> list[Instruction] | None:
    attrs = module.attrs
    if attrs is None or not attrs.HasField("schedule"):
        return None
    seq = attrs.schedule.sequences.get(comp.id)
    if seq is None:
        return None
    by_id = {i.id: i for i in comp.instructions}
    ids = list(seq.instruction_ids)
    if len(ids) != len(by_id) or any(i not in by_id for i in ids):
        return None
    return [by_id[i] for i in ids]


def computation_post_order(module: Module) -> list[Computation]:
    """XLA's MakeComputationPostOrder(dfs_postorder=true)."""
    comps = sorted(module.computations, key=lambda c: c.id)
    called: set[int] = set()
    for c in comps:
        for inst in c.instructions:
            for cc in inst.called_computations:
                called.add(id(cc))
    added: set[int] = set()
    order: list[Computation] = []
    for comp in comps:
        if id(comp) in called:
            continue
        for emb in _embedded_computations(comp):
            if id(emb) not in added:
                added.add(id(emb))
                order.append(emb)
        if id(comp) not in added:
            added.add(id(comp))
            order.append(comp)
    for comp in comps:  # unreachable cycles: keep them printable
        if id(comp) not in added:
            added.add(id(comp))
            order.append(comp)
    return order


def _embedded_computations(comp: Computation) -> list[Computation]:
    visited: set[int] = set()
    post: list[Computation] = []
    stack: list[list] = []

    def process(called: Iterable[Computation]) -> None:
        for c in reversed(list(called)):
            if id(c) not in visited:
                visited.add(id(c))
                stack.append([c, 0])

    lists: dict[int, list[Instruction]] = {}
    for inst in _id_order(comp):
        if not inst.called_computations:
            continue
        process(inst.called_computations)
        while stack:
            top = stack[-1]
            c, i = top
            insts = lists.get(id(c))
            if insts is None:
                insts = lists[id(c)] = _id_order(c)
            if i == len(insts):
                stack.pop()
                post.append(c)
            else:
                top[1] = i + 1
                nxt = insts[i]
                if nxt.called_computations:
                    process(nxt.called_computations)
    return post


# -- module ------------------------------------------------------------------------------------
def _entry_layout_text(module: Module) -> str:
    entry = module.entry
    attrs = module.attrs
    params = entry.parameters
    if attrs is not None and attrs.HasField("host_program_shape"):
        hps = attrs.host_program_shape
        from hlo_spmd.ir.proto_io import shape_from_proto

        ok = len(hps.parameters) == len(params) and hps.HasField("result")
        if ok:
            try:
                ok = all(shape_from_proto(s).compatible(p.shape) for s, p in zip(hps.parameters, params)) \
                    and shape_from_proto(hps.result).compatible(entry.root.shape)
            except Exception:  # noqa: BLE001 - unknown element types etc.
                ok = False
        if ok:
            return (_tuple_text([format_shape_proto(s) for s in hps.parameters]) + "->" +
                    format_shape_proto(hps.result))
    return (_tuple_text([format_shape(p.shape) for p in params]) + "->" +
            format_shape(entry.root.shape))


def _stack_frames_text(sfi: hlo_pb2.StackFrameIndexProto) -> str:
    out = ["\n\nFileNames\n"]
    for i, f in enumerate(sfi.file_names):
        out.append(f'{i + 1} "{c_escape(f)}"\n')
    out.append("\nFunctionNames\n")
    for i, f in enumerate(sfi.function_names):
        out.append(f'{i + 1} "{c_escape(f)}"\n')
    out.append("\nFileLocations\n")
    for i, fl in enumerate(sfi.file_locations):
        out.append(f"{i + 1} {{file_name_id={fl.file_name_id} function_name_id={fl.function_name_id}"
                   f" line={fl.line} end_line={fl.end_line} column={fl.column}"
                   f" end_column={fl.end_column}}}\n")
    out.append("\nStackFrames\n")
    for i, sf in enumerate(sfi.stack_frames):
        # XLA prints the parent id plus one (and its parser subtracts one again).
        out.append(f"{i + 1} {{file_location_id={sf.file_location_id}"
                   f" parent_frame_id={sf.parent_frame_id + 1}}}\n")
    return "".join(out)


def _header(module: Module, config: dict, print_metadata: bool) -> str:
    attrs = module.attrs
    h = ["HloModule ", module.name]
    if attrs is not None and attrs.HasField("schedule"):
        h.append(", is_scheduled=true")
    if attrs is not None and len(attrs.input_output_alias.entries):
        h.append(", input_output_alias={ " + A.module_aliasing_text(attrs.input_output_alias) + " }")
    if attrs is not None and len(attrs.buffer_donor.entries):
        h.append(", buffer_donor={ " + A.buffer_donor_text(attrs.buffer_donor) + " }")
    if config.get("alias_passthrough_params"):
        h.append(", alias_passthrough_params=true")
    if module.entry is not None and module.entry.root is not None:
        h.append(", entry_computation_layout={" + _entry_layout_text(module) + "}")
    for key in ("allow_spmd_sharding_propagation_to_parameters",
                "allow_spmd_sharding_propagation_to_output"):
        v = config.get(key)
        if v is not None:
            v = list(v) if isinstance(v, (list, tuple)) else [bool(v)]
            if len(v) != 1 or v[-1]:
                h.append(f", {key}={{" + ",".join("true" if b else "false" for b in v) + "}")
    if config.get("replica_count", 1) != 1:
        h.append(f", replica_count={config['replica_count']}")
    if config.get("num_partitions", 1) != 1:
        h.append(f", num_partitions={config['num_partitions']}")
    if attrs is not None and len(attrs.frontend_attributes.map):
        h.append(", frontend_attributes=" + A.frontend_attributes_text(attrs.frontend_attributes))
    if print_metadata and attrs is not None and attrs.HasField("stack_frame_index") and (
            len(attrs.stack_frame_index.stack_frames) or len(attrs.stack_frame_index.file_names)):
        h.append(_stack_frames_text(attrs.stack_frame_index))
    return "".join(h)


def _keep_filter(only: Any) -> Callable[[Instruction], bool] | None:
    if only is None:
        return None
    if callable(only):
        return only
    names = set(only)
    return lambda inst: inst.name in names


def print_module(module: Module, *, print_large_constants: bool = True,
                 print_metadata: bool = True, only: Any = None,
                 config: dict | None = None) -> str:
    """The module as XLA's HLO text.

    ``only``: a set of instruction names, or a predicate on instructions; other
    instructions (and computations left empty) are omitted.  ``config``: header fields
    XLA keeps in HloModuleConfig (see ``ModuleConfig``); defaults to ``module.config``
    when the Module has one.
    """
    config = _config_of(module, config)
    p = _Printer(module, print_large_constants, print_metadata)
    keep = _keep_filter(only)
    out = [_header(module, config, print_metadata), "\n\n"]
    da = module.attrs.device_assignment if module.attrs is not None else None
    channel_deps = not (da is not None and module.attrs.HasField("device_assignment")
                        and da.computation_count == 1)
    hidden = _sugared_async_computations(module)
    for comp in computation_post_order(module):
        if id(comp) in hidden:
            continue
        order = _scheduled_order(module, comp) or instruction_post_order(comp, channel_deps)
        if keep is not None and not any(keep(i) for i in order):
            continue
        out.append(p.computation(comp, comp is module.entry, order, keep))
        out.append("\n\n")
    return "".join(out)


def print_computation(comp: Computation, *, print_large_constants: bool = True,
                      print_metadata: bool = True) -> str:
    p = _Printer(comp.module, print_large_constants, print_metadata)
    module = comp.module
    order = (_scheduled_order(module, comp) if module is not None else None) or \
        instruction_post_order(comp)
    return p.computation(comp, module is not None and comp is module.entry, order)


def print_instruction(inst: Instruction, *, print_large_constants: bool = False,
                      print_metadata: bool = True) -> str:
    """One instruction line (without ROOT / indentation)."""
    module = inst.parent.module if inst.parent is not None else None
    return _Printer(module, print_large_constants, print_metadata).instruction(inst)
