"""HLO text parser: the syntax XLA prints (``%`` prefixes optional, layouts optional,
operand shapes optional) and the form XLA's tests hand-write.

``parse_module(text, source)`` returns a Module whose computations are ordered
callees-before-callers, with the entry set, module-unique instruction names (XLA's
NameUniquer rules for duplicates), ids ``(computation_id << 32) | n`` and every
``attrs`` field XLA's HloInstruction::ToProto would set for the same module, so that
jaxlib's proto -> our text -> our proto gives back an equal module modulo ids.

Layers: ``Cursor`` (text_lexer) -> shapes (text_shapes) -> literals (literal) ->
attribute values (text_attrs) -> the attribute-name table ``ATTRIBUTES`` here ->
instructions -> computations -> module.  Errors are ``ParseError`` with the
``source:line:column`` of the offending token.

Not supported (ParseError): result-shape inference (every instruction needs a result
shape), nested instructions as operands, ``origin_recovery_table``.  The async
``op-start``/``op-update``/``op-done`` sugar is expanded into async-start/-update/-done
over a generated ``async_wrapped`` computation, as XLA does.
"""
from __future__ import annotations

import re as _re
from typing import Any, Callable

from hlo_spmd.errors import ParseError, ShardingError
from hlo_spmd.ir import opcodes as _opcodes
from hlo_spmd.ir import text_attrs as A
from hlo_spmd.ir.computation import Computation
from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.literal import parse_literal
from hlo_spmd.ir.module import Module
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.ir.shape import Shape
from hlo_spmd.ir.text_lexer import Cursor
from hlo_spmd.ir.primitive_types import from_text as _type_from_text
from hlo_spmd.ir.text_shapes import ShapeParser
from hlo_spmd.proto import hlo_pb2, xla_data_pb2

__all__ = ["parse_module", "parse_module_with_config", "XLA_OPCODES", "ATTRIBUTES", "ParseError"]

P = PrimitiveType

# Every opcode string XLA (jaxlib 0.10.2) knows, with its fixed arity (None: variadic).
XLA_OPCODES: dict[str, int | None] = _opcodes.JAXLIB_ARITY


def _is_known_opcode(op: str) -> bool:
    return op in XLA_OPCODES or _opcodes.is_known(op)


# ``op-start`` / ``op-update`` / ``op-done``: the async wrapper of each stage (no two
# suffixes end one name, so their order does not matter).
_ASYNC_SUGAR = tuple(("-" + _opcodes.traits(op).async_stage, op)
                     for op in sorted(_opcodes.ASYNC_WRAPPERS))
# Text syntax of the leaves whose value is written in the instruction (a literal, a
# parameter number): they take no operands, are never async-wrapped and have no shape to
# infer.
_VALUE_LEAVES = _opcodes.VALUE_LEAVES
_RESULT_ACCURACY_OPS = _opcodes.RESULT_ACCURACY
_COLLECTIVE_GROUPS = {"replica_groups", "channel_id", "constrain_layout"}
_DOT_ATTRS = {"lhs_contracting_dims", "rhs_contracting_dims", "lhs_batch_dims",
              "rhs_batch_dims", "operand_precision", "algorithm", "sparsity_config",
              "block_scaling_config"}
# Opcode-specific attributes each opcode accepts (the generic ones are always allowed).
_ALLOWED: dict[str, set[str]] = {
    "iota": {"iota_dimension"}, "topk": {"k", "largest", "is_stable"},
    "all-gather": _COLLECTIVE_GROUPS | {"dimensions", "use_global_device_ids"},
    "all-reduce": _COLLECTIVE_GROUPS | {"to_apply", "use_global_device_ids", "mode"},
    "reduce-scatter": _COLLECTIVE_GROUPS | {"to_apply", "use_global_device_ids", "mode",
                                            "dimensions"},
    "all-to-all": _COLLECTIVE_GROUPS | {"dimensions"},
    "ragged-all-to-all": {"replica_groups", "channel_id", "dimensions"},
    "collective-broadcast": {"replica_groups", "channel_id", "has_dynamic_root"},
    "collective-permute": {"source_target_pairs", "channel_id", "slice_sizes"},
    "async-start": {"async_execution_thread", "calls", "output_to_operand_aliasing"},
    "async-update": {"async_execution_thread", "calls"},
    "async-done": {"async_execution_thread", "calls"},
    "copy-start": {"cross_program_prefetch_index"},
    "reshape": {"inferred_dimension"},
    "sort": {"dimensions", "is_stable", "to_apply"},
    "while": {"condition", "body"},
    "send": {"channel_id", "is_host_transfer"},
    "get-tuple-element": {"index"},
    "call": {"to_apply", "is_composite"},
    "reduce-window": {"window", "to_apply"},
    "convolution": {"window", "dim_labels", "feature_group_count", "batch_group_count",
                    "convolution_kind", "operand_precision", "algorithm", "sparsity_config",
                    "block_scaling_config"},
    "fft": {"fft_type", "fft_length"},
    "triangular-solve": {"left_side", "lower", "unit_diagonal", "transpose_a"},
    "compare": {"direction", "type", "order"},
    "cholesky": {"lower"},
    "broadcast": {"dimensions"}, "concatenate": {"dimensions"}, "reverse": {"dimensions"},
    "transpose": {"dimensions"},
    "map": {"to_apply", "dimensions"},
    "scan": {"to_apply", "dimensions", "num_carries", "is_reverse", "is_associative"},
    "reduce": {"to_apply", "dimensions"},
    "select-and-scatter": {"select", "scatter", "window"},
    "slice": {"slice"},
    "dynamic-slice": {"dynamic_slice_sizes"},
    "batch-norm-training": {"epsilon", "feature_index"},
    "pad": {"padding"},
    "fusion": {"calls", "kind", "output_to_operand_aliasing"},
    "infeed": {"infeed_config"},
    "outfeed": {"outfeed_config", "outfeed_shape"},
    "rng": {"distribution"},
    "rng-get-and-update-state": {"delta"},
    "rng-bit-generator": {"algorithm"},
    "reduce-precision": {"exponent_bits", "mantissa_bits"},
    "conditional": {"true_computation", "false_computation", "branch_computations"},
    "custom-call": {"custom_call_target", "window", "dim_labels", "feature_group_count",
                    "batch_group_count", "operand_layout_constraints",
                    "custom_call_has_side_effect", "to_apply", "called_computations",
                    "output_to_operand_aliasing", "padding_type", "literal",
                    "operand_precision", "schedule", "api_version"},
    "dot": set(_DOT_ATTRS),
    "scaled-dot": set(_DOT_ATTRS),
    "ragged-dot": (_DOT_ATTRS - {"algorithm", "sparsity_config", "block_scaling_config"})
    | {"lhs_ragged_dims", "rhs_group_dims"},
    "shuffle": {"dimensions", "mode", "shifts"},
    "collective-reduce": _COLLECTIVE_GROUPS | {"to_apply", "use_global_device_ids",
                                               "has_dynamic_root"},
    "gather": {"offset_dims", "collapsed_slice_dims", "start_index_map", "index_vector_dim",
               "slice_sizes", "indices_are_sorted", "operand_batching_dims",
               "start_indices_batching_dims"},
    "scatter": {"update_window_dims", "inserted_window_dims", "scatter_dims_to_operand_dims",
                "index_vector_dim", "to_apply", "indices_are_sorted", "unique_indices",
                "input_batching_dims", "scatter_indices_batching_dims"},
    "domain": {"domain"},
    "get-dimension-size": {"dimensions"}, "set-dimension-size": {"dimensions"},
}
_ALLOWED["all-gather-start"] = _ALLOWED["all-gather"]
_ALLOWED["all-reduce-start"] = _ALLOWED["all-reduce"]
_ALLOWED["collective-permute-start"] = _ALLOWED["collective-permute"]
for _op in ("recv", "recv-done", "send-done"):
    _ALLOWED[_op] = _ALLOWED["send"]
for _op in ("batch-norm-inference", "batch-norm-grad"):
    _ALLOWED[_op] = _ALLOWED["batch-norm-training"]
for _op in _RESULT_ACCURACY_OPS:
    _ALLOWED[_op] = {"result_accuracy"}

