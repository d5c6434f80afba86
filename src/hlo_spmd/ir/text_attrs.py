"""Text of HLO attribute values, both directions, exactly as XLA prints / parses them.

Formatters take proto messages (the fields of ``Instruction.attrs``) and return the text
after ``name=``; parsers read that text at a ``Cursor`` and return or fill proto
messages.  The per-opcode attribute *order* lives in text_printer, the attribute-name
dispatch table in text_parser; this module only knows values.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Sequence

from hlo_spmd.ir.comparison import (  # noqa: F401  (re-exported)
    COMPARISON_ORDERS, COMPARISON_TYPES, default_comparison_type)
from hlo_spmd.ir.primitive_types import PrimitiveType
from hlo_spmd.ir.text_lexer import Cursor, c_escape, lexes_as_json_dict
from hlo_spmd.proto import hlo_pb2, xla_data_pb2

P = PrimitiveType

# -- enums ---------------------------------------------------------------------------------
COMPARISON_DIRECTIONS = ("EQ", "NE", "GE", "GT", "LE", "LT")
FUSION_KINDS = ("kLoop", "kInput", "kOutput", "kCustom")


def enum_names(enum_type) -> dict[str, int]:
    return {v.name: v.number for v in enum_type.DESCRIPTOR.values}


def lower_enum_map(enum_type, strip_prefix: str = "") -> dict[str, int]:
    """lowercase(name without prefix) -> value, XLA's StringToEnum convention."""
    out = {}
    for v in enum_type.DESCRIPTOR.values:
        name = v.name
        if strip_prefix and name.startswith(strip_prefix):
            name = name[len(strip_prefix):]
        out[name.lower()] = v.number
    return out


def lower_enum_name(enum_type, value: int, strip_prefix: str = "") -> str:
    name = enum_type.DESCRIPTOR.values_by_number[value].name
    if strip_prefix and name.startswith(strip_prefix):
        name = name[len(strip_prefix):]
    return name.lower()


PRECISION = xla_data_pb2.PrecisionConfig.Precision
ALGORITHM = xla_data_pb2.PrecisionConfig.Algorithm
PRECISION_BY_NAME = lower_enum_map(xla_data_pb2.PrecisionConfig.Precision)
ALGORITHM_BY_NAME = lower_enum_map(xla_data_pb2.PrecisionConfig.Algorithm, "ALG_")
DISTRIBUTION_BY_NAME = lower_enum_map(xla_data_pb2.RandomDistribution)
RNG_ALGORITHM_BY_NAME = lower_enum_map(xla_data_pb2.RandomAlgorithm)
SCHEDULE_BY_NAME = lower_enum_map(hlo_pb2.CustomCallSchedule)
API_VERSION_BY_NAME = lower_enum_map(hlo_pb2.CustomCallApiVersion)
FFT_BY_NAME = enum_names(xla_data_pb2.FftType)
PADDING_TYPE_BY_NAME = enum_names(xla_data_pb2.PaddingType)
ACCURACY_MODE_BY_NAME = lower_enum_map(xla_data_pb2.ResultAccuracy.Mode)
TRANSPOSE_BY_NAME = enum_names(xla_data_pb2.TriangularSolveOptions.Transpose)
CONV_KIND_BY_NAME = {"unset": 0, "fprop": 1, "dgrad": 2, "wgrad": 3}
CONV_KIND_NAMES = {v: k for k, v in CONV_KIND_BY_NAME.items()}


def sparsity_config_text(cfg: Any) -> str:
    """A convolution's ``SparsityConfig`` body: ``lhs={sparsity=1x2 dimension=3 stride=1}``."""
    parts = []
    for side in ("lhs", "rhs"):
        if cfg.HasField(side):
            t = getattr(cfg, side)
            # idx (the metadata operand, newer XLA) only when set: older parsers reject it.
            idx = f" idx={t.idx}" if t.idx else ""
            parts.append(f"{side}={{sparsity={t.num_non_zero}x{t.block_size} "
                         f"dimension={t.dimension} stride={t.stride}{idx}}}")
    return " ".join(parts)


