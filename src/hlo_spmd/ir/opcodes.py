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
#: users-only    gets its sharding from its users only (no operand to follow)
#: computation-sync  its sharding is kept equal to a called or calling computation's
#:               (parameters and roots)
#: manual-tuple  a tuple result may take a manual sharding forward from an operand
#:               (variadic reduce / sort / reduce-window; other tuples may not)
#: manual-late   takes a manual sharding forward only at aggressiveness >= 1
#: fed-in        a value fed into a computation (a parameter, or an element read from a
#:               tuple): concatenate's level-0 forward rule accepts only reshapes of these
#: elementwise-per-instruction  elementwise or not as the instruction decides
#:               (bitcast-convert: the widths; custom-call: the target), never by opcode
#: Partitioner:
#: manual-own-handler  keeps its own handler inside a manual region (a custom-call's
#:               target decides; a get-tuple-element reads one leaf of a mixed tuple)
#: combined      collectives the combiner merges (XLA's AllReduce / AllGather /
#:               ReduceScatter combiners)
#: tidy-*        tidy's rewrites that start from this opcode (a computation lacking
#:               one of a rewrite's opcodes is skipped by it): reassociate (all-reduces
#:               through an op), sink-slices (dynamic-slices through a transpose),
#:               reduce-scatter (an all-reduce cut to one part), fold-slice (an
#:               all-gather cut to its own part)
#: cost-*        collectives/cost.py's bytes per device, g = group size (the kinds are
#:               reported in the order of ``COST_FORMULAS``): ring 2(g-1)/g x operand,
#:               gathered (g-1)/g x result, scattered (g-1)/g x operand, exchanged
#:               (g-1)/g x operand, sent the operand
#: Text syntax and builder:
#: value-leaf    its value is written in the instruction (a literal, a parameter number):
#:               no operands, never async-wrapped, no shape to infer
#: slice-size-pairs  its slice_sizes attribute is one list per source-target pair
#:               (dynamic_slice_sizes), not gather's one list
#: stage-*       an async wrapper's place in its chain: start, update or done
#: builder-attrs an elementwise op whose result needs more than its operands (a result
#:               type, a direction, bit counts): the Builder generates no operands-only
#:               ``b.<op>(x)`` / ``b.<op>(x, y)`` for it
#: sdy-attr      XLA's Shardy import honours an ``xla.sdy.sharding`` attribute on it
#:               (elsewhere the attribute is dropped: XLA passes copy frontend attributes
#:               onto new instructions where the sharding no longer fits)
#: Checks and search:
#: window-sums   its sums are as deep as its window (verify's tolerance)
#: weight-*      search baselines follow a weight through it to its contraction:
#:               same-dims (the result's dims are the operand's), moves-dims (a
#:               reshape / transpose: the weight's dims are no longer known)
_WORDS = frozenset({"newer", "device-id", "elementwise", "side-effect", "no-buffer", "collective", "start", "done",
                    "async", "control-flow", "applies", "to-apply", "accuracy", "linear",
                    "reducer", "idempotent", "global-ids", "contraction", "declared-shape",
                    "declared-type", "declared-dims", "declared-optional", "spatial",
                    "pass-through", "follows-first", "follows-finest", "users-only",
                    "computation-sync", "manual-tuple", "manual-late", "fed-in",
                    "elementwise-per-instruction", "manual-own-handler", "combined",
                    "tidy-reassociate", "tidy-sink-slices", "tidy-reduce-scatter",
                    "tidy-fold-slice", "cost-ring", "cost-gathered", "cost-scattered",
                    "cost-exchanged", "cost-sent", "value-leaf", "slice-size-pairs",
                    "stage-start", "stage-update", "stage-done", "builder-attrs",
                    "sdy-attr", "window-sums", "weight-same-dims", "weight-moves-dims"})
#: The formulas of the ``cost-*`` words, in the order collectives/cost.py reports the
#: kinds that use them.
COST_FORMULAS = ("ring", "gathered", "scattered", "exchanged", "sent")
_TIDY_REWRITES = ("reassociate", "sink-slices", "reduce-scatter", "fold-slice")