_REQUIRED: dict[str, tuple[str, ...]] = {
    "iota": ("iota_dimension",), "topk": ("k",), "all-gather": ("dimensions",),
    "all-gather-start": ("dimensions",), "all-reduce": ("to_apply",),
    "all-reduce-start": ("to_apply",), "reduce-scatter": ("to_apply", "dimensions"),
    "collective-permute": ("source_target_pairs",),
    "collective-permute-start": ("source_target_pairs",), "async-start": ("calls",),
    "sort": ("dimensions", "to_apply"), "while": ("condition", "body"),
    "get-tuple-element": ("index",), "call": ("to_apply",), "reduce-window": ("to_apply",),
    "convolution": ("dim_labels",), "fft": ("fft_type", "fft_length"),
    "compare": ("direction",), "concatenate": ("dimensions",), "map": ("to_apply",),
    "scan": ("to_apply", "dimensions", "num_carries"), "reduce": ("to_apply", "dimensions"),
    "reverse": ("dimensions",),
    "select-and-scatter": _opcodes.CALLED_ATTRS["select-and-scatter"],
    "slice": ("slice",), "dynamic-slice": ("dynamic_slice_sizes",),
    "transpose": ("dimensions",), "batch-norm-training": ("epsilon", "feature_index"),
    "batch-norm-inference": ("epsilon", "feature_index"),
    "batch-norm-grad": ("epsilon", "feature_index"), "pad": ("padding",),
    "fusion": ("calls", "kind"), "rng": ("distribution",),
    "rng-get-and-update-state": ("delta",), "rng-bit-generator": ("algorithm",),
    "reduce-precision": ("exponent_bits", "mantissa_bits"),
    "custom-call": ("custom_call_target",),
    "gather": ("offset_dims", "collapsed_slice_dims", "start_index_map", "index_vector_dim",
               "slice_sizes"),
    "scatter": ("update_window_dims", "inserted_window_dims", "scatter_dims_to_operand_dims",
                "index_vector_dim", "to_apply"),
    "shuffle": ("dimensions", "mode"), "collective-reduce": ("to_apply",),
    "domain": ("domain",), "get-dimension-size": ("dimensions",),
    "set-dimension-size": ("dimensions",),
}
_GENERIC = frozenset({"sharding", "frontend_attributes", "statistics", "parameter_replication",
                      "control-predecessors", "origin", "metadata", "backend_config"})


# -- per-instruction state ----------------------------------------------------------------------
class _Inst:
    """What one instruction accumulates while its attributes are parsed."""

    __slots__ = ("opcode", "shape", "attrs", "operands", "calls", "seen", "name", "name_pos",
                 "op_pos", "sharding", "control", "extra")

    def __init__(self, opcode: str, shape: Shape, name: str, name_pos: int, op_pos: int) -> None:
        self.opcode = opcode
        self.shape = shape
        self.attrs = hlo_pb2.HloInstructionProto()
        self.operands: list[Instruction] = []
        self.calls: dict[str, list[tuple[str, int]]] = {}
        self.seen: set[str] = set()
        self.name = name
        self.name_pos = name_pos
        self.op_pos = op_pos
        self.sharding: Any = None
        self.control: list[Instruction] = []
        self.extra: dict[str, Any] = {}


class _Comp:
    __slots__ = ("name", "pos", "entry", "comp", "table", "params", "root_name", "thread",
                 "sig_result", "sig_pos")

    def __init__(self, name: str, pos: int, entry: bool) -> None:
        self.name = name
        self.pos = pos
        self.entry = entry
        self.comp = Computation(name)
        self.table: dict[str, Instruction] = {}
        self.params: dict[int, Instruction] = {}
        self.root_name: str | None = None
        self.thread = ""
        self.sig_result: Shape | None = None
        self.sig_pos = 0


# -- attribute handlers (the table keyed by attribute name) ------------------------------------
def _h_int_list(field: str) -> Callable:
    def handler(p: "_Parser", x: _Inst) -> None:
        getattr(x.attrs, field).extend(p.c.int_list())
    return handler


def _h_dimensions(p: "_Parser", x: _Inst) -> None:
    x.attrs.dimensions.extend(p.c.int_list())


def _h_single_dim(field: str) -> Callable:
    def handler(p: "_Parser", x: _Inst) -> None:
        del x.attrs.dimensions[:]
        x.attrs.dimensions.append(p.c.int())
    return handler


def _h_int(field: str, bits: int = 64) -> Callable:
    def handler(p: "_Parser", x: _Inst) -> None:
        pos = p.c.skip_ws()
        v = p.c.int()
        if bits == 32 and not -2 ** 31 <= v < 2 ** 31:
            raise p.c.error("value out of range for int32_t", pos)
        setattr(x.attrs, field, v)
    return handler


def _h_bool(field: str) -> Callable:
    def handler(p: "_Parser", x: _Inst) -> None:
        setattr(x.attrs, field, p.c.bool())
    return handler


def _h_comp(key: str) -> Callable:
    def handler(p: "_Parser", x: _Inst) -> None:
        pos = p.c.skip_ws()
        if p.c.peek() == "{":
            raise p.c.error("nested computations in attributes are not supported", pos)
        x.calls[key] = [(p.c.name("computation name"), pos)]
    return handler


def _h_comp_list(key: str) -> Callable:
    def handler(p: "_Parser", x: _Inst) -> None:
        c = p.c
        c.expect("{", f"expected '{{' to start the computation list")
        names: list[tuple[str, int]] = []
        if not c.eat("}"):
            while True:
                pos = c.skip_ws()
                names.append((c.name("computation name"), pos))
                if c.eat(","):
                    continue
                c.expect("}", "expected ',' or '}}' in computation list")
                break
        x.calls[key] = names
    return handler


def _h_sharding(p: "_Parser", x: _Inst) -> None:
    x.sharding = p.sharding_value("sharding", x.name)


def _h_frontend(p: "_Parser", x: _Inst) -> None:
    A.parse_frontend_attributes(p.c, x.attrs.frontend_attributes)


def _h_statistics(p: "_Parser", x: _Inst) -> None:
    A.parse_statistics(p.c, x.attrs.statistics_viz)


def _h_parameter_replication(p: "_Parser", x: _Inst) -> None:
    c = p.c
    c.expect("{", "expected '{' to start parameter_replication attribute")
    pr = x.attrs.parameter_replication
    pr.SetInParent()
    if not c.eat("}"):
        while True:
            pr.replicated_at_leaf_buffers.append(c.bool())
            if c.eat(","):
                continue
            c.expect("}", "expected '}' to end parameter_replication attribute")
            break


def _h_control(p: "_Parser", x: _Inst) -> None:
    c = p.c
    c.expect("{", "expects '{' at the beginning of instruction name list")
    while True:
        pos = c.skip_ws()
        name = c.name("instruction name")
        inst = p.cur.table.get(name)
        if inst is None:
            raise c.error(f"instruction '{name}' is not defined", pos)
        x.control.append(inst)
        if c.eat(","):
            continue
        c.expect("}", "expects '}' at the end of instruction name list")
        break


def _h_origin(p: "_Parser", x: _Inst) -> None:
    A.parse_original_value(p.c, x.attrs.original_value)


def _h_metadata(p: "_Parser", x: _Inst) -> None:
    A.parse_metadata(p.c, x.attrs.metadata)


def _h_backend_config(p: "_Parser", x: _Inst) -> None:
    c = p.c
    if c.peek() == '"':
        x.attrs.backend_config = c.string_bytes("backend config")
    elif c.peek() == "{":
        x.attrs.backend_config = c.balanced("backend config").encode("utf-8", "surrogateescape")
    else:
        raise c.error(f"expects a string or a {{...}} JSON dict for backend_config but found "
                      f"{c.describe()}")


def _h_result_accuracy(p: "_Parser", x: _Inst) -> None:
    A.parse_result_accuracy(p.c, x.attrs.result_accuracy)


def _h_window(p: "_Parser", x: _Inst) -> None:
    x.attrs.window.CopyFrom(A.parse_window(p.c))


def _h_dim_labels(p: "_Parser", x: _Inst) -> None:
    x.attrs.convolution_dimension_numbers.CopyFrom(A.parse_dim_labels(p.c))