def block_scaling_config_text(cfg: Any) -> str:
    """A dot's / convolution's ``BlockScalingConfig`` body, as newer XLA prints it:
    ``lhs={scale_idx=2 zero_idx=3 strides=1x32 steps=1x1} rhs={...}``."""
    parts = []
    for side in ("lhs", "rhs"):
        if cfg.HasField(side):
            t = getattr(cfg, side)
            items = [f"scale_idx={t.scale_idx}"]
            if t.HasField("zero_idx"):
                items.append(f"zero_idx={t.zero_idx}")
            if len(t.strides):
                items.append("strides=" + "x".join(map(str, t.strides)))
            if len(t.steps):
                items.append("steps=" + "x".join(map(str, t.steps)))
            parts.append(f"{side}={{" + " ".join(items) + "}")
    return " ".join(parts)


def has_sides(cfg: Any) -> bool:
    """A sparsity / block-scaling config that says something (XLA prints only those)."""
    return cfg.HasField("lhs") or cfg.HasField("rhs")


# -- small lists ---------------------------------------------------------------------------
def int_list(values: Iterable[int]) -> str:
    return "{" + ",".join(map(str, values)) + "}"


def shape_index_text(index: Sequence[int]) -> str:
    return "{" + ",".join(map(str, index)) + "}"


# -- windows, padding, dimension numbers -------------------------------------------------------
def window_text(w: xla_data_pb2.Window) -> str:
    dims = w.dimensions
    parts = ["size=" + "x".join(str(d.size) for d in dims)]
    if any(d.stride != 1 for d in dims):
        parts.append("stride=" + "x".join(str(d.stride) for d in dims))
    if any(d.padding_low != 0 or d.padding_high != 0 for d in dims):
        parts.append("pad=" + "x".join(f"{d.padding_low}_{d.padding_high}" for d in dims))
    if any(d.base_dilation != 1 for d in dims):
        parts.append("lhs_dilate=" + "x".join(str(d.base_dilation) for d in dims))
    if any(d.window_dilation != 1 for d in dims):
        parts.append("rhs_dilate=" + "x".join(str(d.window_dilation) for d in dims))
    if any(d.window_reversal for d in dims):
        parts.append("rhs_reversal=" + "x".join("1" if d.window_reversal else "0" for d in dims))
    return "{" + " ".join(parts) + "}"


_DXD = re.compile(r"-?[0-9]+(?:x-?[0-9]+)*")
_PAD = re.compile(r"-?[0-9]+_-?[0-9]+(?:_-?[0-9]+)?(?:x-?[0-9]+_-?[0-9]+(?:_-?[0-9]+)?)*")


def parse_window(c: Cursor) -> xla_data_pb2.Window:
    start = c.expect("{", f"expected '{{' to start window attribute")
    fields: dict[str, list] = {}
    while not c.eat("}"):
        pos = c.skip_ws()
        name = c.attr_name()
        if name is None:
            raise c.error(f"expects sub-attributes in window but found {c.describe(pos)}", pos)
        if name in fields:
            raise c.error(f"sub-attribute '{name}=' already exists", pos)
        if name == "pad":
            m = c.match(_PAD)
            if m is None:
                raise c.error("expects window pad pattern, e.g., '0_0x3_3'")
            pads = []
            for p in m.group(0).split("x"):
                lh = [int(v) for v in p.split("_")]
                if len(lh) != 2:
                    raise c.error("expects padding_low and padding_high separated by '_'", pos)
                pads.append(lh)
            fields["pad"] = pads
        elif name in ("size", "stride", "lhs_dilate", "rhs_dilate", "rhs_reversal"):
            m = c.match(_DXD)
            if m is None:
                raise c.error(f"expects '{name}=' values like 3x3 but found {c.describe()}")
            fields[name] = [int(v) for v in m.group(0).split("x")]
        else:
            raise c.error(f"unexpected attribute name in window: {name}", pos)
    size = fields.get("size", [])
    for k, v in fields.items():
        if len(v) != len(size):
            raise c.error(f"expects '{k}=' has the same size as 'size='", start)
    w = xla_data_pb2.Window()
    for i, s in enumerate(size):
        d = w.dimensions.add()
        d.size = s
        if "pad" in fields:
            d.padding_low, d.padding_high = fields["pad"][i]
        d.stride = fields["stride"][i] if "stride" in fields else 1
        d.base_dilation = fields["lhs_dilate"][i] if "lhs_dilate" in fields else 1
        d.window_dilation = fields["rhs_dilate"][i] if "rhs_dilate" in fields else 1
        d.window_reversal = bool(fields["rhs_reversal"][i] == 1) if "rhs_reversal" in fields else False
    return w


