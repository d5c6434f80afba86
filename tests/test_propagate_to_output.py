"""Propagation to outputs / parameters on ``partition`` (XLA's
allow_spmd_sharding_propagation_to_output / _to_parameters).

A JAX training step lowered with ``jax.jit(step, in_shardings=...)`` and no
out_shardings has an unannotated root: JAX lets XLA choose the output shardings. Made
replicated, every updated weight is all-gathered. With ``--propagate-to-output`` the
step moves no more bytes than the same step with its outputs annotated like its inputs,
runs right on 8 devices, and records the chosen shardings in the output's interface.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from click.testing import CliRunner

import hlo_spmd
from hlo_spmd.errors import ShardingError
from hlo_spmd.sharding import from_proto
from hlo_spmd.stats import module_stats

jax = pytest.importorskip("jax")
jnp = jax.numpy

B, S, D, H = 4, 8, 32, 4
LR = 0.5


def _loss(w, x):
    wq, wk, wv, wo = w
    q = (x @ wq).reshape(B, S, H, D // H)
    k = (x @ wk).reshape(B, S, H, D // H)
    v = (x @ wv).reshape(B, S, H, D // H)
    a = jax.nn.softmax(jnp.einsum("bshd,bthd->bhst", q, k) / 2.0, axis=-1)
    o = jnp.einsum("bhst,bthd->bshd", a, v).reshape(B, S, D)
    return jnp.mean((o @ wo) ** 2) * 64.0  # updates of order 0.1-1: well over tolerance


def _step(wq, wk, wv, wo, x):
    w = (wq, wk, wv, wo)
    g = jax.grad(_loss)(w, x)
    return tuple(p - LR * gp for p, gp in zip(w, g))


def _inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((D, D)).astype(np.float32) * 0.3 for _ in range(4)] + \
        [rng.standard_normal((B, S, D)).astype(np.float32)]


@pytest.fixture(scope="module", params=[True, False], ids=["shardy", "classic"])
def exported(request):
    """(out_shardings unspecified, out_shardings = in_shardings) HloModuleProto bytes."""
    from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

    old = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", request.param)
    try:
        devs = np.array(jax.devices()[:8]).reshape(2, 4)
        mesh = Mesh(devs, ("data", "model"), axis_types=(AxisType.Auto,) * 2)
        col = NamedSharding(mesh, P(None, "model"))
        row = NamedSharding(mesh, P("model", None))
        ins = (col, col, col, row, NamedSharding(mesh, P("data", None, None)))
        args = _inputs()
        unspec = jax.jit(_step, in_shardings=ins).lower(*args)
        annot = jax.jit(_step, in_shardings=ins, out_shardings=ins[:4]).lower(*args)
        return (unspec.compiler_ir("hlo").as_serialized_hlo_module_proto(),
                annot.compiler_ir("hlo").as_serialized_hlo_module_proto())
    finally:
        jax.config.update("jax_use_shardy_partitioner", old)


def _bytes(result) -> float:
    return module_stats(result.module, result.num_partitions).total_bytes_per_device


def test_propagating_to_output_moves_no_more_than_annotated_outputs(exported):
    unspec, annot = exported
    replicated = hlo_spmd.partition(unspec)
    chosen = hlo_spmd.partition(unspec, propagate_to_output=True)
    annotated = hlo_spmd.partition(annot)
    assert _bytes(chosen) <= _bytes(annotated)
    assert _bytes(replicated) > _bytes(annotated)  # the test can fail: the default costs more
    out = from_proto(chosen.module.attrs.spmd_output_sharding)
    want = from_proto(annotated.module.attrs.spmd_output_sharding)
    assert out.is_tuple and not any(e.is_replicated for e in out.tuple_elements)
    assert out == want  # what propagation chose is what the user would have written


def test_propagated_step_runs_right(exported):
    from hlo_spmd.runtime import run_partitioned, run_unpartitioned

    unspec, _ = exported
    chosen = hlo_spmd.partition(unspec, propagate_to_output=True)
    args = _inputs()
    want = run_unpartitioned(unspec, args)
    got = run_partitioned(chosen.serialize(), args, chosen.num_partitions)
    for w_in, w_want, w_got in zip(args, want, got):
        # the step moved every weight by clearly more than the tolerance ...
        assert np.max(np.abs(w_want - w_in)) > 0.05
        # ... and the partitioned program computed the same update
        np.testing.assert_allclose(w_got, w_want, rtol=2e-3, atol=2e-3)


def test_per_output_flags(exported):
    unspec, annot = exported
    some = hlo_spmd.partition(unspec, propagate_to_output=[True, True, False, False])
    out = from_proto(some.module.attrs.spmd_output_sharding).tuple_elements
    assert not out[0].is_replicated and not out[1].is_replicated
    assert out[2].is_replicated and out[3].is_replicated
    allowed = hlo_spmd.partition(unspec, propagate_to_output=True)
    assert _bytes(allowed) < _bytes(some) < _bytes(hlo_spmd.partition(unspec))
    with pytest.raises(ShardingError, match="3 flags"):
        hlo_spmd.partition(unspec, propagate_to_output=[True, False, True])


def test_propagating_to_parameters_records_them(exported):
    unspec, annot = exported
    m = hlo_spmd.load(unspec)
    wo = m.entry.parameters[3]  # wo unannotated: its gradient knows a sharding
    wo.sharding = None
    wo.attrs.frontend_attributes.map.pop("xla.sdy.sharding", None)  # (Shardy's form too)
    given = hlo_spmd.partition(m, propagate_to_output=True)
    chosen = hlo_spmd.partition(m, propagate_to_output=True,
                                propagate_to_parameters=[False, False, False, True, False])
    params = [from_proto(s) for s in chosen.module.attrs.spmd_parameters_shardings]
    before = [from_proto(s) for s in given.module.attrs.spmd_parameters_shardings]
    original = [from_proto(s) for s in
                hlo_spmd.partition(annot).module.attrs.spmd_parameters_shardings]
    assert before[3].is_replicated and not params[3].is_replicated
    assert params[3] == original[3]  # what the user had written, found again
    assert params[:3] == before[:3] and params[4] == before[4]
    from hlo_spmd.runtime import run_partitioned, run_unpartitioned

    args = _inputs()
    want = run_unpartitioned(unspec, args)
    got = run_partitioned(chosen.serialize(), args, chosen.num_partitions)
    for w_want, w_got in zip(want, got):
        np.testing.assert_allclose(w_got, w_want, rtol=2e-3, atol=2e-3)


def test_text_header_setting_is_read(exported):
    from hlo_spmd.ir.io import module_text

    unspec, _ = exported
    text = module_text(hlo_spmd.load(unspec))
    head, rest = text.split("\n", 1)
    with_config = head + ", allow_spmd_sharding_propagation_to_output={true}\n" + rest
    assert _bytes(hlo_spmd.partition(with_config)) == \
        _bytes(hlo_spmd.partition(unspec, propagate_to_output=True))
    # an explicit argument wins over the header
    assert _bytes(hlo_spmd.partition(with_config, propagate_to_output=False)) == \
        _bytes(hlo_spmd.partition(unspec))


def test_cli_forms(exported, tmp_path):
    from hlo_spmd.ir.io import load_module
    from hlo_spmd_cli.main import _register, cli

    _register()
    unspec, _ = exported
    src = tmp_path / "step.pb"
    src.write_bytes(unspec)
    figures = {}
    for name, extra in [("bare", ["--propagate-to-output"]), ("all", ["--propagate-to-output=all"]),
                        ("idx", ["--propagate-to-output", "0,1"]),
                        ("bools", ["--propagate-to-output=true,true,false,false"]),
                        ("none", [])]:
        out = tmp_path / f"{name}.pb"
        ran = CliRunner().invoke(cli, ["partition", str(src), "-o", str(out), "-q", *extra],
                                 catch_exceptions=False)
        assert ran.exit_code == 0, ran.stderr
        figures[name] = module_stats(load_module(out)).total_bytes_per_device
    assert figures["bare"] == figures["all"] < figures["idx"] == figures["bools"] < \
        figures["none"]
    ran = CliRunner().invoke(cli, ["partition", str(src), "-o", str(tmp_path / "x.pb"),
                                   "--propagate-to-params=yes"], catch_exceptions=False)
    assert ran.exit_code == 2 and "--propagate-to-params" in ran.stderr
    assert not (tmp_path / "x.pb").exists()