def _h_padding(p: "_Parser", x: _Inst) -> None:
    x.attrs.padding_config.CopyFrom(A.parse_padding(p.c))


def _h_slice(p: "_Parser", x: _Inst) -> None:
    A.parse_slice_ranges(p.c, x.attrs)


def _h_slice_sizes(p: "_Parser", x: _Inst) -> None:
    c = p.c
    if x.opcode in _opcodes.SLICE_SIZES_PER_PAIR:
        for group in c.int_list_list("slice sizes"):
            x.attrs.dynamic_slice_sizes.extend(group)
    else:
        x.attrs.gather_slice_sizes.extend(c.int_list())


def _h_index(p: "_Parser", x: _Inst) -> None:
    x.attrs.tuple_index = p.c.int()


def _h_enum_lower(field: str, table: dict[str, int], what: str, strip: str = "") -> Callable:
    def handler(p: "_Parser", x: _Inst) -> None:
        c = p.c
        pos = c.skip_ws()
        v = c.ident(what).lower()
        if strip and v.startswith(strip):
            v = v[len(strip):]
        if v not in table:
            raise c.error(f"expects {what} but sees: {v}", pos)
        target = x.attrs
        parts = field.split(".")
        for part in parts[:-1]:
            target = getattr(target, part)
        setattr(target, parts[-1], table[v])
    return handler


def _h_enum_exact(field: str, table: dict[str, int], what: str) -> Callable:
    def handler(p: "_Parser", x: _Inst) -> None:
        c = p.c
        pos = c.skip_ws()
        v = c.ident(what)
        if v not in table:
            raise c.error(f"expects {what} but sees: {v}", pos)
        setattr(x.attrs, field, table[v])
    return handler


def _h_algorithm(p: "_Parser", x: _Inst) -> None:
    if x.opcode == "rng-bit-generator":
        _h_enum_lower("rng_algorithm", A.RNG_ALGORITHM_BY_NAME, "random algorithm")(p, x)
    else:
        _h_enum_lower("precision_config.algorithm", A.ALGORITHM_BY_NAME, "algorithm", "alg_")(p, x)


def _h_operand_precision(p: "_Parser", x: _Inst) -> None:
    c = p.c
    c.expect("{", "expected '{' to start operand_precision")
    pc = x.attrs.precision_config
    if not c.eat("}"):
        while True:
            pos = c.skip_ws()
            v = c.ident("precision").lower()
            if v not in A.PRECISION_BY_NAME:
                raise c.error(f"expects precision but sees: {v}", pos)
            pc.operand_precision.append(A.PRECISION_BY_NAME[v])
            if c.eat(","):
                continue
            c.expect("}", "expected '}' to end operand_precision")
            break
    x.extra["operand_precision"] = True


def _h_direction(p: "_Parser", x: _Inst) -> None:
    c = p.c
    pos = c.skip_ws()
    v = c.ident("comparison direction").upper()
    if v not in A.COMPARISON_DIRECTIONS:
        raise c.error(f"expects comparison direction but sees: {v}", pos)
    x.attrs.comparison_direction = v


def _h_comparison_type(p: "_Parser", x: _Inst) -> None:
    c = p.c
    pos = c.skip_ws()
    v = c.ident("comparison type").upper()
    if v not in A.COMPARISON_TYPES:
        raise c.error(f"expects comparison type but sees: {v}", pos)
    if "order" in x.seen:
        raise c.error("a compare takes type= or order=, not both", pos)
    x.attrs.comparison_type = v


def _h_comparison_order(p: "_Parser", x: _Inst) -> None:
    """``order=TOTAL|PARTIAL``: newer XLA's spelling of the ordering (see ir/comparison)."""
    c = p.c
    pos = c.skip_ws()
    v = c.ident("comparison order").upper()
    if v not in A.COMPARISON_ORDERS:
        raise c.error(f"expects comparison order but sees: {v}", pos)
    if "type" in x.seen:
        raise c.error("a compare takes type= or order=, not both", pos)
    x.attrs.comparison_order = v


def _h_string(field: str, as_bytes: bool = False) -> Callable:
    def handler(p: "_Parser", x: _Inst) -> None:
        v = p.c.string_bytes() if as_bytes else p.c.string()
        setattr(x.attrs, field, v)
    return handler


def _h_kind(p: "_Parser", x: _Inst) -> None:
    c = p.c
    pos = c.skip_ws()
    v = c.ident("fusion kind")
    if v not in A.FUSION_KINDS:
        raise c.error(f"expects fusion kind but sees: {v}", pos)
    x.attrs.fusion_kind = v


def _h_epsilon(p: "_Parser", x: _Inst) -> None:
    c = p.c
    pos = c.skip_ws()
    tok = c.number_token()
    if tok is None:
        raise c.error(f"expects a number but found {c.describe(pos)}", pos)
    x.attrs.epsilon = float(tok)


def _h_source_target_pairs(p: "_Parser", x: _Inst) -> None:
    c = p.c
    pos = c.skip_ws()
    for pair in c.int_list_list("source_target_pairs"):
        if len(pair) != 2:
            raise c.error("expects 'source_target_pairs=' to be a list of pairs", pos)
        st = x.attrs.source_target_pairs.add()
        st.source, st.target = pair


def _h_replica_groups(p: "_Parser", x: _Inst) -> None:
    A.parse_replica_groups(p.c, x.attrs)


def _h_aliasing(p: "_Parser", x: _Inst) -> None:
    A.parse_instruction_aliasing(p.c, x.attrs)


def _h_operand_layouts(p: "_Parser", x: _Inst) -> None:
    c = p.c
    c.expect("{", "expected '{' to start operand_layout_constraints")
    x.attrs.constrain_layout = True
    if not c.eat("}"):
        while True:
            s = p.shapes.parse(c)
            x.attrs.operand_shapes_with_layout.add().CopyFrom(s.source_proto)
            if c.eat(","):
                continue
            c.expect("}", "expected '}' to end operand_layout_constraints")
            break


def _h_literal(p: "_Parser", x: _Inst) -> None:
    c = p.c
    shape = p.shapes.parse(c, "literal shape")
    x.attrs.literal.CopyFrom(parse_literal(c, shape.source_proto))


def _h_outfeed_shape(p: "_Parser", x: _Inst) -> None:
    x.attrs.outfeed_shape.CopyFrom(p.shapes.parse(p.c).source_proto)


def _h_triangular(field: str) -> Callable:
    def handler(p: "_Parser", x: _Inst) -> None:
        setattr(x.attrs.triangular_solve_options, field, p.c.bool())
    return handler


def _h_transpose_a(p: "_Parser", x: _Inst) -> None:
    c = p.c
    pos = c.skip_ws()
    v = c.ident("transpose kind")
    if v not in A.TRANSPOSE_BY_NAME:
        raise c.error(f"expects a TriangularSolveOptions.Transpose value but sees: {v}", pos)
    x.attrs.triangular_solve_options.transpose_a = A.TRANSPOSE_BY_NAME[v]


def _h_lower(p: "_Parser", x: _Inst) -> None:
    v = p.c.bool()
    if x.opcode == "cholesky":
        x.attrs.cholesky_options.lower = v
    else:
        x.attrs.triangular_solve_options.lower = v


def _h_domain(p: "_Parser", x: _Inst) -> None:
    c = p.c
    start = c.expect("{", "expects '{' to start the domain attribute")
    fields: dict[str, Any] = {}
    while not c.eat("}"):
        c.eat(",")
        pos = c.skip_ws()
        name = c.attr_name()
        if name == "kind":
            fields["kind"] = (c.string(), pos)
        elif name in ("entry", "exit"):
            fields[name] = p.sharding_value("domain " + name)
        else:
            raise c.error(f"unexpected domain sub-attribute {name}", pos)
    for k in ("kind", "entry", "exit"):
        if k not in fields:
            raise c.error(f"sub-attribute {k} is expected but not seen", start)
    if fields["kind"][0] != "sharding":
        raise c.error(f"unsupported domain kind: {fields['kind'][0]}", fields["kind"][1])
    from hlo_spmd.sharding.proto import to_proto

    # Text entry= is the user side (proto exit), exit= the operand side (proto entry).
    x.attrs.domain_exit_sharding.CopyFrom(to_proto(fields["entry"]))
    x.attrs.domain_entry_sharding.CopyFrom(to_proto(fields["exit"]))