def padding_text(pc: xla_data_pb2.PaddingConfig) -> str:
    dims = pc.dimensions
    interior = any(d.interior_padding != 0 for d in dims)
    if interior:
        return "x".join(f"{d.edge_padding_low}_{d.edge_padding_high}_{d.interior_padding}"
                        for d in dims)
    return "x".join(f"{d.edge_padding_low}_{d.edge_padding_high}" for d in dims)


def parse_padding(c: Cursor) -> xla_data_pb2.PaddingConfig:
    pos = c.skip_ws()
    m = c.match(_PAD)
    if m is None:
        raise c.error(f"expects padding config, e.g., '0_0_0x3_3_1' but found {c.describe(pos)}", pos)
    pc = xla_data_pb2.PaddingConfig()
    for part in m.group(0).split("x"):
        v = [int(x) for x in part.split("_")]
        d = pc.dimensions.add()
        d.edge_padding_low, d.edge_padding_high = v[0], v[1]
        d.interior_padding = v[2] if len(v) == 3 else 0
    return pc


def dim_labels_text(dn: xla_data_pb2.ConvolutionDimensionNumbers) -> str:
    def side(a: int, b: int, spatial, la: str, lb: str) -> str:
        n = max([a, b] + list(spatial)) + 1
        out = ["?"] * n
        out[a] = la
        out[b] = lb
        for i, d in enumerate(spatial):
            out[d] = str(i)
        return "".join(out)

    lhs = side(dn.input_batch_dimension, dn.input_feature_dimension,
               dn.input_spatial_dimensions, "b", "f")
    rhs = side(dn.kernel_input_feature_dimension, dn.kernel_output_feature_dimension,
               dn.kernel_spatial_dimensions, "i", "o")
    out = side(dn.output_batch_dimension, dn.output_feature_dimension,
               dn.output_spatial_dimensions, "b", "f")
    return f"{lhs}_{rhs}->{out}"


_DIM_LABELS = re.compile(r"([0-9bf?]{2,})_([0-9io?]{2,})->([0-9bf?]{2,})")


def parse_dim_labels(c: Cursor) -> xla_data_pb2.ConvolutionDimensionNumbers:
    pos = c.skip_ws()
    m = c.match(_DIM_LABELS)
    if m is None:
        raise c.error(f"expects dim labels pattern, e.g., 'bf0_0io->0bf' but found "
                      f"{c.describe(pos)}", pos)
    dn = xla_data_pb2.ConvolutionDimensionNumbers()

    def side(s: str, a: str, b: str, set_a, set_b, spatial, what: str) -> None:
        chars = [ch for ch in s if ch != "?"]
        if len(set(chars)) != len(chars):
            raise c.error(f"expects unique {what} dimension numbers, but sees {s}", pos)
        n_spatial = sum(1 for ch in s if ch not in (a, b, "?"))
        spatial.extend([-1] * n_spatial)
        for i, ch in enumerate(s):
            if ch == "?":
                continue
            if ch == a:
                set_a(i)
            elif ch == b:
                set_b(i)
            elif "0" <= ch < chr(ord("0") + len(s)) and int(ch) < n_spatial:
                spatial[int(ch)] = i
            else:
                raise c.error(f"expects [0-{len(s) - 1}{a}{b}?] in {what} dimension numbers", pos)

    side(m.group(1), "b", "f", lambda i: setattr(dn, "input_batch_dimension", i),
         lambda i: setattr(dn, "input_feature_dimension", i), dn.input_spatial_dimensions, "lhs")
    side(m.group(2), "i", "o", lambda i: setattr(dn, "kernel_input_feature_dimension", i),
         lambda i: setattr(dn, "kernel_output_feature_dimension", i),
         dn.kernel_spatial_dimensions, "rhs")
    side(m.group(3), "b", "f", lambda i: setattr(dn, "output_batch_dimension", i),
         lambda i: setattr(dn, "output_feature_dimension", i), dn.output_spatial_dimensions,
         "output")
    if not (len(dn.input_spatial_dimensions) == len(dn.kernel_spatial_dimensions) ==
            len(dn.output_spatial_dimensions)):
        raise c.error("input, kernel, and output must have same number of spatial dimensions",
                      pos)
    return dn