# opcode: (arity as hlo_opcode.h spells it for jaxlib 0.10.2, None = variadic; traits).
# Names exactly as XLA spells them: "sine", "cosine", "count-leading-zeros", "opt-barrier".
# "atan", "collective-reduce", "shuffle": newer XLA opcodes the IR accepts.
_TABLE: dict[str, tuple[int | None, str]] = {
    "abs":                      (1, "elementwise"),
    "acos":                     (1, "elementwise accuracy"),
    "acosh":                    (1, "elementwise accuracy"),
    "add":                      (2, "elementwise linear reducer"),
    "add-dependency":           (2, "no-buffer"),
    "after-all":                (None, "no-buffer sdy-attr"),
    "all-gather":               (None, "collective global-ids follows-finest declared-optional cost-gathered combined tidy-fold-slice"),
    "all-gather-done":          (1, "side-effect collective done"),
    "all-gather-start":         (None, "side-effect collective start global-ids declared-optional"),
    "all-reduce":               (None, "collective to-apply global-ids spatial follows-finest cost-ring combined tidy-reassociate tidy-sink-slices tidy-reduce-scatter"),
    "all-reduce-done":          (1, "side-effect collective done"),
    "all-reduce-start":         (None, "side-effect collective to-apply start global-ids"),
    "all-to-all":               (None, "collective follows-finest cost-exchanged"),
    "and":                      (2, "elementwise reducer idempotent"),
    "asin":                     (1, "elementwise accuracy"),
    "asinh":                    (1, "elementwise accuracy"),
    "async-done":               (1, "async declared-shape stage-done"),
    "async-start":              (None, "async declared-shape stage-start"),
    "async-update":             (1, "async declared-shape stage-update"),
    "atan":                     (1, "elementwise newer"),
    "atan2":                    (2, "elementwise"),
    "atanh":                    (1, "elementwise accuracy"),
    "batch-norm-grad":          (5, "spatial"),
    "batch-norm-inference":     (5, "spatial"),
    "batch-norm-training":      (3, "spatial"),
    "bitcast":                  (1, "no-buffer linear declared-shape weight-moves-dims"),
    "bitcast-convert":          (1, "elementwise declared-type builder-attrs weight-same-dims elementwise-per-instruction"),
    "broadcast":                (1, "linear spatial declared-dims"),
    "call":                     (None, "control-flow to-apply pass-through computation-sync"),
    "cbrt":                     (1, "elementwise accuracy"),
    "ceil":                     (1, "elementwise"),
    "cholesky":                 (1, ""),
    "clamp":                    (3, "elementwise"),
    "collective-broadcast":     (None, "collective follows-finest"),
    "collective-permute":       (None, "collective spatial follows-finest cost-sent slice-size-pairs"),
    "collective-permute-done":  (1, "side-effect collective done"),
    "collective-permute-start": (None, "side-effect collective start declared-shape slice-size-pairs"),
    "collective-reduce":        (None, "collective to-apply newer declared-shape"),
    "compare":                  (2, "elementwise builder-attrs"),
    "complex":                  (2, "elementwise"),
    "concatenate":              (None, "linear spatial pass-through follows-finest manual-late"),
    "conditional":              (None, "control-flow spatial computation-sync"),
    "constant":                 (0, "spatial declared-optional value-leaf users-only"),
    "convert":                  (1, "elementwise declared-type builder-attrs weight-same-dims"),
    "convolution":              (None, "spatial contraction declared-optional"),
    "copy":                     (1, "elementwise linear pass-through weight-same-dims"),
    "copy-done":                (1, "done"),
    "copy-start":               (1, "start declared-shape"),
    "cosh":                     (1, "elementwise accuracy"),
    "cosine":                   (1, "elementwise accuracy"),
    "count-leading-zeros":      (1, "elementwise"),
    "custom-call":              (None, "linear declared-shape manual-own-handler elementwise-per-instruction"),
    "divide":                   (2, "elementwise"),
    "domain":                   (1, ""),
    "dot":                      (None, "linear spatial contraction declared-optional"),
    "dynamic-reshape":          (None, "declared-shape"),
    "dynamic-slice":            (None, "spatial pass-through tidy-sink-slices tidy-reduce-scatter tidy-fold-slice manual-late"),
    "dynamic-update-slice":     (None, "spatial pass-through"),
    "erf":                      (1, "elementwise accuracy"),
    "exponential":              (1, "elementwise accuracy"),
    "exponential-minus-one":    (1, "elementwise accuracy"),
    "fft":                      (1, ""),
    "floor":                    (1, "elementwise"),
    "fusion":                   (None, ""),
    "gather":                   (2, "spatial"),
    "get-dimension-size":       (1, ""),
    "get-tuple-element":        (1, "no-buffer linear spatial pass-through manual-own-handler fed-in"),
    "imag":                     (1, "elementwise"),
    "infeed":                   (1, "side-effect spatial declared-shape users-only"),
    "iota":                     (0, "spatial declared-shape users-only"),
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
    "parameter":                (0, "declared-shape sdy-attr value-leaf computation-sync fed-in"),
    "partition-id":             (0, "device-id"),
    "popcnt":                   (1, "elementwise"),
    "power":                    (2, "elementwise follows-first"),
    "ragged-all-to-all":        (None, "collective follows-first"),
    "ragged-dot":               (3, "declared-optional"),
    "real":                     (1, "elementwise"),
    "recv":                     (1, "side-effect declared-shape sdy-attr"),
    "recv-done":                (1, "side-effect declared-shape"),
    "reduce":                   (None, "applies to-apply spatial manual-tuple"),
    "reduce-precision":         (1, "elementwise builder-attrs"),
    "reduce-scatter":           (None, "collective to-apply global-ids spatial follows-finest declared-optional cost-scattered combined"),
    "reduce-window":            (None, "applies to-apply spatial manual-tuple window-sums"),
    "remainder":                (2, "elementwise"),
    "replica-id":               (0, "device-id"),
    "reshape":                  (1, "linear spatial pass-through declared-dims weight-moves-dims"),
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
    "select-and-scatter":       (3, "applies spatial window-sums"),
    "send":                     (2, "side-effect declared-shape sdy-attr"),
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
    "sort":                     (None, "applies to-apply spatial follows-finest manual-tuple"),
    "sqrt":                     (1, "elementwise accuracy"),
    "stochastic-convert":       (2, "elementwise declared-type builder-attrs"),
    "subtract":                 (2, "elementwise linear"),
    "tan":                      (1, "elementwise accuracy"),
    "tanh":                     (1, "elementwise accuracy"),
    "topk":                     (1, "spatial follows-finest"),
    "transpose":                (1, "linear spatial pass-through tidy-sink-slices weight-moves-dims"),
    "triangular-solve":         (2, ""),
    "tuple":                    (None, "no-buffer linear spatial pass-through"),
    "while":                    (1, "control-flow spatial pass-through follows-finest computation-sync"),
    "xor":                      (2, "elementwise reducer"),
}

