"""Named baseline shardings on the search's mesh, priced beside the winner in the report
(and used as starting points of the search):

* ``data_parallel``: the batch dim of every data parameter over all devices, weights
  replicated;
* ``fsdp``: as data parallel, and every weight (optimizer state included) sharded on its
  largest evenly divisible dim over all devices (ZeRO-3 / FSDP);
* ``megatron``: the batch dim on the first mesh axis; on the last axis, weight matrices
  alternate column-parallel (a non-contracting dim of the weight in its dot) and
  row-parallel (a contracting dim) along the chain of weight dots, as Megatron-LM does;
  a weight that feeds no dot (an optimizer state) copies the spec of the dot weight of
  the same shape in the same position. Needs two mesh axes or more.
* ``megatron_fsdp``: Megatron on the last axis, and every weight Megatron shards (and
  its optimizer states) also sharded over the first axis on its largest evenly
  divisible dim the last axis leaves free; the rest replicated, as in Megatron (2-D
  tensor parallel with weight-update sharding, FSDP x TP). Needs two mesh axes or more.

Which parameters are data and which are weights is read from the program: the first
dot or convolution a parameter reaches (through converts, copies, bitcasts, reshapes and
transposes) takes activations as operand 0 and weights as operand 1 (what JAX, PyTorch/XLA
and TF emit for ``x @ w`` and convolutions); a parameter whose same-shape elementwise
descendants (a layer norm of it) reach a contraction as operand 0 is data too. A
parameter that reaches none is data when it is an integer array (token ids, labels) or
has the data parameters' leading dim, else a weight.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from hlo_spmd.ir.instruction import Instruction
from hlo_spmd.ir.module import Module
from hlo_spmd.ir.opcodes import (CONTRACTIONS, WEIGHT_PASS_THROUGH, WEIGHT_SAME_DIMS,
                                 is_elementwise)
from hlo_spmd.ir.primitive_types import is_integral
from hlo_spmd.search.candidates import Mesh, Spec, replicated

# (the table's ``weight-*`` traits: a weight passes through these to its contraction;
# the first keep its dims)
_TRANSPARENT = WEIGHT_PASS_THROUGH
_SAME_DIMS = WEIGHT_SAME_DIMS


class _Use:
    """The first dot / convolution a weight reaches: the weight's contracting and
    non-contracting dims (None when a reshape or transpose hides them) and its depth in
    the chain of weight dots."""
    __slots__ = ("contracting", "free", "depth")

    def __init__(self, contracting: list[int] | None, free: list[int] | None,
                 depth: int) -> None:
        self.contracting = contracting
        self.free = free
        self.depth = depth


def _operand_dims(inst: Instruction, k: int) -> tuple[list[int], list[int]]:
    """(contracting, non-contracting and non-batch) dims of operand ``k`` of a dot /
    convolution (for a convolution kernel: input feature, output feature)."""
    rank = inst.operands[k].shape.rank
    if inst.opcode == "dot":
        dn = inst.attrs.dot_dimension_numbers
        con = list(dn.lhs_contracting_dimensions if k == 0 else dn.rhs_contracting_dimensions)
        bat = list(dn.lhs_batch_dimensions if k == 0 else dn.rhs_batch_dimensions)
    else:
        dn = inst.attrs.convolution_dimension_numbers
        if k == 0:
            con, bat = [dn.input_feature_dimension], [dn.input_batch_dimension]
        else:
            return [dn.kernel_input_feature_dimension], [dn.kernel_output_feature_dimension]
    return con, [d for d in range(rank) if d not in con and d not in bat]


def classify(module: Module, params: Sequence[Instruction]) -> tuple[set[int], dict[int, _Use]]:
    """(parameter numbers of data parameters, first dot use of each weight by number)."""
    comp = module.entry
    origin: dict[Instruction, tuple[Instruction, bool]] = {}  # value -> (param, same dims)
    for p in comp.parameters:
        origin[p] = (p, True)
    depth: dict[Instruction, int] = {}
    role: dict[int, str] = {}
    uses: dict[int, _Use] = {}
    # value -> parameter it is computed from by same-shape elementwise ops (a layer
    # norm of the input): such a value reaching a contraction as activations makes its
    # parameter data; it never makes a weight (a gradient computed from the labels
    # reaches the weight-gradient dots as operand 1).
    flow: dict[Instruction, Instruction] = {p: p for p in comp.parameters}
    for inst in comp.instructions:
        d_in = max((depth.get(o, 0) for o in inst.operands), default=0)
        depth[inst] = d_in
        if inst.opcode in _TRANSPARENT and len(inst.operands) == 1 and inst.operands[0] in origin:
            p, same = origin[inst.operands[0]]
            origin[inst] = (p, same and inst.opcode in _SAME_DIMS)
            continue
        if is_elementwise(inst.opcode) or inst.opcode in _TRANSPARENT:
            src_p = next((flow[o] for o in inst.operands
                          if o in flow and o.shape.dims == inst.shape.dims), None)
            if src_p is not None:
                flow[inst] = src_p
            continue
        if inst.opcode not in CONTRACTIONS or len(inst.operands) != 2:
            continue
        lhs = flow.get(inst.operands[0])
        if lhs is not None and lhs.parameter_number not in role and \
                inst.operands[0] not in origin:
            role[lhs.parameter_number] = "data"
        weight_dot = False
        for k in (0, 1):
            src = origin.get(inst.operands[k])
            if src is None:
                continue
            p, same = src
            n = p.parameter_number
            if n in role:
                weight_dot |= role[n] == "weight" and k == 1
                continue
            role[n] = "data" if k == 0 else "weight"
            if k == 1:
                weight_dot = True
                con, free = _operand_dims(inst, 1)
                uses[n] = _Use(con if same else None, free if same else None, d_in)
        if weight_dot:
            depth[inst] = d_in + 1
    data = {n for n, r in role.items() if r == "data"}
    lead = Counter(p.shape.dims[0] for p in params
                   if p.parameter_number in data and p.shape.rank)
    batch = lead.most_common(1)[0][0] if lead else None
    for p in params:
        n = p.parameter_number
        if n in role or not p.shape.is_array:
            continue
        if is_integral(p.shape.element_type) or (p.shape.rank and p.shape.dims[0] == batch):
            data.add(n)
    return data, uses


def _all_axes(mesh: Mesh):
    names = tuple(n for n, _ in mesh)
    return names[0] if len(names) == 1 else names


def _on(rank: int, dim: int, axes) -> Spec:
    return tuple(axes if d == dim else None for d in range(rank))


def _batch_spec(p: Instruction, mesh: Mesh, axes) -> Spec:
    """The batch dim (dim 0) over ``axes``, or over the longest major-first prefix of
    them that divides it (a batch of 4 on 2x4 devices: over the first axis only)."""
    dims = p.shape.dims
    names = list(axes) if isinstance(axes, tuple) else [axes]
    sizes = dict(mesh)
    while names and dims and dims[0] % math.prod(sizes[n] for n in names):
        names.pop()
    if not dims or not names:
        return replicated(len(dims))
    return _on(len(dims), 0, names[0] if len(names) == 1 else tuple(names))


def baselines(module: Module, params: Sequence[Instruction], mesh: Mesh) -> dict[str, dict[int, Spec]]:
    """Name -> assignment (parameter number -> spec) of ``params`` (the free ones)."""
    data, uses = classify(module, params)
    everything = _all_axes(mesh)
    n_dev = math.prod(s for _, s in mesh)
    out: dict[str, dict[int, Spec]] = {}
    dp, fsdp = {}, {}
    for p in params:
        k, dims = p.parameter_number, p.shape.dims
        if k in data:
            dp[k] = fsdp[k] = _batch_spec(p, mesh, everything)
            continue
        dp[k] = replicated(len(dims))
        even = [d for d in range(len(dims)) if dims[d] % n_dev == 0]
        best = max(even, key=lambda d: (dims[d], -d)) if even else None
        fsdp[k] = replicated(len(dims)) if best is None else _on(len(dims), best, everything)
    out["data_parallel"] = dp
    out["fsdp"] = fsdp
    if len(mesh) >= 2:
        first, (last, last_size) = mesh[0][0], mesh[-1]
        meg: dict[int, Spec] = {}
        by_shape: dict[tuple, list[Spec]] = {}
        for p in params:  # dot weights first: the optimizer states copy them
            k, dims = p.parameter_number, p.shape.dims
            if k in data:
                meg[k] = _batch_spec(p, mesh, first)
            elif k in uses:
                use = uses[k]
                pick = use.free if use.depth % 2 == 0 else use.contracting
                if pick is None:  # dims hidden by a reshape: last dim / first dim
                    pick = [len(dims) - 1] if use.depth % 2 == 0 else [0]
                pick = [d for d in pick if dims[d] % last_size == 0]
                meg[k] = _on(len(dims), pick[0], last) if pick else replicated(len(dims))
                by_shape.setdefault(tuple(dims), []).append(meg[k])
        seen: Counter = Counter()
        for p in params:
            k, dims = p.parameter_number, tuple(p.shape.dims)
            if k in meg:
                continue
            same = by_shape.get(dims)
            if same:
                meg[k] = same[seen[dims] % len(same)]
                seen[dims] += 1
            else:
                meg[k] = replicated(len(dims))
        out["megatron"] = meg
        first_size = mesh[0][1]
        two_d: dict[int, Spec] = {}
        for p in params:
            k, dims = p.parameter_number, p.shape.dims
            spec = meg[k]
            free_dims = [d for d in range(len(dims))
                         if spec[d] is None and dims[d] % first_size == 0]
            if k in data or not free_dims or all(d is None for d in spec):
                two_d[k] = spec
                continue
            best = max(free_dims, key=lambda d: (dims[d], -d))
            two_d[k] = tuple(first if d == best else spec[d] for d in range(len(dims)))
        out["megatron_fsdp"] = two_d
    return out


__all__ = ["baselines", "classify"]