def dot_dims_attrs(dn: xla_data_pb2.DotDimensionNumbers) -> list[str]:
    out = []
    if len(dn.lhs_batch_dimensions):
        out.append("lhs_batch_dims=" + int_list(dn.lhs_batch_dimensions))
    out.append("lhs_contracting_dims=" + int_list(dn.lhs_contracting_dimensions))
    if len(dn.rhs_batch_dimensions):
        out.append("rhs_batch_dims=" + int_list(dn.rhs_batch_dimensions))
    out.append("rhs_contracting_dims=" + int_list(dn.rhs_contracting_dimensions))
    return out


def precision_attrs(pc: xla_data_pb2.PrecisionConfig) -> list[str]:
    out = []
    if any(p != 0 for p in pc.operand_precision):
        out.append("operand_precision={" + ",".join(
            lower_enum_name(PRECISION, p) for p in pc.operand_precision) + "}")
    if pc.algorithm != 0:
        out.append("algorithm=" + lower_enum_name(ALGORITHM, pc.algorithm, "ALG_"))
    return out


def gather_dims_text(g: xla_data_pb2.GatherDimensionNumbers) -> str:
    s = (f"offset_dims={int_list(g.offset_dims)}, "
         f"collapsed_slice_dims={int_list(g.collapsed_slice_dims)}, "
         f"start_index_map={int_list(g.start_index_map)}")
    if len(g.operand_batching_dims):
        s += f", operand_batching_dims={int_list(g.operand_batching_dims)}"
    if len(g.start_indices_batching_dims):
        s += f", start_indices_batching_dims={int_list(g.start_indices_batching_dims)}"
    return s + f", index_vector_dim={g.index_vector_dim}"


def scatter_dims_text(s: xla_data_pb2.ScatterDimensionNumbers) -> str:
    t = (f"update_window_dims={int_list(s.update_window_dims)}, "
         f"inserted_window_dims={int_list(s.inserted_window_dims)}, "
         f"scatter_dims_to_operand_dims={int_list(s.scatter_dims_to_operand_dims)}")
    if len(s.input_batching_dims):
        t += f", input_batching_dims={int_list(s.input_batching_dims)}"
    if len(s.scatter_indices_batching_dims):
        t += f", scatter_indices_batching_dims={int_list(s.scatter_indices_batching_dims)}"
    return t + f", index_vector_dim={s.index_vector_dim}"


def slice_text(dims: Sequence[Any]) -> str:
    omit = all(d.stride == 1 for d in dims)
    if omit:
        return "{" + ", ".join(f"[{d.start}:{d.limit}]" for d in dims) + "}"
    return "{" + ", ".join(f"[{d.start}:{d.limit}:{d.stride}]" for d in dims) + "}"


def parse_slice_ranges(c: Cursor, attrs: hlo_pb2.HloInstructionProto) -> None:
    c.expect("{", f"expects '{{' to start ranges")
    if c.eat("}"):
        return
    while True:
        pos = c.skip_ws()
        r = c.int_list("[", "]", ":", "slice range")
        if len(r) not in (2, 3):
            raise c.error(f"expects [start:limit:step] or [start:limit], but sees {len(r)} "
                          "elements.", pos)
        d = attrs.slice_dimensions.add()
        d.start, d.limit = r[0], r[1]
        d.stride = r[2] if len(r) == 3 else 1
        if c.eat(","):
            continue
        c.expect("}", "expects '}}' to end ranges")
        return


# -- collectives ---------------------------------------------------------------------------
def replica_groups_text(attrs: hlo_pb2.HloInstructionProto) -> str:
    which = attrs.WhichOneof("replica_group_list")
    if which == "iota_collective_device_list":
        return iota_list_text(attrs.iota_collective_device_list)
    if which == "collective_device_list":
        cdl = attrs.collective_device_list
        if not len(cdl.replica_groups) and cdl.HasField("iota_replica_group_list"):
            return iota_list_text(cdl.iota_replica_group_list)
        groups = cdl.replica_groups
    elif which == "mesh_axes_replica_group_list":
        from hlo_spmd.sharding.named import axis_from_proto, mesh_from_proto, mesh_groups_text
        m = attrs.mesh_axes_replica_group_list
        return mesh_groups_text(mesh_from_proto(m.mesh), [axis_from_proto(a) for a in m.axes])
    else:
        groups = attrs.replica_groups
    return "{" + ",".join("{" + ",".join(map(str, g.replica_ids)) + "}" for g in groups) + "}"