def _h_is_associative(p: "_Parser", x: _Inst) -> None:
    x.attrs.is_associative = hlo_pb2.TRI_STATE_TRUE if p.c.bool() else hlo_pb2.TRI_STATE_FALSE


def _h_cross_program_prefetch(p: "_Parser", x: _Inst) -> None:
    x.attrs.cross_program_prefetch_index = p.c.int()


def _h_mode(p: "_Parser", x: _Inst) -> None:
    if x.opcode == "shuffle":
        _h_shuffle_mode(p, x)
        return
    p.c.ident("collective op group mode")  # parsed and ignored, as XLA does


def _sided_config(c, cfg, what: str, read_key) -> None:
    """``{lhs={k=v ...} rhs={...}}``, the form of the per-operand configs of dot and
    convolution: space-separated sides, each a space-separated ``key=value`` list (any
    order, a repeated key wins). ``read_key(tensor, key, pos)`` reads one value."""
    c.expect("{", f"expects '{{' to start {what}")
    cfg.SetInParent()
    while not c.eat("}"):
        pos = c.skip_ws()
        side = c.attr_name()
        if side not in ("lhs", "rhs"):
            raise c.error(f"expects lhs= or rhs= in {what}", pos)
        tensor = getattr(cfg, side)
        tensor.SetInParent()
        c.expect("{", f"expects '{{' to start a {what.removesuffix(' config')} side")
        while not c.eat("}"):
            pos = c.skip_ws()
            read_key(tensor, c.attr_name(), pos)


def _h_sparsity_config(p: "_Parser", x: _Inst) -> None:
    """``{lhs={sparsity=1x2 dimension=3 stride=1} rhs={...}}``."""
    c = p.c

    def read_key(tensor, key: str, pos: int) -> None:
        if key == "sparsity":
            vpos = c.skip_ws()
            m = c.match(_N_X_M)
            if m is None:
                raise c.error("expects sparsity like 1x2", vpos)
            tensor.num_non_zero, tensor.block_size = int(m.group(1)), int(m.group(2))
        elif key in ("dimension", "stride", "idx"):
            setattr(tensor, key, c.int(key))
        else:
            raise c.error("expects sparsity, dimension, stride or idx in sparsity config",
                          pos)

    _sided_config(c, x.attrs.sparsity_config, "sparsity config", read_key)


def _h_block_scaling_config(p: "_Parser", x: _Inst) -> None:
    """``{lhs={scale_idx=2 zero_idx=3 strides=1x32 steps=1x1} rhs={...}}`` (newer XLA)."""
    c = p.c

    def read_key(tensor, key: str, pos: int) -> None:
        if key in ("scale_idx", "zero_idx"):
            vpos = c.skip_ws()
            v = c.int(key)
            if not -2 ** 31 <= v < 2 ** 31:
                raise c.error("value out of range for int32_t", vpos)
            setattr(tensor, key, v)
        elif key in ("strides", "steps"):
            vpos = c.skip_ws()
            m = c.match(_DIMS_X)
            if m is None:
                raise c.error(f"expects {key} like 1x32", vpos)
            getattr(tensor, key).extend(int(v) for v in m.group(0).split("x"))
        else:
            raise c.error("expects scale_idx, zero_idx, strides or steps in block scaling "
                          "config", pos)

    _sided_config(c, x.attrs.block_scaling_config, "block scaling config", read_key)


_DIMS_X = _re.compile(r"[0-9]+(?:x[0-9]+)*")


def _h_shuffle_mode(p: "_Parser", x: _Inst) -> None:
    c = p.c
    pos = c.skip_ws()
    v = c.ident("shuffle mode")
    if v != "rotate":
        raise c.error(f"expects shuffle mode but sees: {v}", pos)
    x.attrs.shuffle_mode.rotate.SetInParent()


def _h_shifts(p: "_Parser", x: _Inst) -> None:
    x.attrs.shuffle_mode.rotate.shifts.extend(p.c.int_list())


_N_X_M = _re.compile(r"([0-9]+)x([0-9]+)")


def _h_ragged(field: str) -> Callable:
    def handler(p: "_Parser", x: _Inst) -> None:
        getattr(x.attrs.ragged_dot_dimension_numbers, field).extend(p.c.int_list())
    return handler


def _h_dot_dims(field: str) -> Callable:
    def handler(p: "_Parser", x: _Inst) -> None:
        dn = (x.attrs.ragged_dot_dimension_numbers.dot_dimension_numbers
              if x.opcode == "ragged-dot" else x.attrs.dot_dimension_numbers)
        getattr(dn, field).extend(p.c.int_list())
    return handler


def _h_gather_dims(field: str) -> Callable:
    def handler(p: "_Parser", x: _Inst) -> None:
        getattr(x.attrs.gather_dimension_numbers, field).extend(p.c.int_list())
    return handler


def _h_scatter_dims(field: str) -> Callable:
    def handler(p: "_Parser", x: _Inst) -> None:
        getattr(x.attrs.scatter_dimension_numbers, field).extend(p.c.int_list())
    return handler


def _h_index_vector_dim(p: "_Parser", x: _Inst) -> None:
    v = p.c.int()
    if x.opcode == "scatter":
        x.attrs.scatter_dimension_numbers.index_vector_dim = v
    else:
        x.attrs.gather_dimension_numbers.index_vector_dim = v


def _h_async_thread(p: "_Parser", x: _Inst) -> None:
    x.extra["async_execution_thread"] = p.c.string()


