"""Every HLO opcode the IR knows, with the facts passes and the verifier key on.

Per-op behaviour elsewhere is table-driven off these sets, never long if-chains.
"""
from __future__ import annotations

# Names exactly as XLA spells them (xla/hlo/ir/hlo_opcode.h): "sine", "cosine",
# "count-leading-zeros", "opt-barrier", "topk".
ELEMENTWISE_UNARY = frozenset({
    "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "cbrt", "ceil",
    "count-leading-zeros", "convert", "cosine", "cosh", "erf", "exponential",
    "exponential-minus-one", "floor", "imag", "is-finite", "log", "log-plus-one", "logistic",
    "negate", "not", "popcnt", "real", "reduce-precision", "round-nearest-afz",
    "round-nearest-even", "rsqrt", "sign", "sine", "sinh", "sqrt", "tan", "tanh", "copy",
    "bitcast-convert",
})
# stochastic-convert is binary: (operand, random bits).
ELEMENTWISE_BINARY = frozenset({
    "add", "atan2", "complex", "compare", "divide", "maximum", "minimum", "multiply", "power",
    "remainder", "shift-left", "shift-right-arithmetic", "shift-right-logical", "subtract",
    "and", "or", "xor", "stochastic-convert", "mulhi",
})
ELEMENTWISE_TERNARY = frozenset({"select", "clamp"})
ELEMENTWISE = ELEMENTWISE_UNARY | ELEMENTWISE_BINARY | ELEMENTWISE_TERNARY | {"map"}

COLLECTIVES = frozenset({
    "all-gather", "all-gather-start", "all-gather-done", "all-reduce", "all-reduce-start",
    "all-reduce-done", "all-to-all", "ragged-all-to-all", "collective-broadcast",
    "collective-permute", "collective-permute-start", "collective-permute-done",
    "reduce-scatter", "collective-reduce",
})

OTHER = frozenset({
    "add-dependency", "after-all", "async-start", "async-update", "async-done",
    "batch-norm-grad", "batch-norm-inference", "batch-norm-training", "bitcast", "broadcast",
    "call", "cholesky", "concatenate", "conditional", "constant", "convolution", "copy-start",
    "copy-done", "custom-call", "domain", "dot", "dynamic-reshape", "dynamic-slice",
    "dynamic-update-slice", "fft", "fusion", "gather", "get-dimension-size",
    "set-dimension-size", "get-tuple-element", "infeed", "iota", "outfeed", "pad", "parameter",
    "partition-id", "recv", "recv-done", "reduce", "reduce-window", "replica-id", "reshape",
    "reverse", "rng", "rng-get-and-update-state", "rng-bit-generator", "scatter",
    "select-and-scatter", "send", "send-done", "slice", "sort", "topk", "transpose",
    "triangular-solve", "tuple", "while", "opt-barrier", "ragged-dot", "scaled-dot", "scan",
    "shuffle",
})

ALL_OPCODES = ELEMENTWISE | COLLECTIVES | OTHER

# Fixed operand counts, checked by the verifier (variadic ops are absent).
ARITY: dict[str, int] = {
    **{op: 1 for op in ELEMENTWISE_UNARY},
    **{op: 2 for op in ELEMENTWISE_BINARY},
    **{op: 3 for op in ELEMENTWISE_TERNARY},
    "parameter": 0, "constant": 0, "iota": 0, "partition-id": 0, "replica-id": 0,
    "broadcast": 1, "reshape": 1, "transpose": 1, "slice": 1, "reverse": 1, "pad": 2,
    # dot and convolution are absent: newer XLA gives them extra operands (block scales,
    # sparsity metadata) named by block_scaling_config / sparsity_config.
    "get-tuple-element": 1, "gather": 2, "bitcast": 1,
    "while": 1, "cholesky": 1, "triangular-solve": 2, "fft": 1, "topk": 1,
    "get-dimension-size": 1, "set-dimension-size": 2, "add-dependency": 2,
    "rng-get-and-update-state": 0, "rng-bit-generator": 1, "select-and-scatter": 3,
}

# Ops whose result depends on something other than operand values: never duplicated,
# never removed as dead code.
SIDE_EFFECTING = frozenset({
    "infeed", "outfeed", "send", "send-done", "recv", "recv-done", "rng",
    "rng-get-and-update-state", "after-all", "all-reduce-start", "all-gather-start",
    "collective-permute-start", "async-start", "async-done", "async-update",
})


def is_known(opcode: str) -> bool:
    return opcode in ALL_OPCODES


def is_elementwise(opcode: str) -> bool:
    return opcode in ELEMENTWISE

#: Ops linear in every operand: applied to partial sums (unreduced values) they give
#: partial sums of the result. Custom-calls are the sharding annotations and manual
#: boundaries here; tuple / get-tuple-element only move values.
LINEAR_OPS = frozenset({"add", "subtract", "negate", "copy", "reshape", "transpose",
                        "broadcast", "slice", "reverse", "concatenate", "bitcast", "dot",
                        "get-tuple-element", "tuple", "custom-call"})