def iota_list_text(iota: xla_data_pb2.IotaReplicaGroupListProto) -> str:
    s = (f"[{iota.num_replica_groups},{iota.num_devices_per_group}]<=["
         + ",".join(map(str, iota.iota_reshape_dims)) + "]")
    perm = list(iota.iota_transpose_perm)
    if len(iota.iota_reshape_dims) > 1 and perm != list(range(len(perm))):
        s += "T(" + ",".join(map(str, perm)) + ")"
    return s


def parse_replica_groups(c: Cursor, attrs: hlo_pb2.HloInstructionProto) -> None:
    """``{{0,1},{2,3}}``, the iota form ``[2,4]<=[4,2]T(1,0)`` or ``mesh['x'=2,'y'=4] {'x'}``."""
    pos = c.skip_ws()
    if c.startswith("mesh"):
        from hlo_spmd.errors import ShardingError
        from hlo_spmd.sharding.named import axis_to_proto, mesh_to_proto, parse_mesh_groups
        try:
            mesh, axes, end = parse_mesh_groups(c.text, pos)
        except ShardingError as e:
            off = getattr(e, "position", pos)
            raise c.error("bad mesh replica groups: " + e.message.split(" at character ")[0],
                          off if isinstance(off, int) else pos) from None
        m = attrs.mesh_axes_replica_group_list
        m.SetInParent()
        mesh_to_proto(mesh, m.mesh)
        for a in axes:
            axis_to_proto(a, m.axes.add())
        c.pos = end
        return
    if c.peek() == "{":
        groups = c.int_list_list("replica groups")
        cdl = attrs.collective_device_list
        cdl.SetInParent()
        for g in groups:
            cdl.replica_groups.add().replica_ids.extend(g)
        return
    dims = c.int_list("[", "]", ",", "replica group iota dims")
    if len(dims) != 2:
        raise c.error(f"expected 2 iota dimensions [groups,group_size] for replica groups, got "
                      f"{len(dims)}", pos)
    c.expect("<=", "expected '<=' in iota replica groups")
    reshape = c.int_list("[", "]", ",", "iota reshape dims")
    if not reshape:
        raise c.error("expected non-empty iota_reshape_dims", pos)
    if len(reshape) == 1:
        perm = [0]
    else:
        if not c.keyword("T"):
            raise c.error("expected 'T(' to start the iota transpose permutation")
        perm = c.int_list("(", ")", ",", "iota transpose permutation")
        if sorted(perm) != list(range(len(reshape))):
            raise c.error(f"iota transpose {perm} is not a permutation of {len(reshape)} dims", pos)
    iota = attrs.iota_collective_device_list
    iota.num_replica_groups, iota.num_devices_per_group = dims
    iota.iota_reshape_dims.extend(reshape)
    iota.iota_transpose_perm.extend(perm)


def source_target_pairs_text(pairs) -> str:
    return "{" + ",".join(f"{{{p.source},{p.target}}}" for p in pairs) + "}"


# -- aliasing ------------------------------------------------------------------------------------
def instruction_aliasing_text(entries) -> str:
    return "{" + ", ".join(
        f"{shape_index_text(e.output_shape_index)}: ({e.operand_index}, "
        f"{shape_index_text(e.operand_shape_index)})" for e in entries) + "}"


def parse_shape_index(c: Cursor) -> list[int]:
    return c.int_list("{", "}", ",", "shape index")


def parse_instruction_aliasing(c: Cursor, attrs: hlo_pb2.HloInstructionProto) -> None:
    c.expect("{", "expects '{' at the start of instruction aliasing description")
    while c.peek() != "}":
        out = parse_shape_index(c)
        c.expect(":", "expected format: <output_shape_index>: (<operand_index>, "
                      "<operand_shape_index>)")
        c.expect("(")
        idx = c.int("operand index")
        c.expect(",")
        op_index = parse_shape_index(c)
        c.expect(")")
        e = attrs.output_operand_aliasing.add()
        e.output_shape_index.extend(out)
        e.operand_index = idx
        e.operand_shape_index.extend(op_index)
        if not c.eat(","):
            break
    c.expect("}", "expects '}' at the end of instruction aliasing description")


