"""The MoE router (issue 21 item 3): a training step exported from JAX
(fixtures/generate.py: moe_router_topk) whose logits [tokens, experts] are sharded on
tokens (data) and experts (model); top_k(k=2) over the experts, the gather of the chosen
experts' weights, and the scatters of their gradients. It partitions with no full
rematerialization and no replicated fallback (top-k never gathers the logits), runs right
on 8 CPU devices with every parameter moved by the step, and moves no more bytes and
holds no larger array than XLA's own partitioned program."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

pytest.importorskip("jax")

from hlo_spmd.ir.io import load_module, load_module_bytes, module_bytes  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402
from hlo_spmd.runtime import run_unpartitioned, verify  # noqa: E402
from hlo_spmd.runtime.inputs import sidecar_inputs  # noqa: E402
from hlo_spmd.runtime.xla_reference import xla_partitioned_module  # noqa: E402
from hlo_spmd.stats import module_stats  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HLO = os.path.join(ROOT, "fixtures", "hlo")
NAME = "moe_router_topk"


def _load():
    meta = json.load(open(os.path.join(HLO, NAME + ".json")))
    data = open(os.path.join(HLO, NAME + ".pb"), "rb").read()
    return meta, data, partition_in_place(load_module(os.path.join(HLO, NAME + ".pb")),
                                 meta["num_partitions"])


def test_no_full_rematerialization_and_no_replicated_op():
    _, _, result = _load()
    assert result.report.replicated_fallbacks == []
    assert [r.message() for r in result.report.causes.remats] == []
    # top-k runs on a piece of the logits: no device holds the whole [tokens, experts].
    topk = [i for i in result.module.instructions() if i.opcode == "topk"]
    assert topk and all(i.operands[0].shape.dims[0] * i.operands[0].shape.dims[1] < 64 * 16
                        for i in topk)


def test_training_step_runs_right_and_moves_every_output():
    meta, data, result = _load()
    n = meta["num_partitions"]
    inputs = sidecar_inputs(meta)
    report = verify(data, module_bytes(result.module), n, inputs=inputs, poison_padding=True)
    assert report.ok, str(report)
    # Every parameter must move by clearly more than the comparison tolerance, or a
    # dropped gradient (of the router through top_k, of the gathered expert rows) passes.
    outs = run_unpartitioned(data, inputs)
    params = [x for x in inputs[:2]]
    for before, after in zip(params, outs[:2]):
        assert before.shape == after.shape
        assert float(np.max(np.abs(after - before))) > 1e-1


def test_no_more_bytes_nor_larger_array_than_xla():
    meta, data, result = _load()
    n = meta["num_partitions"]
    ours = module_stats(result.module, n)
    xla = module_stats(load_module_bytes(xla_partitioned_module(data, n), "xla"), n)
    assert ours.total_bytes_per_device <= xla.total_bytes_per_device + 1e-6, (
        ours.total_bytes_per_device, xla.total_bytes_per_device)
    assert ours.largest_array.bytes <= xla.largest_array.bytes, (
        ours.largest_array, xla.largest_array)
