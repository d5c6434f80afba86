"""Every fixture partitions (completion included), compiles and runs on N CPU devices
with the same results as the unpartitioned module on one device.

Fixtures whose main op has no partitioned handler yet still run here: their ops go
through the replicated fallback, which must be correct too.
"""
from __future__ import annotations

import glob
import json
import os

import pytest

pytest.importorskip("jax")

from hlo_spmd.ir.io import load_module, module_bytes  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402
from hlo_spmd.runtime import verify  # noqa: E402
from hlo_spmd.runtime.inputs import sidecar_inputs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = sorted(glob.glob(os.path.join(ROOT, "fixtures", "hlo", "*.pb")))


def _cases():
    for path in FIXTURES:
        meta = json.load(open(path[:-3] + ".json"))
        for n in meta.get("partition_counts") or [meta["num_partitions"]]:
            yield pytest.param(path, n, meta, id=f"{os.path.basename(path)[:-3]}-{n}")


@pytest.mark.parametrize("path,n,meta", list(_cases()))
def test_fixture_partitions_and_matches(path, n, meta):
    # A Shardy manual computation is checked against its classic twin's original.
    ref = meta.get("reference")
    original = open(os.path.join(os.path.dirname(path), ref + ".pb") if ref else path,
                    "rb").read()
    module = load_module(path)
    result = partition_in_place(module, n)
    if meta.get("partition_only"):
        pytest.skip("too large to run on CPU; partitioned only (see the scale test)")
    assert result.num_partitions == n
    out = result.module
    # The contract: manual entry parameters and root, recorded global shardings.
    assert all(p.sharding is not None and p.sharding.is_manual or
               (p.sharding.is_tuple and all(e.is_manual for e in p.sharding.tuple_elements))
               for p in out.entry.parameters)
    assert len(out.attrs.spmd_parameters_shardings) == len(out.entry.parameters)
    report = verify(original, module_bytes(out), n, inputs=sidecar_inputs(meta),
                    poison_padding=True)
    assert report.ok, str(report)


def test_instruction_count_does_not_grow_with_devices():
    """The transformer training step for 8 and for 2048 devices: the same program size."""
    path = os.path.join(ROOT, "fixtures", "hlo", "transformer_train_step_scale.pb")
    counts, collectives = {}, {}
    for n, (a, b) in ((8, (2, 4)), (2048, (32, 64))):
        module = load_module(path)
        _rescale_mesh(module, {2: a, 4: b, 8: a * b})
        out = partition_in_place(module, n).module
        counts[n] = out.instruction_count()
        collectives[n] = sorted(i.opcode for i in out.instructions()
                                if i.opcode in ("all-reduce", "all-gather", "reduce-scatter",
                                                "all-to-all", "collective-permute"))
    assert counts[8] == counts[2048], counts
    assert collectives[8] == collectives[2048]


def _rescale_mesh(module, mapping):
    from hlo_spmd.runtime.rescale import rescale_mesh

    rescale_mesh(module, mapping)


MESH_FIXTURES = ["mlp_2d_megatron", "transformer_layer_fwd", "transformer_train_step",
                 "dot_variants", "elementwise_broadcast_reduce", "uneven_shapes"]


@pytest.mark.parametrize("devices,mesh", [(2, (1, 2)), (4, (2, 2))], ids=["2dev", "4dev"])
@pytest.mark.parametrize("name", MESH_FIXTURES)
def test_mesh_fixture_on_fewer_devices(name, devices, mesh):
    """The 2x4-mesh fixtures re-expressed on 1x2 and 2x2 meshes partition and match."""
    path = os.path.join(ROOT, "fixtures", "hlo", f"{name}.pb")
    meta = json.load(open(path[:-3] + ".json"))
    original = open(path, "rb").read()
    module = load_module(path)
    a, b = mesh
    _rescale_mesh(module, {2: a, 4: b, 8: a * b})
    out = partition_in_place(module, devices).module
    report = verify(original, module_bytes(out), devices, inputs=sidecar_inputs(meta),
                    poison_padding=True)
    assert report.ok, str(report)


LINE_FIXTURES = ["conv_spatial", "conv_strided_pool", "conv_dilated", "conv_transposed",
                 "pooling_grad", "cumsum"]


@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("name", LINE_FIXTURES + ["conv_depthwise"])
def test_window_fixture_on_fewer_devices(name, devices):
    """The convolution / window fixtures (8 devices on one axis, or conv_depthwise's 2x4
    mesh) re-expressed on 2 and 4 devices partition and match."""
    path = os.path.join(ROOT, "fixtures", "hlo", f"{name}.pb")
    meta = json.load(open(path[:-3] + ".json"))
    original = open(path, "rb").read()
    module = load_module(path)
    if name in LINE_FIXTURES:
        _rescale_mesh(module, {8: devices})
    else:
        a, b = (1, 2) if devices == 2 else (2, 2)
        _rescale_mesh(module, {2: a, 4: b, 8: a * b})
    out = partition_in_place(module, devices).module
    report = verify(original, module_bytes(out), devices, inputs=sidecar_inputs(meta),
                    poison_padding=True)
    assert report.ok, str(report)


def test_debug_mode_verifies_after_every_pass(monkeypatch):
    """HLO_SPMD_DEBUG=1 runs the verifier after inlining and completion too."""
    from hlo_spmd.ir import verifier

    calls = []
    real = verifier.verify_module
    monkeypatch.setattr(verifier, "verify_module", lambda m, **kw: (calls.append(1), real(m, **kw)))
    monkeypatch.setenv("HLO_SPMD_DEBUG", "1")
    partition_in_place(load_module(os.path.join(ROOT, "fixtures", "hlo", "mlp_dp.pb")), 8)
    assert len(calls) == 3  # after inlining, after completion, on the output


HANDWRITTEN = sorted(glob.glob(os.path.join(ROOT, "fixtures", "hlo", "handwritten", "*.hlo")))


@pytest.mark.parametrize("path", HANDWRITTEN, ids=lambda p: os.path.basename(p)[:-4])
def test_handwritten_fixture_partitions_and_matches(path):
    """Hand-written HLO text (manual regions, subgroups, maximal, iota tiles, while)."""
    meta = json.load(open(path[:-4] + ".json"))
    n = meta["num_partitions"]
    original = module_bytes(load_module(path))
    out = partition_in_place(load_module(path), n).module
    report = verify(original, module_bytes(out), n, inputs=sidecar_inputs(meta),
                    poison_padding=True)
    assert report.ok, str(report)


def test_fully_manual_ops_run_as_written():
    """Inside a fully manual region the driver emits ops as written (one shared rule, not
    a per-handler special case); the region still verifies on XLA above."""
    path = os.path.join(ROOT, "fixtures", "hlo", "handwritten", "manual_region.hlo")
    module = load_module(path)
    result = partition_in_place(module, json.load(open(path[:-4] + ".json"))["num_partitions"])
    manual = [i.name for i in module.instructions()
              if i.sharding is not None and i.sharding.is_manual and i.opcode != "custom-call"
              and i.opcode != "parameter" and not i.called_computations
              and i.opcode not in ("all-reduce", "all-gather", "collective-permute")]
    assert manual
    assert all(result.report.handler_of[n] == "handle_as_written" for n in manual)