#: Operand counts the verifier checks where they differ from the opcode's arity: a ragged
#: all-to-all has six. (dot and convolution are variadic: newer XLA gives them extra
#: operands, block scales and sparsity metadata, named by block_scaling_config /
#: sparsity_config.)
_VERIFIER_OPERANDS: dict[str, int] = {"ragged-all-to-all": 6}

#: Text syntax: the attributes naming an op's called computations, in the order the proto
#: lists them (where they are not ``to_apply`` / ``calls``).
_CALLED_ATTRS: dict[str, tuple[str, ...]] = {"while": ("body", "condition"),
                                             "select-and-scatter": ("select", "scatter")}


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
    sharded_from_users: bool   # propagation: no operand to follow
    computation_sync: bool     # propagation: synced with a called / calling computation
    manual_tuple_forward: bool  # propagation: a tuple result may turn manual forward
    manual_forward_late: bool  # propagation: manual forward only at aggressiveness >= 1
    fed_in: bool               # propagation: a value fed into a computation
    elementwise_per_instruction: bool  # elementwise as the instruction decides
    manual_own_handler: bool   # partitioner: own handler inside a manual region
    combinable: bool           # partitioner: the combiner merges these collectives
    tidy_rewrites: frozenset[str]  # partitioner: tidy's rewrites starting from it
    cost_formula: str          # collectives/cost.py: one of COST_FORMULAS, or ""
    value_leaf: bool           # text syntax: value written in the instruction
    slice_sizes_per_pair: bool  # text syntax: slice_sizes is a list of lists
    async_stage: str           # text syntax: "start", "update", "done" or ""
    called_attrs: tuple[str, ...]  # text syntax: attributes naming called computations
    builder_takes_attrs: bool  # builder: no generated operands-only method
    sdy_sharding_attr: bool    # Shardy import: honours xla.sdy.sharding
    window_sum_depth: bool     # verify's tolerance: sums as deep as the window
    weight_path: str           # search baselines: "same-dims", "moves-dims" or ""

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
        representative=_one_of(name, w, "follows-", ("first", "finest")),
        sharded_from_users="users-only" in w, computation_sync="computation-sync" in w,
        manual_tuple_forward="manual-tuple" in w, manual_forward_late="manual-late" in w,
        fed_in="fed-in" in w,
        elementwise_per_instruction="elementwise-per-instruction" in w,
        manual_own_handler="manual-own-handler" in w, combinable="combined" in w,
        tidy_rewrites=frozenset(r for r in _TIDY_REWRITES if "tidy-" + r in w),
        cost_formula=_one_of(name, w, "cost-", COST_FORMULAS),
        value_leaf="value-leaf" in w, slice_sizes_per_pair="slice-size-pairs" in w,
        async_stage=_one_of(name, w, "stage-", ("start", "update", "done")),
        called_attrs=_CALLED_ATTRS.get(name, ()),
        builder_takes_attrs="builder-attrs" in w, sdy_sharding_attr="sdy-attr" in w,
        window_sum_depth="window-sums" in w,
        weight_path=_one_of(name, w, "weight-", ("same-dims", "moves-dims")))


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
# Propagation's classifications:
SHARDED_FROM_USERS = _where("sharded_from_users")
COMPUTATION_SYNC = _where("computation_sync")
MANUAL_TUPLE_FORWARD = _where("manual_tuple_forward")
MANUAL_FORWARD_LATE = _where("manual_forward_late")
FED_IN = _where("fed_in")
ELEMENTWISE_PER_INSTRUCTION = _where("elementwise_per_instruction")
# The partitioner's:
MANUAL_OWN_HANDLER = _where("manual_own_handler")
COMBINABLE_COLLECTIVES = _where("combinable")
#: tidy's rewrite -> the opcodes it starts from.
TIDY_TRIGGERS: dict[str, frozenset[str]] = {
    r: frozenset(op for op, t in TRAITS.items() if r in t.tidy_rewrites) for r in _TIDY_REWRITES}