ATTRIBUTES: dict[str, Callable[["_Parser", _Inst], None]] = {
    # generic
    "sharding": _h_sharding, "frontend_attributes": _h_frontend, "statistics": _h_statistics,
    "parameter_replication": _h_parameter_replication, "control-predecessors": _h_control,
    "origin": _h_origin, "metadata": _h_metadata, "backend_config": _h_backend_config,
    "result_accuracy": _h_result_accuracy,
    # called computations
    "to_apply": _h_comp("to_apply"), "condition": _h_comp("condition"), "body": _h_comp("body"),
    "select": _h_comp("select"), "scatter": _h_comp("scatter"),
    "true_computation": _h_comp("true_computation"),
    "false_computation": _h_comp("false_computation"),
    "branch_computations": _h_comp_list("branch_computations"),
    "called_computations": _h_comp_list("called_computations"), "calls": _h_comp("calls"),
    "is_composite": _h_bool("is_composite"),
    # dimensions and friends
    "dimensions": _h_dimensions, "iota_dimension": _h_single_dim("iota_dimension"),
    "inferred_dimension": _h_single_dim("inferred_dimension"),
    "index": _h_index, "slice": _h_slice, "slice_sizes": _h_slice_sizes,
    "dynamic_slice_sizes": _h_int_list("dynamic_slice_sizes"),
    "fft_length": _h_int_list("fft_length"),
    "fft_type": _h_enum_exact("fft_type", A.FFT_BY_NAME, "fft type"),
    "padding": _h_padding, "window": _h_window, "dim_labels": _h_dim_labels,
    "feature_group_count": _h_int("feature_group_count"),
    "batch_group_count": _h_int("batch_group_count"),
    "convolution_kind": _h_enum_lower("conv_kind", A.CONV_KIND_BY_NAME, "convolution kind"),
    "operand_precision": _h_operand_precision, "algorithm": _h_algorithm,
    "lhs_contracting_dims": _h_dot_dims("lhs_contracting_dimensions"),
    "rhs_contracting_dims": _h_dot_dims("rhs_contracting_dimensions"),
    "lhs_batch_dims": _h_dot_dims("lhs_batch_dimensions"),
    "rhs_batch_dims": _h_dot_dims("rhs_batch_dimensions"),
    "lhs_ragged_dims": _h_ragged("lhs_ragged_dimensions"),
    "rhs_group_dims": _h_ragged("rhs_group_dimensions"),
    "sparsity_config": _h_sparsity_config,
    "block_scaling_config": _h_block_scaling_config,
    "has_dynamic_root": _h_bool("has_dynamic_root"),
    "shifts": _h_shifts,
    "offset_dims": _h_gather_dims("offset_dims"),
    "collapsed_slice_dims": _h_gather_dims("collapsed_slice_dims"),
    "start_index_map": _h_gather_dims("start_index_map"),
    "operand_batching_dims": _h_gather_dims("operand_batching_dims"),
    "start_indices_batching_dims": _h_gather_dims("start_indices_batching_dims"),
    "index_vector_dim": _h_index_vector_dim,
    "update_window_dims": _h_scatter_dims("update_window_dims"),
    "inserted_window_dims": _h_scatter_dims("inserted_window_dims"),
    "scatter_dims_to_operand_dims": _h_scatter_dims("scatter_dims_to_operand_dims"),
    "input_batching_dims": _h_scatter_dims("input_batching_dims"),
    "scatter_indices_batching_dims": _h_scatter_dims("scatter_indices_batching_dims"),
    "indices_are_sorted": _h_bool("indices_are_sorted"),
    "unique_indices": _h_bool("unique_indices"),
    "is_stable": _h_bool("is_stable"), "is_reverse": _h_bool("is_reverse"),
    "is_associative": _h_is_associative,
    # compare, rng, misc scalars
    "direction": _h_direction, "type": _h_comparison_type, "order": _h_comparison_order,
    "distribution": _h_enum_lower("distribution", A.DISTRIBUTION_BY_NAME, "random distribution"),
    "delta": _h_int("delta"), "k": _h_int("k"), "largest": _h_bool("largest"),
    "num_carries": _h_int("num_carries"),
    "exponent_bits": _h_int("exponent_bits", 32), "mantissa_bits": _h_int("mantissa_bits", 32),
    "epsilon": _h_epsilon, "feature_index": _h_int("feature_index"),
    "kind": _h_kind, "output_to_operand_aliasing": _h_aliasing,
    "lower": _h_lower, "left_side": _h_triangular("left_side"),
    "unit_diagonal": _h_triangular("unit_diagonal"), "transpose_a": _h_transpose_a,
    "domain": _h_domain,
    # collectives
    "replica_groups": _h_replica_groups, "channel_id": _h_int("channel_id"),
    "constrain_layout": _h_bool("constrain_layout"),
    "use_global_device_ids": _h_bool("use_global_device_ids"), "mode": _h_mode,
    "source_target_pairs": _h_source_target_pairs,
    "is_host_transfer": _h_bool("is_host_transfer"),
    "async_execution_thread": _h_async_thread,
    "cross_program_prefetch_index": _h_cross_program_prefetch,
    # custom call
    "custom_call_target": _h_string("custom_call_target"),
    "operand_layout_constraints": _h_operand_layouts,
    "custom_call_has_side_effect": _h_bool("custom_call_has_side_effect"),
    "padding_type": _h_enum_exact("padding_type", A.PADDING_TYPE_BY_NAME, "padding type"),
    "literal": _h_literal,
    "schedule": _h_enum_lower("custom_call_schedule", A.SCHEDULE_BY_NAME, "custom-call schedule"),
    "api_version": _h_enum_lower("custom_call_api_version", A.API_VERSION_BY_NAME,
                                 "custom-call API version"),
    # feeds
    "infeed_config": _h_string("infeed_config", True),
    "outfeed_config": _h_string("outfeed_config", True),
    "outfeed_shape": _h_outfeed_shape,
}


# -- defaults XLA's ToProto writes, per opcode ----------------------------------------------------
def _fill_precision(x: _Inst, n: int) -> None:
    pc = x.attrs.precision_config
    pc.SetInParent()
    if "operand_precision" not in x.extra:
        pc.operand_precision.extend([0] * n)


def _f_dot(x: _Inst) -> None:
    x.attrs.dot_dimension_numbers.SetInParent()
    _fill_precision(x, len(x.operands))


def _f_scaled_dot(x: _Inst) -> None:
    x.attrs.dot_dimension_numbers.SetInParent()
    _fill_precision(x, 2)


def _f_ragged_dot(x: _Inst) -> None:
    x.attrs.ragged_dot_dimension_numbers.dot_dimension_numbers.SetInParent()
    _fill_precision(x, 2)


def _f_convolution(x: _Inst) -> None:
    a = x.attrs
    a.window.SetInParent()
    a.convolution_dimension_numbers.SetInParent()
    if "feature_group_count" not in x.seen:
        a.feature_group_count = 1
    if "batch_group_count" not in x.seen:
        a.batch_group_count = 1
    _fill_precision(x, 2)
    a.sparsity_config.SetInParent()


def _f_custom_call(x: _Inst) -> None:
    a = x.attrs
    if "feature_group_count" not in x.seen:
        a.feature_group_count = 1
    if "batch_group_count" not in x.seen:
        a.batch_group_count = 1
    _fill_precision(x, len(x.operands))
    if "api_version" not in x.seen:
        a.custom_call_api_version = hlo_pb2.API_VERSION_ORIGINAL


def _f_window(x: _Inst) -> None:
    x.attrs.window.SetInParent()


def _f_collective(x: _Inst) -> None:
    if x.attrs.WhichOneof("replica_group_list") is None:
        x.attrs.collective_device_list.SetInParent()


def _f_compare(x: _Inst) -> None:
    if not x.attrs.comparison_type and not x.attrs.comparison_order and x.operands:
        x.attrs.comparison_type = A.default_comparison_type(x.operands[0].shape.element_type)


def _f_map(x: _Inst) -> None:
    del x.attrs.dimensions[:]
    x.attrs.dimensions.extend(range(x.shape.rank))


def _f_topk(x: _Inst) -> None:
    if "largest" not in x.seen:
        x.attrs.largest = True


def _f_outfeed(x: _Inst) -> None:
    if not x.attrs.HasField("outfeed_shape") and x.operands:
        from hlo_spmd.ir.proto_io import shape_to_proto

        x.attrs.outfeed_shape.CopyFrom(shape_to_proto(x.operands[0].shape))


def _f_triangular(x: _Inst) -> None:
    x.attrs.triangular_solve_options.SetInParent()


def _f_cholesky(x: _Inst) -> None:
    x.attrs.cholesky_options.SetInParent()


def _f_gather(x: _Inst) -> None:
    x.attrs.gather_dimension_numbers.SetInParent()


def _f_scatter(x: _Inst) -> None:
    x.attrs.scatter_dimension_numbers.SetInParent()


def _f_pad(x: _Inst) -> None:
    x.attrs.padding_config.SetInParent()


def _f_scan(x: _Inst) -> None:
    a = x.attrs
    if a.is_associative == 0:
        a.is_associative = hlo_pb2.TRI_STATE_FALSE


def _f_async_start(x: _Inst) -> None:
    if "async_execution_thread" in x.extra:
        t = x.extra["async_execution_thread"]
        x.attrs.async_execution_thread = "" if t == "main" else t


_FINISH: dict[str, Callable[[_Inst], None]] = {
    "dot": _f_dot, "scaled-dot": _f_scaled_dot, "ragged-dot": _f_ragged_dot,
    "convolution": _f_convolution, "custom-call": _f_custom_call,
    "reduce-window": _f_window, "select-and-scatter": _f_window,
    "compare": _f_compare, "map": _f_map, "topk": _f_topk, "outfeed": _f_outfeed,
    "triangular-solve": _f_triangular, "cholesky": _f_cholesky, "gather": _f_gather,
    "scatter": _f_scatter, "pad": _f_pad, "scan": _f_scan, "async-start": _f_async_start,
}
for _op in ("all-gather", "all-gather-start", "all-reduce", "all-reduce-start",
            "reduce-scatter", "all-to-all", "ragged-all-to-all", "collective-broadcast"):
    _FINISH[_op] = _f_collective


def _constant_shape(shape: Shape) -> Shape:
    """XLA builds a constant's shape from its literal, which drops element_size_in_bits."""
    if shape.is_tuple:
        subs = [_constant_shape(s) for s in shape.tuple_shapes]
        if all(a is b for a, b in zip(subs, shape.tuple_shapes)):
            return shape
        sp = xla_data_pb2.ShapeProto(element_type=P.TUPLE)
        for sub in subs:
            sp.tuple_shapes.add().CopyFrom(sub.source_proto)
        return Shape(P.TUPLE, (), tuple(subs), None, (), source_proto=sp)
    lay = shape.layout
    if lay is None or not lay.element_size_in_bits:
        return shape
    sp = xla_data_pb2.ShapeProto()
    sp.CopyFrom(shape.source_proto)
    sp.layout.element_size_in_bits = 0
    return Shape(shape.element_type, shape.dims, (), type(lay)(lay.minor_to_major, lay.tiles, 0,
                 lay.memory_space), shape.dynamic_dims, source_proto=sp)


