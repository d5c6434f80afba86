"""``verify``: the verdict on right and wrong partitioned programs.

Right programs (64-bit parameters, text outputs, reassociated sums) must say OK; broken
controls, built by mutating a right partitioned program (an all-reduce that takes the
maximum, a dropped collective, a shifted collective-permute), must say NOT OK.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")

from hlo_spmd.ir.io import module_bytes  # noqa: E402
from hlo_spmd.ir.text_parser import parse_module  # noqa: E402
from hlo_spmd.passes.partition import partition  # noqa: E402
from hlo_spmd.runtime import verify  # noqa: E402

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hlo"

GATHER_S64 = """HloModule g64

ENTRY main {
  t = f32[64,16] parameter(0), sharding={devices=[4,1]<=[4]}
  ids = s64[16,4] parameter(1), sharding={devices=[4,1]<=[4]}
  b = s64[16,4,1] reshape(ids)
  ROOT g = f32[16,4,16] gather(t, b), offset_dims={2}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=2, slice_sizes={1,16}, sharding={devices=[4,1,1]<=[4]}
}
"""

DOT_F64 = """HloModule f64

ENTRY main {
  x = f64[16,32] parameter(0), sharding={devices=[1,4]<=[4]}
  w = f64[32,8] parameter(1), sharding={devices=[4,1]<=[4]}
  ROOT d = f64[16,8] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}
}
"""


def partitioned(text: str, n: int) -> tuple[bytes, bytes]:
    module = parse_module(text)
    original = module_bytes(module)
    return original, module_bytes(partition(module, n).module)


def test_s64_indices_run_as_they_are():
    original, part = partitioned(GATHER_S64, 4)
    rng = np.random.default_rng(0)
    table = rng.normal(size=(64, 16)).astype(np.float32)
    ids = rng.integers(0, 64, size=(16, 4)).astype(np.int64)
    ids[0, 0] = 2 ** 33 + 5  # does not fit 32 bits: out of range, clamped by gather
    report = verify(original, part, 4, inputs=[table, ids])
    assert report.ok, str(report)
    assert report.outputs[0].size == 16 * 4 * 16


def test_f64_program_keeps_its_precision():
    original, part = partitioned(DOT_F64, 4)
    report = verify(original, part, 4)
    assert report.ok, str(report)
    assert report.outputs[0].expected_dtype == "float64"
    # f64 arithmetic: a reassociated 32-term sum differs by ~1e-15, not f32's ~1e-7
    assert report.outputs[0].max_abs_error < 1e-12


# -- item 8: a partitioned module written as HLO text -----------------------------------------
def test_text_output_takes_its_interface_from_the_original(tmp_path):
    from click.testing import CliRunner

    from hlo_spmd.ir.io import load_module, module_text
    from hlo_spmd_cli.main import _register, cli

    _register()
    src = FIXTURES / "mlp_2d_megatron.pb"
    out = tmp_path / "p.hlo"
    r = CliRunner().invoke(cli, ["partition", str(src), "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    assert "spmd_parameters_shardings" not in out.read_text()  # text cannot carry it
    r = CliRunner().invoke(cli, ["verify", str(src), str(out)])
    assert r.exit_code == 0 and r.output.rstrip().endswith("\nOK"), r.output
    # the library too, given the text as a string (parsed by XLA's own parser)
    original = src.read_bytes()
    report = verify(original, module_text(load_module(out)), 8)
    assert report.ok, str(report)