#: Collective opcode -> its byte formula (collectives/cost.py).
COST_FORMULA: dict[str, str] = {op: t.cost_formula for op, t in TRAITS.items() if t.cost_formula}
#: The collective kinds collectives/cost.py prices, in report order.
COST_KINDS: tuple[str, ...] = tuple(sorted(COST_FORMULA, key=lambda op: (
    COST_FORMULAS.index(COST_FORMULA[op]), op)))
# Text syntax and builder:
VALUE_LEAVES = _where("value_leaf")
SLICE_SIZES_PER_PAIR = _where("slice_sizes_per_pair")
#: Async wrappers a chain continues from (an -update / -done's operand is one of these).
ASYNC_CHAIN_OPEN = frozenset(op for op, t in TRAITS.items() if t.async_stage in ("start", "update"))
#: Async wrappers after the start (walked back to reach it).
ASYNC_CHAIN_LATER = frozenset(op for op, t in TRAITS.items() if t.async_stage in ("update", "done"))
#: Opcode -> the attributes naming its called computations, in proto order.
CALLED_ATTRS: dict[str, tuple[str, ...]] = {op: t.called_attrs for op, t in TRAITS.items()
                                            if t.called_attrs}
BUILDER_TAKES_ATTRS = _where("builder_takes_attrs")
SDY_SHARDING_ATTR = _where("sdy_sharding_attr")
# Checks and search:
WINDOW_SUM_DEPTH = _where("window_sum_depth")
WEIGHT_PASS_THROUGH = frozenset(op for op, t in TRAITS.items() if t.weight_path)
WEIGHT_SAME_DIMS = frozenset(op for op, t in TRAITS.items() if t.weight_path == "same-dims")
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