def module_aliasing_text(alias: hlo_pb2.HloInputOutputAliasProto) -> str:
    """HloInputOutputAliasConfig::ToShortString, entries in output-index order."""
    entries = sorted(alias.entries, key=lambda e: tuple(e.output_shape_index))
    parts = []
    for e in entries:
        kind = "must-alias" if e.kind == hlo_pb2.MUST_ALIAS else "may-alias"
        parts.append(f"{shape_index_text(e.output_shape_index)}: ({e.parameter_number}, "
                     f"{shape_index_text(e.parameter_shape_index)}, {kind})")
    return ", ".join(parts)


def parse_module_aliasing(c: Cursor, alias: hlo_pb2.HloInputOutputAliasProto) -> None:
    c.expect("{", "expects '{' at the start of aliasing description")
    while c.peek() != "}":
        out = parse_shape_index(c)
        msg = ("expected format: <output_shape_index>: (<input_param>, "
               "<input_param_shape_index>) OR <output_shape_index>: <input_param>")
        c.expect(":", msg)
        c.expect("(", msg)
        param = c.int("parameter number")
        c.expect(",", msg)
        pidx = parse_shape_index(c)
        kind = hlo_pb2.MAY_ALIAS
        if c.eat(","):
            pos = c.skip_ws()
            k = c.name("alias kind")
            if k == "must-alias":
                kind = hlo_pb2.MUST_ALIAS
            elif k != "may-alias":
                raise c.error("unexpected aliasing kind; expected must-alias or may-alias", pos)
        c.expect(")", msg)
        e = alias.entries.add()
        e.output_shape_index.extend(out)
        e.parameter_number = param
        e.parameter_shape_index.extend(pidx)
        e.kind = kind
        if not c.eat(","):
            break
    c.expect("}", "expects '}' at the end of aliasing description")


def buffer_donor_text(donor: hlo_pb2.HloBufferDonorProto) -> str:
    entries = sorted(donor.entries, key=lambda e: (e.parameter_number, tuple(e.parameter_shape_index)))
    return ", ".join(f"({e.parameter_number}, {shape_index_text(e.parameter_shape_index)})"
                     for e in entries)


def parse_buffer_donor(c: Cursor, donor: hlo_pb2.HloBufferDonorProto) -> None:
    c.expect("{", "expects '{' at the start of buffer donor description")
    while c.peek() != "}":
        c.expect("(", "expected format: (<input_param>, <input_param_shape_index>)")
        param = c.int("parameter number")
        c.expect(",")
        idx = parse_shape_index(c)
        c.expect(")")
        e = donor.entries.add()
        e.parameter_number = param
        e.parameter_shape_index.extend(idx)
        if not c.eat(","):
            break
    c.expect("}", "expects '}' at the end of buffer donor description")


# -- frontend attributes, metadata, statistics, accuracy, origin --------------------------------
def frontend_attributes_text(fa: Any) -> str:
    items = sorted(fa.map.items())
    parts = []
    for k, v in items:
        if lexes_as_json_dict(v):
            parts.append(f"{k}={v}")
        else:
            parts.append(f'{k}="{c_escape(v)}"')
    return "{" + ",".join(parts) + "}"


_FA_KEY = re.compile(r"([A-Za-z_][A-Za-z0-9_.\-]*)=")


def parse_frontend_attributes(c: Cursor, fa: Any) -> None:
    c.expect("{", f"expected '{{' to start frontend attributes")
    fa.SetInParent()
    if c.eat("}"):
        return
    while True:
        pos = c.skip_ws()
        m = c.match(_FA_KEY)
        if m is None:
            raise c.error(f"expects attribute name but found {c.describe(pos)}", pos)
        if c.peek() == '"':
            value = c.string()
        elif c.peek() == "{":
            value = c.balanced("frontend attribute value")
        else:
            raise c.error(f"expects a string or a {{...}} dict for frontend attribute "
                          f"'{m.group(1)}' but found {c.describe()}")
        fa.map[m.group(1)] = value
        if c.eat(","):
            continue
        c.expect("}", "expects '}}' at the end of frontend attributes")
        return


