"""Every HLO opcode the IR knows, with the facts passes and the verifier key on.

One table (``TRAITS``, after XLA's ``hlo_opcode.h`` and ``HloInstruction``'s opcode
predicates): a pass asks it, through the derived frozensets below (O(1) lookups on the
per-instruction paths) or ``traits(opcode)``, and keeps no opcode set of its own.
``hlo-spmd rules`` and ``tests/test_structure.py`` read it too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The trait words of ``_TABLE``:
#: elementwise   HloInstruction::IsElementwise by opcode (bitcast-convert only when the
#:               widths match: asked of the instruction, see propagation.graph)
#: side-effect   HloInstruction::HasSideEffectNoRecurse by opcode (a custom-call's flag
#:               and called computations are asked of the instruction: ``has_side_effect``
#:               in ir.computation)
#: no-buffer     the result is (or forwards) operand buffers, or a token: no buffer of its
#:               own (XLA's dataflow analysis defines no new value for these)
#: collective    a cross-device collective; ``start`` / ``done`` its asynchronous halves
#:               (``copy-start`` / ``copy-done`` are asynchronous too, not collectives)
#: async         the generic async wrapper ops (async-start / -update / -done)
#: control-flow  calls computations whose parameters and roots mirror the instruction
#: applies       applies its called computation per element (copied as it is)
#: to-apply      prints its called computation as ``to_apply=``
#: accuracy      carries a ResultAccuracy attribute
#: linear        linear in every operand: partial sums in, partial sums of the result out
#:               (custom-calls here are the sharding annotations and manual boundaries;
#:               tuple / get-tuple-element only move values)
#: reducer       recognised as a reducer computation's root (commutative, associative)
#: idempotent    a reducer with ``x op x == x``
#: global-ids    carries ``use_global_device_ids`` (with a channel id and without it,
#:               the collective is cross-replica-and-partition)
#: device-id     its value is the id of the device that runs it
#: newer         an opcode of a newer XLA than jaxlib 0.10.2 (its text parser rejects it)
#: contraction   contracts operand dimensions (dot and convolution: one dims model)
#: declared-*    shape inference takes part of the result from the declared shape:
#:               -shape the whole shape, -type the element type, -dims the dimensions,
#:               -optional the element type / group size when one is declared
#: Sharding propagation (sharding_propagation.cc keeps these in its switch statements):
#: spatial       SupportSpatialPartitioning: the partitioner can split it (plus batch
#:               norm, which handlers/batch_norm.py splits and XLA replicates)
#: pass-through  CanPropagateThroughAtAggressiveLevel at every level
#: follows-first PickRepresentativeOperand: the result follows operand 0
#: follows-finest PickRepresentativeOperand: the result follows its most specific operand
#:               (as elementwise ops do)
_WORDS = frozenset({"newer", "device-id", "elementwise", "side-effect", "no-buffer", "collective", "start", "done",
                    "async", "control-flow", "applies", "to-apply", "accuracy", "linear",
                    "reducer", "idempotent", "global-ids", "contraction", "declared-shape",
                    "declared-type", "declared-dims", "declared-optional", "spatial",
                    "pass-through", "follows-first", "follows-finest"})

# opcode: (arity as hlo_opcode.h spells it for jaxlib 0.10.2, None = variadic; traits).
# Names exactly as XLA spells them: "sine", "cosine", "count-leading-zeros", "opt-barrier".
# "atan", "collective-reduce", "shuffle": newer XLA opcodes the IR accepts.
_TABLE: dict[str, tuple[int | None, str]] = {
    "abs":                      (1, "elementwise"),
    "acos":                     (1, "elementwise accuracy"),
    "acosh":                    (1, "elementwise accuracy"),
    "add":                      (2, "elementwise linear reducer"),
    "add-dependency":           (2, "no-buffer"),
    "after-all":                (None, "no-buffer"),
    "all-gather":               (None, "collective global-ids follows-finest declared-optional"),
    "all-gather-done":          (1, "side-effect collective done"),
    "all-gather-start":         (None, "side-effect collective start global-ids declared-optional"),
    "all-reduce":               (None, "collective to-apply global-ids spatial follows-finest"),
    "all-reduce-done":          (1, "side-effect collective done"),
    "all-reduce-start":         (None, "side-effect collective to-apply start global-ids"),
    "all-to-all":               (None, "collective follows-finest"),
    "and":                      (2, "elementwise reducer idempotent"),
    "asin":                     (1, "elementwise accuracy"),
    "asinh":                    (1, "elementwise accuracy"),
    "async-done":               (1, "async declared-shape"),
    "async-start":              (None, "async declared-shape"),
    "async-update":             (1, "async declared-shape"),
    "atan":                     (1, "elementwise newer"),
    "atan2":                    (2, "elementwise"),
    "atanh":                    (1, "elementwise accuracy"),
    "batch-norm-grad":          (5, "spatial"),
    "batch-norm-inference":     (5, "spatial"),
    "batch-norm-training":      (3, "spatial"),
    "bitcast":                  (1, "no-buffer linear declared-shape"),
    "bitcast-convert":          (1, "elementwise declared-type"),
    "broadcast":                (1, "linear spatial declared-dims"),
    "call":                     (None, "control-flow to-apply pass-through"),
    "cbrt":                     (1, "elementwise accuracy"),
    "ceil":                     (1, "elementwise"),
    "cholesky":                 (1, ""),
    "clamp":                    (3, "elementwise"),
    "collective-broadcast":     (None, "collective follows-finest"),
    "collective-permute":       (None, "collective spatial follows-finest"),
    "collective-permute-done":  (1, "side-effect collective done"),
    "collective-permute-start": (None, "side-effect collective start declared-shape"),
    "collective-reduce":        (None, "collective to-apply newer declared-shape"),
    "compare":                  (2, "elementwise"),
    "complex":                  (2, "elementwise"),
    "concatenate":              (None, "linear spatial pass-through follows-finest"),
    "conditional":              (None, "control-flow spatial"),
    "constant":                 (0, "spatial declared-optional"),
    "convert":                  (1, "elementwise declared-type"),
    "convolution":              (None, "spatial contraction declared-optional"),
    "copy":                     (1, "elementwise linear pass-through"),
    "copy-done":                (1, "done"),
    "copy-start":               (1, "start declared-shape"),
    "cosh":                     (1, "elementwise accuracy"),
    "cosine":                   (1, "elementwise accuracy"),
    "count-leading-zeros":      (1, "elementwise"),
    "custom-call":              (None, "linear declared-shape"),
    "divide":                   (2, "elementwise"),
    "domain":                   (1, ""),
    "dot":                      (None, "linear spatial contraction declared-optional"),
    "dynamic-reshape":          (None, "declared-shape"),
    "dynamic-slice":            (None, "spatial pass-through"),
    "dynamic-update-slice":     (None, "spatial pass-through"),
    "erf":                      (1, "elementwise accuracy"),
    "exponential":              (1, "elementwise accuracy"),
    "exponential-minus-one":    (1, "elementwise accuracy"),
    "fft":                      (1, ""),
    "floor":                    (1, "elementwise"),
    "fusion":                   (None, ""),
    "gather":                   (2, "spatial"),
    "get-dimension-size":       (1, ""),
    "get-tuple-element":        (1, "no-buffer linear spatial pass-through"),
    "imag":                     (1, "elementwise"),
    "infeed":                   (1, "side-effect spatial declared-shape"),
    "iota":                     (0, "spatial declared-shape"),
    "is-finite":                (1, "elementwise"),
    "log":                      (1, "elementwise accuracy"),
    "log-plus-one":             (1, "elementwise accuracy"),
    "logistic":                 (1, "elementwise accuracy"),
    "map":                      (None, "elementwise applies to-apply follows-first"),
    "maximum":                  (2, "elementwise reducer idempotent"),
    "minimum":                  (2, "elementwise reducer idempotent"),
    "mulhi":                    (2, "elementwise"),
    "multiply":                 (2, "elementwise reducer"),
    "negate":                   (1, "elementwise linear"),
    "not":                      (1, "elementwise"),
    "opt-barrier":              (1, "no-buffer spatial pass-through follows-first"),
    "or":                       (2, "elementwise reducer idempotent"),
    "outfeed":                  (2, "side-effect"),
    "pad":                      (2, "spatial follows-first"),
    "parameter":                (0, "declared-shape"),
    "partition-id":             (0, "device-id"),
    "popcnt":                   (1, "elementwise"),
    "power":                    (2, "elementwise follows-first"),
    "ragged-all-to-all":        (None, "collective follows-first"),
    "ragged-dot":               (3, "declared-optional"),
    "real":                     (1, "elementwise"),
    "recv":                     (1, "side-effect declared-shape"),
    "recv-done":                (1, "side-effect declared-shape"),
    "reduce":                   (None, "applies to-apply spatial"),
    "reduce-precision":         (1, "elementwise"),
    "reduce-scatter":           (None, "collective to-apply global-ids spatial follows-finest declared-optional"),
    "reduce-window":            (None, "applies to-apply spatial"),
    "remainder":                (2, "elementwise"),
    "replica-id":               (0, "device-id"),
    "reshape":                  (1, "linear spatial pass-through declared-dims"),
    "reverse":                  (1, "linear spatial follows-first"),
    "rng":                      (None, "side-effect declared-shape"),
    "rng-bit-generator":        (1, "spatial declared-shape"),
    "rng-get-and-update-state": (0, "side-effect"),
    "round-nearest-afz":        (1, "elementwise"),
    "round-nearest-even":       (1, "elementwise"),
    "rsqrt":                    (1, "elementwise accuracy"),
    "scaled-dot":               (4, "declared-optional"),
    "scan":                     (None, "to-apply declared-shape"),
    "scatter":                  (None, "applies to-apply spatial"),
    "select":                   (3, "elementwise"),
    "select-and-scatter":       (3, "applies spatial"),
    "send":                     (2, "side-effect declared-shape"),
    "send-done":                (1, "side-effect"),
    "set-dimension-size":       (2, ""),
    "shift-left":               (2, "elementwise follows-first"),
    "shift-right-arithmetic":   (2, "elementwise follows-first"),
    "shift-right-logical":      (2, "elementwise follows-first"),
    "shuffle":                  (1, "newer declared-shape"),
    "sign":                     (1, "elementwise"),
    "sine":                     (1, "elementwise accuracy"),
    "sinh":                     (1, "elementwise accuracy"),
    "slice":                    (1, "linear spatial follows-first"),
    "sort":                     (None, "applies to-apply spatial follows-finest"),
    "sqrt":                     (1, "elementwise accuracy"),
    "stochastic-convert":       (2, "elementwise declared-type"),
    "subtract":                 (2, "elementwise linear"),
    "tan":                      (1, "elementwise accuracy"),
    "tanh":                     (1, "elementwise accuracy"),
    "topk":                     (1, "spatial follows-finest"),
    "transpose":                (1, "linear spatial pass-through"),
    "triangular-solve":         (2, ""),
    "tuple":                    (None, "no-buffer linear spatial pass-through"),
    "while":                    (1, "control-flow spatial pass-through follows-finest"),
    "xor":                      (2, "elementwise reducer"),
}

#: Operand counts the verifier checks where they differ from the opcode's arity: a ragged
#: all-to-all has six. (dot and convolution are variadic: newer XLA gives them extra
#: operands, block scales and sparsity metadata, named by block_scaling_config /
#: sparsity_config.)
_VERIFIER_OPERANDS: dict[str, int] = {"ragged-all-to-all": 6}


@dataclass(frozen=True, slots=True)
class OpcodeTraits:
    """The facts about one opcode (see ``_WORDS`` for each flag's meaning)."""
    name: str
    arity: int | None          # hlo_opcode.h (None: variadic)
    operands: int | None       # what the verifier checks (None: any)
    elementwise: bool
    side_effect: bool
    no_own_buffer: bool
    collective: bool
    async_start: bool          # the start half of an asynchronous pair
    async_done: bool           # the done half of an asynchronous pair
    async_wrapper: bool
    control_flow: bool
    applies: bool
    to_apply: bool
    result_accuracy: bool
    linear: bool
    reducer: bool
    idempotent: bool
    global_device_ids: bool    # carries use_global_device_ids
    device_id: bool            # its value is the running device's id
    in_jaxlib: bool            # known to jaxlib 0.10.2's text parser
    contraction: bool
    declared: str              # what shape inference takes from the declared shape:
                               # "shape", "type", "dims", "optional" or "" (nothing)
    spatial: bool              # propagation: SupportSpatialPartitioning
    pass_through: bool         # propagation: passes shardings through at every level
    representative: str        # propagation: the operand the result follows, "first",
                               # "finest" or "" (see PickRepresentativeOperand)

    def as_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


def _make(name: str, arity: int | None, words: str) -> OpcodeTraits:
    w = frozenset(words.split())
    unknown = w - _WORDS
    if unknown:
        raise ValueError(f"{name}: unknown trait(s) {sorted(unknown)}")
    return OpcodeTraits(
        name=name, arity=arity, operands=_VERIFIER_OPERANDS.get(name, arity),
        elementwise="elementwise" in w, side_effect="side-effect" in w,
        no_own_buffer="no-buffer" in w, collective="collective" in w,
        async_start="start" in w, async_done="done" in w, async_wrapper="async" in w,
        control_flow="control-flow" in w, applies="applies" in w, to_apply="to-apply" in w,
        result_accuracy="accuracy" in w, linear="linear" in w, reducer="reducer" in w,
        idempotent="idempotent" in w, global_device_ids="global-ids" in w,
        device_id="device-id" in w,
        in_jaxlib="newer" not in w, contraction="contraction" in w,
        declared=_one_of(name, w, "declared-", ("shape", "type", "dims", "optional")),
        spatial="spatial" in w, pass_through="pass-through" in w,
        representative=_one_of(name, w, "follows-", ("first", "finest")))


def _one_of(name: str, words: frozenset[str], prefix: str, values: tuple[str, ...]) -> str:
    """The value of a trait spelled ``prefix + value`` (at most one per opcode), or ""."""
    found = [v for v in values if prefix + v in words]
    if len(found) > 1:
        raise ValueError(f"{name}: more than one of {[prefix + v for v in found]}")
    return found[0] if found else ""


#: Every opcode's traits.
TRAITS: dict[str, OpcodeTraits] = {op: _make(op, a, w) for op, (a, w) in _TABLE.items()}


def traits(opcode: str) -> OpcodeTraits:
    """The traits of ``opcode`` (KeyError when unknown)."""
    return TRAITS[opcode]


def _where(flag: str) -> frozenset[str]:
    return frozenset(op for op, t in TRAITS.items() if getattr(t, flag))


# -- derived sets (what the per-instruction paths test) ----------------------------------------
ALL_OPCODES = frozenset(TRAITS)
ELEMENTWISE = _where("elementwise")
ELEMENTWISE_UNARY = frozenset(op for op in ELEMENTWISE if TRAITS[op].arity == 1)
ELEMENTWISE_BINARY = frozenset(op for op in ELEMENTWISE if TRAITS[op].arity == 2)
ELEMENTWISE_TERNARY = frozenset(op for op in ELEMENTWISE if TRAITS[op].arity == 3)
COLLECTIVES = _where("collective")
#: The synchronous collectives (a collective that is no half of an asynchronous pair).
SYNC_COLLECTIVES = frozenset(op for op in COLLECTIVES
                             if not TRAITS[op].async_start and not TRAITS[op].async_done)
ASYNC_STARTS = _where("async_start")
ASYNC_DONES = _where("async_done")
ASYNC_WRAPPERS = _where("async_wrapper")
#: Ops whose result depends on something other than operand values (never duplicated,
#: never removed as dead code): XLA's HasSideEffectNoRecurse by opcode.
SIDE_EFFECTING = _where("side_effect")
NO_OWN_BUFFER = _where("no_own_buffer")
CONTROL_FLOW = _where("control_flow")
APPLIES = _where("applies")
TO_APPLY = _where("to_apply")
RESULT_ACCURACY = _where("result_accuracy")
LINEAR_OPS = _where("linear")
REDUCERS = _where("reducer")
IDEMPOTENT_REDUCERS = _where("idempotent")
GLOBAL_DEVICE_ID_COLLECTIVES = _where("global_device_ids")
DEVICE_IDS = _where("device_id")
CONTRACTIONS = _where("contraction")
SPATIAL = _where("spatial")
PASS_THROUGH = _where("pass_through")
FOLLOWS_FIRST_OPERAND = frozenset(op for op, t in TRAITS.items() if t.representative == "first")
FOLLOWS_FINEST_OPERAND = frozenset(op for op, t in TRAITS.items()
                                   if t.representative == "finest")
#: Opcode -> arity (None: variadic) of every opcode jaxlib 0.10.2's text parser knows.
JAXLIB_ARITY: dict[str, int | None] = {op: t.arity for op, t in TRAITS.items() if t.in_jaxlib}
#: The ReductionKind XLA matches an all-reduce's reducer root to (collective_ops_utils'
#: MatchReductionInstruction); "and" / "or" only on pred, as min / max.
REDUCTION_KINDS: dict[str, str] = {"add": "sum", "multiply": "product", "maximum": "max",
                                   "minimum": "min", "and": "min on pred", "or": "max on pred"}
#: Fixed operand counts, checked by the verifier (variadic ops are absent).
ARITY: dict[str, int] = {op: t.operands for op, t in TRAITS.items() if t.operands is not None}


def async_pair(opcode: str) -> tuple[str, str] | None:
    """(start, done) of the asynchronous form of the collective ``opcode``, or None."""
    start, done = opcode + "-start", opcode + "-done"
    return (start, done) if start in ASYNC_STARTS and done in ASYNC_DONES else None


def is_known(opcode: str) -> bool:
    return opcode in ALL_OPCODES


def is_elementwise(opcode: str) -> bool:
    return opcode in ELEMENTWISE


def reducer_opcode(comp: Any) -> str | None:
    """The opcode of a reducer computation ``(x, y) -> op(x, y)`` over scalars, or None.

    Only a root that applies one of ``REDUCERS`` directly to the two parameters (in either
    order) counts; anything else (argmax pairs, composite bodies) is unrecognised. ``comp``
    is an ``ir.Computation`` (duck-typed: this module imports nothing of the IR).
    """
    params = comp.parameters
    root = comp.root
    if len(params) != 2 or root is None or root.opcode not in REDUCERS:
        return None
    if any(p.shape.rank != 0 or not p.shape.is_array for p in params):
        return None
    ops = root.operands
    if len(ops) != 2 or {id(o) for o in ops} != {id(p) for p in params}:
        return None
    return root.opcode
