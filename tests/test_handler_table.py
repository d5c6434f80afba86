"""The handler table is strict and pinned: one handler per opcode (and per custom-call
target), every family registered from handlers.FAMILIES, and the opcode -> handler map
spelled out here so a change to it is a visible, reviewed edit."""
from __future__ import annotations

import pytest

import hlo_spmd.passes.partition.driver  # noqa: F401  (imports every handler family)
from hlo_spmd.ir.opcodes import ELEMENTWISE
from hlo_spmd.passes.partition import handlers
from hlo_spmd.passes.partition.registry import (CUSTOM_CALL_HANDLERS, HANDLERS,
                                                DuplicateHandlerError, handles,
                                                handles_custom_call)

# handler (family.function) -> opcodes; elementwise opcodes are checked separately.
PINNED = {
    "basic.handle_full_then_slice": ["constant", "rng-get-and-update-state"],
    "batch_norm.handle_batch_norm": ["batch-norm-grad", "batch-norm-inference",
                                     "batch-norm-training"],
    "basic.handle_gte": ["get-tuple-element"],
    "basic.handle_tuple": ["tuple"],
    "control_flow.handle_call": ["call"],
    "control_flow.handle_conditional": ["conditional"],
    "control_flow.handle_while": ["while"],
    "dot.handle_dot": ["dot"],
    "gather_scatter.handle_gather": ["gather"],
    "gather_scatter.handle_scatter": ["scatter"],
    "linalg.handle_batched_matrix_op": ["cholesky", "triangular-solve"],
    "convolution.handle_convolution": ["convolution"],
    "misc.handle_add_dependency": ["add-dependency"],
    "misc.handle_after_all": ["after-all"],
    "misc.handle_custom_call": ["custom-call"],
    "misc.handle_feed": ["infeed", "outfeed"],
    "misc.handle_input_collective": ["all-gather", "all-reduce", "all-to-all",
                                     "collective-broadcast", "reduce-scatter"],
    "misc.handle_input_collective_permute": ["collective-permute"],
    "misc.handle_optimization_barrier": ["opt-barrier"],
    "misc.handle_partition_id": ["partition-id"],
    "misc.handle_replica_id": ["replica-id"],
    "misc.handle_rng": ["rng"],
    "misc.handle_rng_bit_generator": ["rng-bit-generator"],
    "reduce.handle_reduce": ["reduce"],
    "shapes.handle_bitcast_convert": ["bitcast-convert"],
    "shapes.handle_broadcast": ["broadcast"],
    "shapes.handle_dynamic_slice": ["dynamic-slice"],
    "shapes.handle_dynamic_update_slice": ["dynamic-update-slice"],
    "shapes.handle_iota": ["iota"],
    "shapes.handle_reshape": ["reshape"],
    "shapes.handle_transpose": ["transpose"],
    "slicing.handle_concatenate": ["concatenate"],
    "slicing.handle_pad": ["pad"],
    "slicing.handle_reverse": ["reverse"],
    "slicing.handle_slice": ["slice"],
    "sort.handle_sort": ["sort"],
    "sort.handle_topk": ["topk"],
    "windows.handle_reduce_window": ["reduce-window"],
    "windows.handle_select_and_scatter": ["select-and-scatter"],
}

PINNED_CUSTOM_CALLS = {
    "TopK": "sort.handle_topk",
    "Sharding": "basic._sharding_annotation",
    "LayoutConstraint": "basic._layout_constraint",
    "SPMDFullToShardShape": "basic._full_to_shard",
    "SPMDShardToFullShape": "basic._shard_to_full",
    "xla.sdy.FuncResultSharding": "basic._sharding_annotation",
    "xla.sdy.PropagationBarrier": "basic._identity",
    "xla.sdy.GlobalToLocalShape": "basic._global_to_local",
    "xla.sdy.LocalToGlobalShape": "basic._local_to_global",
}

PREFIX = handlers.__name__ + "."


def _short(fn) -> str:
    assert fn.__module__.startswith(PREFIX), fn.__module__
    return fn.__module__[len(PREFIX):] + "." + fn.__name__


def test_opcode_to_handler_map_is_pinned():
    actual: dict[str, list[str]] = {}
    for op, fn in HANDLERS.items():
        if _short(fn) == "elementwise.handle_elementwise":
            continue
        actual.setdefault(_short(fn), []).append(op)
    assert {k: sorted(v) for k, v in actual.items()} == PINNED
    elementwise = {op for op, fn in HANDLERS.items()
                   if _short(fn) == "elementwise.handle_elementwise"}
    assert elementwise == set(ELEMENTWISE) - {"bitcast-convert"}


def test_custom_call_targets_are_pinned():
    assert {t: _short(fn) for t, fn in CUSTOM_CALL_HANDLERS.items()} == PINNED_CUSTOM_CALLS


def test_every_registering_module_is_a_listed_family():
    modules = {fn.__module__ for fn in HANDLERS.values()}
    modules |= {fn.__module__ for fn in CUSTOM_CALL_HANDLERS.values()}
    assert modules == {PREFIX + f for f in handlers.FAMILIES}


def test_handlers_holds_only_the_families():
    # handlers/ is the families (each registers a handler); what they share and does not
    # register lives in passes/partition/support/.
    from pathlib import Path

    here = Path(handlers.__file__).parent
    assert sorted(p.stem for p in here.glob("*.py") if p.stem != "__init__") == \
        sorted(handlers.FAMILIES)


def test_second_registration_is_an_error():
    def other(ctx, inst):  # pragma: no cover - never called
        raise AssertionError

    with pytest.raises(DuplicateHandlerError, match="'dot' already has handler"):
        handles("dot")(other)
    with pytest.raises(DuplicateHandlerError, match="'Sharding'"):
        handles_custom_call("Sharding")(other)
    # A failed registration leaves the table untouched (no partial registration either).
    with pytest.raises(DuplicateHandlerError):
        handles("some-new-op", "dot")(other)
    assert "some-new-op" not in HANDLERS
    assert _short(HANDLERS["dot"]) == "dot.handle_dot"