# -- the parser ---------------------------------------------------------------------------------
class _NameUniquer:
    """XLA's NameUniquer: ``foo`` twice -> ``foo``, ``foo.1``; numeric suffixes tracked."""

    def __init__(self) -> None:
        self.ids: dict[str, tuple[set[int], list[int]]] = {}

    def unique(self, name: str) -> str:
        root = name
        has_suffix = False
        suffix = 0
        i = root.rfind(".")
        if 0 < i < len(root) - 1:
            tail = root[i + 1:]
            if tail.isdigit() or (tail[0] in "+-" and tail[1:].isdigit()):
                v = int(tail)
                if 0 <= v < 2 ** 63:
                    has_suffix = True
                    suffix = v
                    root = root[:i]
        used, nxt = self.ids.setdefault(root, (set(), [0]))
        if suffix not in used:
            used.add(suffix)
        else:
            while nxt[0] in used:
                nxt[0] += 1
            suffix = nxt[0]
            used.add(suffix)
            nxt[0] += 1
        if suffix == 0:
            return f"{root}.0" if has_suffix else root
        return f"{root}.{suffix}"


_SHARDING_WHERE = _re.compile(r" at character \d+ in '.*'$", _re.S)


class _Parser:
    def __init__(self, text: str, source: str) -> None:
        self.c = Cursor(text, source)
        self.shapes = ShapeParser()
        self.module_attrs = hlo_pb2.HloModuleProto()
        self.config: dict[str, Any] = {}
        self.comps: list[_Comp] = []
        self.comp_by_name: dict[str, _Comp] = {}
        self.pending: list[tuple[Instruction, list[tuple[str, int]]]] = []
        self.cur: _Comp | None = None
        self.entry_layout: tuple[list[Shape], Shape] | None = None
        self.scheduled = False
        self.name = ""
        self.sharding_cache: dict[str, Any] = {}

    # -- helpers --------------------------------------------------------------------------
    def sharding_value(self, what: str, inst: str | None = None) -> Any:
        c = self.c
        pos = c.skip_ws()
        text = c.balanced(what)
        cached = self.sharding_cache.get(text)
        if cached is not None:  # HloSharding values are immutable
            return cached
        from hlo_spmd.sharding import parse_sharding

        try:
            value = self.sharding_cache[text] = parse_sharding(text)
            return value
        except ShardingError as e:
            off = getattr(e, "position", None)
            epos = pos + off if isinstance(off, int) and 0 <= off <= len(text) else pos
            msg = e.message if hasattr(e, "message") else str(e)
            msg = _SHARDING_WHERE.sub("", msg)  # replaced by line:column
            on = f" on {inst}" if inst else ""
            raise c.error(f"bad sharding{on} {text!r}: {msg}", epos) from None

    # -- module ---------------------------------------------------------------------------
    def parse(self) -> Module:
        c = self.c
        c.skip_ws()
        if c.keyword("HloModule"):
            self.name = c.name("module name")
            while c.eat(","):
                self.module_attribute()
        self.stack_frames()
        if c.at_end():
            raise c.error("expected at least one computation")
        while not c.at_end():
            self.computation()
        return self.build()

    def module_attribute(self) -> None:
        c = self.c
        pos = c.skip_ws()
        name = c.attr_name()
        if name is None:
            raise c.error(f"expected a module attribute but found {c.describe(pos)}", pos)
        ma = self.module_attrs
        if name == "is_scheduled":
            self.scheduled = c.bool()
        elif name in ("replica_count", "num_partitions"):
            self.config[name] = c.int()
        elif name == "alias_passthrough_params":
            self.config[name] = c.bool()
        elif name == "input_output_alias":
            A.parse_module_aliasing(c, ma.input_output_alias)
        elif name == "buffer_donor":
            A.parse_buffer_donor(c, ma.buffer_donor)
        elif name == "entry_computation_layout":
            c.expect("{", "expects '{' at the start of the entry computation layout")
            c.expect("(", "expects ( before parameter shape list")
            params: list[Shape] = []
            if not c.eat(")"):
                while True:
                    params.append(self.shapes.parse(c))
                    if c.eat(","):
                        continue
                    c.expect(")", "expects ) at end of parameter shape list")
                    break
            c.expect("->", "expects -> before result shape")
            result = self.shapes.parse(c)
            c.expect("}", "expects '}' at the end of computation layouts")
            self.entry_layout = (params, result)
        elif name == "frontend_attributes":
            A.parse_frontend_attributes(c, ma.frontend_attributes)
        elif name in ("allow_spmd_sharding_propagation_to_parameters",
                      "allow_spmd_sharding_propagation_to_output"):
            if c.peek() == "{":
                c.expect("{")
                vals: list[bool] = []
                if not c.eat("}"):
                    while True:
                        vals.append(c.bool())
                        if c.eat(","):
                            continue
                        c.expect("}")
                        break
                self.config[name] = vals
            else:
                self.config[name] = [c.bool()]
        else:
            raise c.error(f"unexpected module attribute \"{name}\"", pos)

    def stack_frames(self) -> None:
        c = self.c
        if not c.keyword("FileNames"):
            return
        sfi = self.module_attrs.stack_frame_index
        sfi.SetInParent()
        while c.peek().isdigit():
            c.int()
            sfi.file_names.append(c.string("file name"))
        if not c.keyword("FunctionNames"):
            raise c.error("expects 'FunctionNames'")
        while c.peek().isdigit():
            c.int()
            sfi.function_names.append(c.string("function name"))
        if not c.keyword("FileLocations"):
            raise c.error("expects 'FileLocations'")
        keys = ("file_name_id", "function_name_id", "line", "end_line", "column", "end_column")
        while c.peek().isdigit():
            c.int()
            vals = self.sub_ints(keys)
            fl = sfi.file_locations.add()
            for k in keys:
                setattr(fl, k, vals[k])
        if not c.keyword("StackFrames"):
            raise c.error("expects 'StackFrames'")
        while c.peek().isdigit():
            c.int()
            vals = self.sub_ints(("file_location_id", "parent_frame_id"))
            sf = sfi.stack_frames.add()
            sf.file_location_id = vals["file_location_id"]
            # XLA prints parent_frame_id + 1 and subtracts one when parsing.
            sf.parent_frame_id = vals["parent_frame_id"] - 1

    def sub_ints(self, keys: tuple[str, ...]) -> dict[str, int]:
        c = self.c
        start = c.expect("{")
        out: dict[str, int] = {}
        while not c.eat("}"):
            c.eat(",")
            pos = c.skip_ws()
            k = c.attr_name()
            if k not in keys:
                raise c.error(f"unexpected sub-attribute {k}", pos)
            out[k] = c.int()
        for k in keys:
            if k not in out:
                raise c.error(f"sub-attribute {k} is expected but not seen", start)
        return out

    # -- computations ---------------------------------------------------------------------
    def computation(self) -> None:
        c = self.c
        entry_pos = c.skip_ws()
        is_entry = c.keyword("ENTRY")
        pos = c.skip_ws()
        name = c.name("computation name")
        if name in self.comp_by_name:
            raise c.error(f"computation '{name}' already exists", pos)
        if is_entry and any(cc.entry for cc in self.comps):
            raise c.error("expects only one ENTRY", entry_pos)
        cc = _Comp(name, pos, is_entry)
        self.comp_by_name[name] = cc
        self.comps.append(cc)
        self.cur = cc
        if c.peek() == "(":
            c.expect("(")
            if not c.eat(")"):
                while True:
                    c.name("parameter name")
                    c.expect(":", "expected ':' after the parameter name")
                    self.shapes.parse(c)
                    if c.eat(","):
                        continue
                    c.expect(")", "expects ')' at the end of param list")
                    break
            c.expect("->", "expects '->'")
            cc.sig_pos = c.skip_ws()
            cc.sig_result = self.shapes.parse(c)
        c.expect("{", f"expects '{{' at the beginning of instruction list")
        while True:
            if c.eat("}"):
                break
            if c.at_end():
                raise c.error("expects '}' at the end of instruction list")
            self.instruction(cc)
        if not cc.comp.instructions:
            raise c.error(f"computation '{name}' has no instructions", pos)
        if c.eat(","):
            apos = c.skip_ws()
            if c.attr_name() != "execution_thread":
                raise c.error("expected execution_thread= after the computation", apos)
            thread = c.string("execution thread")
            cc.thread = "" if thread == "main" else thread
        self.finish_computation(cc)

    def finish_computation(self, cc: _Comp) -> None:
        comp = cc.comp
        c = self.c
        comp.root = cc.table[cc.root_name] if cc.root_name is not None else comp.instructions[-1]
        comp.execution_thread = cc.thread
        n = len(cc.params)
        if n and sorted(cc.params) != list(range(n)):
            missing = sorted(set(range(n)) - set(cc.params))
            raise c.error(f"computation '{cc.name}' has parameters {sorted(cc.params)}; parameter "
                          f"numbers must be 0..{n - 1} (missing {missing[0]})", cc.pos)
        if cc.sig_result is not None and not cc.sig_result.compatible(comp.root.shape):
            raise c.error(f"shape of computation {cc.name}, {cc.sig_result.to_text(False)}, is "
                          f"not compatible with that of its root instruction "
                          f"{comp.root.name}, {comp.root.shape.to_text(False)}", cc.sig_pos)

    # -- instructions ---------------------------------------------------------------------
    def instruction(self, cc: _Comp) -> None:
        c = self.c
        is_root = c.keyword("ROOT")
        name_pos = c.skip_ws()
        name = c.name("instruction name")
        c.expect("=", "expects '=' in instruction")
        if name in cc.table:
            raise c.error(f"instruction '{name}' already exists in computation '{cc.name}'",
                          name_pos)
        if _type_from_text(name) is not None and name != "tuple":  # XLA accepts "tuple"
            raise c.error(f"illegal instruction name: {name}; suggest renaming to: {name}_",
                          name_pos)
        shape_pos = c.skip_ws()
        # XLA's parser infers a result shape left out; so do we, for opcodes whose shape
        # follows from their operands and attributes alone (below).
        shape = self.shapes.parse(c) if self.shapes.can_start(c) else None
        op_pos = c.skip_ws()
        opcode = c.ident("opcode")
        async_kind = None
        if not _is_known_opcode(opcode):
            for suffix, kind in _ASYNC_SUGAR:
                if opcode.endswith(suffix) and _is_known_opcode(opcode[:-len(suffix)]):
                    async_kind = kind
                    opcode = opcode[:-len(suffix)]
                    break
            else:
                raise c.error(f"unknown opcode '{opcode}'", op_pos)
            if opcode in _VALUE_LEAVES:
                raise c.error(f"'{opcode}' cannot be wrapped in an async op", op_pos)
        # For the async sugar (``custom-call-start``) ``opcode`` is the wrapped opcode and
        # the attributes are parsed as the wrapped instruction's.
        x = _Inst(opcode, shape, name, name_pos, op_pos)
        a = x.attrs
        # operands
        c.expect("(", f"expected '(' after opcode '{opcode}'")
        if opcode == "parameter":
            ppos = c.skip_ws()
            num = c.int("parameter number")
            if num < 0:
                raise c.error("parameter number must be >= 0", ppos)
            if num in cc.params:
                raise c.error(f"parameter number {num} already allocated in this computation", ppos)
            a.parameter_number = num
            c.expect(")", "expects ')' after parameter number")
        elif opcode == "constant":
            if shape is None:  # the literal is read in its shape
                raise c.error(f"expected the result shape of '{name}' (it cannot be "
                              f"inferred for constant)", shape_pos)
            lpos = c.skip_ws()
            if c.text.startswith("{...}", lpos) and shape.is_tuple:
                raise c.error("constant values are elided ({...}); print with large constants",
                              lpos)
            shape = x.shape = _constant_shape(shape)
            a.literal.CopyFrom(parse_literal(c, shape.source_proto))
            c.expect(")", "expects ')' after constant literal")
        elif not c.eat(")"):
            table = cc.table
            operands = x.operands
            while True:
                opos = c.skip_ws()
                oshape = None
                if self.shapes.can_start(c):
                    oshape = self.shapes.parse(c)
                    opos = c.skip_ws()
                oname = c.name("operand name")
                inst = table.get(oname)
                if inst is None:
                    raise c.error(f"undefined operand '{oname}'", opos)
                if oshape is not None and oshape is not inst.shape and \
                        not oshape.compatible(inst.shape):
                    raise c.error(f"the declared operand shape {oshape.to_text()} is not compatible "
                                  f"with the shape of '{oname}', {inst.shape.to_text()}", opos)
                operands.append(inst)
                if c.eat(","):
                    continue
                c.expect(")", "expected ')' after operands")
                break
        arity = XLA_OPCODES.get(opcode)
        if async_kind is not None:
            arity = None if async_kind == "async-start" else 1
        if arity is not None and opcode not in _VALUE_LEAVES and \
                len(x.operands) != arity:
            raise c.error(f"'{opcode}' expects {arity} operands, but has {len(x.operands)} "
                          "operands", op_pos)
        # attributes
        allowed = _ALLOWED.get(opcode, ())
        if async_kind is not None:
            allowed = set(allowed) | {"async_execution_thread"}
            if async_kind == "async-start":
                allowed.add("output_to_operand_aliasing")
            else:
                allowed = {"async_execution_thread"}
        seen = x.seen
        while c.eat(","):
            apos = c.skip_ws()
            aname = c.attr_name()
            if aname is None:
                raise c.error(f"expected an attribute name but found {c.describe(apos)}", apos)
            if aname in seen:
                raise c.error(f"attribute {aname} already exists", apos)
            handler = ATTRIBUTES.get(aname)
            if handler is None:
                raise c.error(f"unknown attribute '{aname}'", apos)
            if aname not in _GENERIC and aname not in allowed:
                raise c.error(f"attribute '{aname}' is not allowed for opcode {opcode}", apos)
            seen.add(aname)
            handler(self, x)
        if x.shape is None:
            x.shape = self.inferred_shape(x, async_kind, shape_pos)
        if async_kind is not None:
            self.finish_async_sugar(cc, x, is_root, async_kind)
        else:
            self.finish_instruction(cc, x, is_root)

    def inferred_shape(self, x: _Inst, async_kind: str | None, shape_pos: int) -> Shape:
        """The result shape of an instruction written without one (XLA's parser infers
        it). Only for opcodes that call no computation: their shape is known here."""
        c = self.c
        if async_kind is not None or x.calls:
            raise c.error(f"expected the result shape of '{x.name}' (it cannot be inferred "
                          f"for {x.opcode})", shape_pos)
        from hlo_spmd.errors import VerifierError
        from hlo_spmd.ir.shape_inference import infer_shape
        try:
            return infer_shape(x.opcode, [o.shape for o in x.operands], x.attrs)
        except VerifierError as e:
            raise c.error(f"cannot infer the result shape of '{x.name}': {e}", shape_pos) from None

    def finish_async_sugar(self, cc: _Comp, x: _Inst, is_root: bool, kind: str) -> None:
        """``op-start/-update/-done``: build the wrapped computation XLA's parser builds."""
        c = self.c
        wrapped_op = x.opcode
        thread = x.extra.pop("async_execution_thread", None)
        if kind != "async-start":
            prev = x.operands[0]
            if prev.opcode not in _opcodes.ASYNC_CHAIN_OPEN:
                raise c.error("AsyncUpdate and AsyncDone expect a single async op as their "
                              "operand.", x.op_pos)
            start = prev
            while start.opcode == "async-update":
                start = start.operands[0]
            root = start.called_computations[0].root if start.called_computations else None
            if root is None or root.opcode != wrapped_op:
                raise c.error(f"expect async wrapped opcode to be "
                              f"{root.opcode if root is not None else '?'}, but got {wrapped_op}",
                              x.op_pos)
            if thread is not None and thread != (start.attrs.async_execution_thread or "main"):
                raise c.error(f"expect async_execution_thread to be "
                              f"{start.attrs.async_execution_thread or 'main'}, but got {thread}",
                              x.op_pos)
            y = _Inst(kind, x.shape, x.name, x.name_pos, x.op_pos)
            y.operands = x.operands
            self.copy_generic(x, y)
            y.sharding = x.sharding
            y.control = x.control
            self.finish_instruction(cc, y, is_root)
            return
        shape = x.shape
        if not shape.is_tuple or len(shape.tuple_shapes) < 2 or not shape.tuple_shapes[0].is_tuple:
            raise c.error("AsyncStart expects the op shape to be in the form of "
                          "((async-operands), async-outputs, state).", x.op_pos)
        # The wrapped computation: one parameter per operand and the op as root.
        wc = _Comp("async_wrapped", x.name_pos, False)
        wc.thread = "" if thread in (None, "main") else thread
        self.comps.insert(self.comps.index(cc), wc)
        params = []
        for i, operand in enumerate(x.operands):
            px = _Inst("parameter", operand.shape, "async_param", x.name_pos, x.op_pos)
            px.attrs.parameter_number = i
            self.finish_instruction(wc, px, False)
            params.append(wc.comp.instructions[-1])
        operands = x.operands
        orig_name = x.name
        x.operands = params
        x.shape = shape.tuple_shapes[1]
        x.name = x.opcode  # XLA names the wrapped op after its opcode
        sharding, control = x.sharding, x.control
        x.sharding, x.control = None, []
        aliasing = list(x.attrs.output_operand_aliasing)
        del x.attrs.output_operand_aliasing[:]
        self.finish_instruction(wc, x, True)
        self.finish_computation(wc)
        y = _Inst("async-start", shape, orig_name, x.name_pos, x.op_pos)
        y.operands = operands
        y.sharding, y.control = sharding, control
        self.copy_generic(x, y)
        y.attrs.async_execution_thread = wc.thread
        for e in aliasing:
            y.attrs.output_operand_aliasing.add().CopyFrom(e)
        y.extra["async_computation"] = wc.comp
        self.finish_instruction(cc, y, is_root)

    @staticmethod
    def copy_generic(src: _Inst, dst: _Inst) -> None:
        """Attributes XLA's parser sets on both an async op and its wrapped op."""
        a, b = src.attrs, dst.attrs
        for field in ("metadata", "frontend_attributes", "statistics_viz", "original_value"):
            if a.HasField(field):
                getattr(b, field).CopyFrom(getattr(a, field))
        b.backend_config = a.backend_config

    def finish_instruction(self, cc: _Comp, x: _Inst, is_root: bool) -> None:
        c = self.c
        op = x.opcode
        a = x.attrs
        wrapped_comp = x.extra.get("async_computation")
        for req in (_REQUIRED.get(op, ()) if wrapped_comp is None else ()):
            if req not in x.seen:
                raise c.error(f"attribute {req} is expected but not seen for {op} '{x.name}'",
                              x.op_pos)
        if op == "broadcast" and "dimensions" not in x.seen:
            if x.operands and x.operands[0].shape.rank != 0:
                raise c.error(f"attribute dimensions is expected but not seen for broadcast "
                              f"'{x.name}'", x.op_pos)
        if op == "conditional":
            pred = bool(x.operands) and x.operands[0].shape.element_type == P.PRED
            need = ("true_computation", "false_computation") if pred else ("branch_computations",)
            for req in need:
                if req not in x.seen:
                    raise c.error(f"attribute {req} is expected but not seen for conditional "
                                  f"'{x.name}'", x.op_pos)
        a.metadata.SetInParent()
        a.frontend_attributes.SetInParent()
        a.statistics_viz.SetInParent()
        fin = _FINISH.get(op)
        if fin is not None:
            fin(x)
        inst = Instruction(op, x.shape, x.operands, x.name, a)
        inst.parent = cc.comp
        if x.sharding is not None:
            inst.sharding = x.sharding
        if x.control:
            inst.control_predecessors = x.control
        if op == "parameter":
            cc.params[a.parameter_number] = inst
        if wrapped_comp is not None:
            inst.called_computations = [wrapped_comp]
        elif x.calls:
            calls = self.ordered_calls(x)
            if calls:
                self.pending.append((inst, calls))
        cc.comp.instructions.append(inst)
        cc.table[x.name] = inst
        if is_root:
            if cc.root_name is not None:
                raise c.error("one computation should have only one ROOT", x.name_pos)
            cc.root_name = x.name

    def ordered_calls(self, x: _Inst) -> list[tuple[str, int]]:
        k = x.calls
        op = x.opcode
        named = _opcodes.CALLED_ATTRS.get(op)
        if named is not None:   # (while: body, condition; select-and-scatter: select, scatter)
            return [call for attr in named for call in k[attr]]
        if op == "conditional":
            if "branch_computations" in k:
                return k["branch_computations"]
            return k["true_computation"] + k["false_computation"]
        if "to_apply" in k and "called_computations" in k:
            raise self.c.error("a single instruction can't have both to_apply and "
                               "called_computations", x.op_pos)
        out: list[tuple[str, int]] = []
        for key in ("to_apply", "calls", "called_computations"):
            out.extend(k.get(key, ()))
        return out

    # -- assembly -------------------------------------------------------------------------
    def build(self) -> Module:
        c = self.c
        entry_cc = next((cc for cc in self.comps if cc.entry), self.comps[-1])
        name = self.name or f"module_{entry_cc.name}"
        module = Module(name)
        ma = self.module_attrs
        ma.input_output_alias.SetInParent()
        ma.buffer_donor.SetInParent()
        ma.frontend_attributes.SetInParent()
        module.attrs = ma
        for inst, calls in self.pending:
            resolved = []
            for cname, pos in calls:
                cc = self.comp_by_name.get(cname)
                if cc is None:
                    raise c.error(f"unknown computation '{cname}'", pos)
                resolved.append(cc.comp)
            inst.called_computations = resolved
            if inst.opcode == "fusion":
                for comp in resolved:
                    comp.is_fusion_computation = True
        uniquer = _NameUniquer()
        comp_uniquer = _NameUniquer()
        for k, cc in enumerate(self.comps, start=1):
            comp = cc.comp
            comp.name = comp_uniquer.unique(comp.name)
            comp.id = k
            comp.module = module
            comp.attrs = hlo_pb2.HloComputationProto()
            module.computations.append(comp)
            module.reserve_name(comp.name)
            base = k << 32
            for n, inst in enumerate(comp.instructions, start=1):
                inst.name = uniquer.unique(inst.name)
                inst.id = base | n
                module.reserve_name(inst.name)
            module.note_computation_id(k)
            module.note_instruction_id(base | len(comp.instructions))
        module.entry = entry_cc.comp
        self.host_program_shape(module)
        if self.scheduled:
            sched = ma.schedule
            sched.SetInParent()
            for comp in module.computations:
                if not comp.is_fusion_computation:
                    sched.sequences[comp.id].instruction_ids.extend(i.id for i in comp.instructions)
        module.sort_computations()
        return module

    def host_program_shape(self, module: Module) -> None:
        from hlo_spmd.ir.proto_io import shape_to_proto

        entry = module.entry
        params = entry.parameters
        hps = module.attrs.host_program_shape
        if self.entry_layout is not None:
            lp, lr = self.entry_layout
            if len(lp) != len(params):
                raise self.c.error(f"entry_computation_layout has {len(lp)} parameters but the "
                                   f"entry computation has {len(params)}", 0)
            shapes, result = lp, lr
        else:
            shapes, result = [p.shape for p in params], entry.root.shape
        for i, s in enumerate(shapes):
            hps.parameters.add().CopyFrom(shape_to_proto(s))
            hps.parameter_names.append(f"p{i}")
        hps.result.CopyFrom(shape_to_proto(result))


def parse_module_with_config(text: str, source: str = "<text>") -> tuple[Module, dict]:
    """Like parse_module, also returning the header's HloModuleConfig fields
    (replica_count, num_partitions, alias_passthrough_params, allow_spmd_...)."""
    p = _Parser(text, source)
    module = p.parse()
    module.config = dict(p.config)
    return module, dict(p.config)


def parse_module(text: str, source: str = "<text>") -> Module:
    """Parse HLO text into a Module (see the module docstring for the accepted syntax)."""
    return parse_module_with_config(text, source)[0]