def metadata_text(md: xla_data_pb2.OpMetadata) -> str:
    parts = []
    if md.op_type:
        parts.append(f'op_type="{c_escape(md.op_type)}"')
    if md.op_name:
        parts.append(f'op_name="{c_escape(md.op_name)}"')
    if md.source_file:
        parts.append(f'source_file="{c_escape(md.source_file)}"')
    if md.source_line:
        parts.append(f"source_line={md.source_line}")
    if md.source_end_line:
        parts.append(f"source_end_line={md.source_end_line}")
    if md.source_column:
        parts.append(f"source_column={md.source_column}")
    if md.source_end_column:
        parts.append(f"source_end_column={md.source_end_column}")
    if len(md.profile_type):
        parts.append("profile_type={" + ",".join(map(str, md.profile_type)) + "}")
    if md.deduplicated_name:
        parts.append(f'deduplicated_name="{c_escape(md.deduplicated_name)}"')
    if md.scheduling_name:
        # XLA prints this one unescaped.
        parts.append(f'scheduling_name="{md.scheduling_name}"')
    if md.stack_frame_id:
        parts.append(f"stack_frame_id={md.stack_frame_id}")
    return " ".join(parts)


def metadata_is_printed(md: xla_data_pb2.OpMetadata) -> bool:
    return bool(md.op_type or md.op_name or md.source_file or md.scheduling_name or
                md.stack_frame_id)


_MD_STRINGS = ("op_type", "op_name", "source_file", "deduplicated_name", "scheduling_name")
_MD_INTS = ("source_line", "source_end_line", "source_column", "source_end_column",
            "stack_frame_id")


def parse_metadata(c: Cursor, md: xla_data_pb2.OpMetadata) -> None:
    """``{op_type="..." op_name="..." source_line=3 ...}`` (commas optional)."""
    start = c.expect("{", f"expects '{{' to start metadata")
    md.SetInParent()
    seen: set[str] = set()
    while True:
        c.eat(",")
        if c.eat("}"):
            return
        pos = c.skip_ws()
        name = c.attr_name()
        if name is None:
            raise c.error(f"expects metadata attribute name but found {c.describe(pos)}", pos)
        if name in seen:
            raise c.error(f"attribute {name} already exists", pos)
        seen.add(name)
        if name in _MD_STRINGS:
            setattr(md, name, c.string())
        elif name in _MD_INTS:
            v = c.int()
            if not -2 ** 31 <= v < 2 ** 31:
                raise c.error("value out of range for int32_t", pos)
            setattr(md, name, v)
        elif name == "profile_type":
            md.profile_type.extend(c.int_list())
        else:
            raise c.error(f"unexpected attribute \"{name}\" in metadata", pos)
    del start


def statistics_text(sv: xla_data_pb2.StatisticsViz) -> str:
    stats = ",".join(f"{s.stat_name}={_absl_double(s.stat_val)}" for s in sv.statistics)
    return f"{{visualizing_index={sv.stat_index_to_visualize},{stats}}}"


def _absl_double(v: float) -> str:
    """absl::StrCat(double): %.6g-like shortest-of-six-digits form."""
    if v != v:
        return "nan"
    if v in (float("inf"), float("-inf")):
        return "inf" if v > 0 else "-inf"
    return "%.6g" % v


def parse_statistics(c: Cursor, sv: xla_data_pb2.StatisticsViz) -> None:
    c.expect("{", "expected '{' to start statistics")
    sv.SetInParent()
    if c.eat("}"):
        return
    pos = c.skip_ws()
    if c.attr_name() is None:
        raise c.error("expects 'visualizing_index='", pos)
    sv.stat_index_to_visualize = c.int()
    while c.eat(","):
        pos = c.skip_ws()
        name = c.attr_name()
        if name is None:
            raise c.error(f"expects statistic name but found {c.describe(pos)}", pos)
        tok = c.number_token()
        if tok is None:
            raise c.error(f"expects a number for statistic {name}")
        st = sv.statistics.add()
        st.stat_name = name
        st.stat_val = float(tok)
    c.expect("}", "expects '}' at the end of statistics")


def result_accuracy_text(ra: xla_data_pb2.ResultAccuracy) -> str | None:
    if ra.mode != 0:
        return "{mode=" + lower_enum_name(xla_data_pb2.ResultAccuracy.Mode, ra.mode) + "}"
    if ra.HasField("tolerance"):
        t = ra.tolerance
        return (f"{{tolerance={{atol={_absl_double(t.atol)},rtol={_absl_double(t.rtol)},"
                f"ulps={t.ulps}}}}}")
    return None


