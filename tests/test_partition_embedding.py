"""The LLM embedding (issue 21 item 2): a training step whose embedding table is sharded on
vocab and hidden at once, with the token ids sharded on batch, exported from JAX with
classic annotations and with Shardy (fixtures/generate.py: llm_embed_tied_2d). Its gather,
the gather of the cross-entropy (take_along_axis) and the scatter-adds of their gradients
partition with no full rematerialization and no replicated fallback, run right on 8 CPU
devices with every output moved by the step, and move no more bytes and hold no larger
array than XLA's own partitioned program."""
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
EMBEDDING = ["llm_embed_tied_2d", "shardy_llm_embed_tied_2d"]
# Fixtures whose gathers / scatters must never be replicated nor made whole.
NO_FALLBACK = EMBEDDING + ["embedding_vocab_sharded", "embedding_vocab_sharded_4",
                           "gather_scatter", "gpt_train_step_tied"]


def _meta(name):
    return json.load(open(os.path.join(HLO, name + ".json")))


@pytest.mark.parametrize("name", NO_FALLBACK)
def test_no_full_rematerialization_and_no_replicated_op(name):
    meta = _meta(name)
    result = partition_in_place(load_module(os.path.join(HLO, name + ".pb")), meta["num_partitions"])
    assert result.report.replicated_fallbacks == []
    assert [r.message() for r in result.report.causes.remats] == []


@pytest.mark.parametrize("name", EMBEDDING)
def test_training_step_runs_right_and_moves_every_output(name):
    meta = _meta(name)
    n = meta["num_partitions"]
    original = open(os.path.join(HLO, name + ".pb"), "rb").read()
    out = partition_in_place(load_module(os.path.join(HLO, name + ".pb")), n).module
    inputs = sidecar_inputs(meta)
    report = verify(original, module_bytes(out), n, inputs=inputs, poison_padding=True)
    assert report.ok, str(report)
    # The step must move every parameter by clearly more than the comparison tolerance,
    # or a dropped gradient would pass.
    outs = run_unpartitioned(original, inputs)
    params = [x for x in inputs if x.dtype == np.float32]
    for before, after in zip(params, outs[:len(params)]):
        assert before.shape == after.shape
        assert float(np.max(np.abs(after - before))) > 1e-2


@pytest.mark.parametrize("name", EMBEDDING + ["embedding_vocab_sharded",
                                              "embedding_vocab_sharded_4", "gather_scatter",
                                              "gpt_train_step_tied"])
def test_no_more_bytes_nor_larger_array_than_xla(name):
    meta = _meta(name)
    n = meta["num_partitions"]
    # The Shardy export is compared with XLA's program for its classic twin (XLA's GSPMD
    # partitioner refuses xla.sdy custom-calls).
    ref = name[len("shardy_"):] if name.startswith("shardy_") else name
    ours = module_stats(partition_in_place(load_module(os.path.join(HLO, name + ".pb")), n).module, n)
    data = open(os.path.join(HLO, ref + ".pb"), "rb").read()
    xla = module_stats(load_module_bytes(xla_partitioned_module(data, n), "xla"), n)
    assert ours.total_bytes_per_device <= xla.total_bytes_per_device + 1e-6, (
        ours.total_bytes_per_device, xla.total_bytes_per_device)
    assert ours.largest_array.bytes <= xla.largest_array.bytes, (
        ours.largest_array, xla.largest_array)