def parse_result_accuracy(c: Cursor, ra: xla_data_pb2.ResultAccuracy) -> None:
    c.expect("{", "expected '{' to start result_accuracy")
    pos = c.skip_ws()
    name = c.attr_name()
    if name == "mode":
        mpos = c.skip_ws()
        mode = c.ident("accuracy mode").lower()
        if mode not in ACCURACY_MODE_BY_NAME:
            raise c.error(f"expects ResultAccuracy type but sees: {mode}", mpos)
        ra.mode = ACCURACY_MODE_BY_NAME[mode]
    elif name == "tolerance":
        c.expect("{")
        tol = ra.tolerance
        tol.SetInParent()
        if not c.eat("}"):
            while True:
                tpos = c.skip_ws()
                key = c.attr_name()
                tok = c.number_token()
                if key not in ("atol", "rtol", "ulps") or tok is None:
                    raise c.error("expects atol=, rtol= or ulps= with a number", tpos)
                setattr(tol, key, int(float(tok)) if key == "ulps" else float(tok))
                if c.eat(","):
                    continue
                c.expect("}")
                break
    else:
        raise c.error(f"invalid attribute name: {name}", pos)
    c.expect("}", "expected '}' to end result_accuracy")


def original_value_text(ov: xla_data_pb2.OriginalValueProto) -> str:
    """OriginalValue::ToString: ``{"name" {1}}`` leaves, ``(...)`` tuples."""
    if ov.is_synthetic_call:
        return "[synthetic_call]"
    nodes: dict[tuple, Any] = {}
    for e in ov.elements:
        nodes[tuple(e.shape_index)] = e
    children: dict[tuple, list[tuple]] = {}
    for idx in nodes:
        if idx:
            children.setdefault(idx[:-1], []).append(idx)

    def arr_text(e) -> str:
        if e is None or not e.HasField("original_array"):
            return "{}"
        a = e.original_array
        s = '"' + a.instruction_name + '"'
        if len(a.shape_index):
            s += " " + shape_index_text(a.shape_index)
        return "{" + s + "}"

    def node(idx: tuple) -> str:
        kids = sorted(children.get(idx, []))
        if not kids:
            return arr_text(nodes.get(idx))
        return "(" + ", ".join(node(k) for k in kids) + ")"

    return node(())


def parse_original_value(c: Cursor, ov: xla_data_pb2.OriginalValueProto) -> None:
    c.expect("{", "expects '{' to start original value")
    ov.SetInParent()
    if c.eat("["):
        if not c.keyword("synthetic_call"):
            raise c.error("expects 'synthetic_call' after '['")
        c.expect("]")
        c.expect("}")
        ov.is_synthetic_call = True
        return
    leaves: list[tuple[tuple, Any]] = []
    internal: set[tuple] = set()
    index: list[int] = []
    while not c.eat("}"):
        ch = c.peek()
        if ch == "(":
            c.expect("(")
            internal.add(tuple(index))
            index.append(0)
        elif ch == ")":
            c.expect(")")
            if not index:
                raise c.error("unbalanced ')' in original value")
            index.pop()
        elif ch == ",":
            c.expect(",")
            if not index:
                raise c.error("unexpected ',' in original value")
            index[-1] += 1
        elif ch == "{":
            c.expect("{")
            arr = None
            if c.peek() == '"':
                name = c.string()
                shape_index = parse_shape_index(c) if c.peek() == "{" else []
                arr = (name, shape_index)
            c.expect("}", "expects '}' at end of original array")
            leaves.append((tuple(index), arr))
        else:
            raise c.error("expects '[synthetic]' or a tuple tree of original arrays in "
                          "original_value field")
    # Leaves in pre-order (empty ``{}`` leaves included), as OriginalValue::ToProto writes.
    del internal
    for idx, arr in sorted(leaves, key=lambda kv: kv[0]):
        e = ov.elements.add()
        e.shape_index.extend(idx)
        if arr is not None:
            e.original_array.instruction_name = arr[0]
            e.original_array.shape_index.extend(arr[1])


def triangular_solve_attrs(o: xla_data_pb2.TriangularSolveOptions) -> list[str]:
    out = []
    if o.left_side:
        out.append("left_side=true")
    if o.lower:
        out.append("lower=true")
    if o.unit_diagonal:
        out.append("unit_diagonal=true")
    if o.transpose_a:
        out.append("transpose_a=" +
                   xla_data_pb2.TriangularSolveOptions.Transpose.Name(o.transpose_a))
    return out
