"""The Python API: hlo_spmd.load / hlo_spmd.partition, and the README example run as is."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

import hlo_spmd
from hlo_spmd.ir.io import module_bytes, module_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "fixtures", "hlo")
MLP = os.path.join(FIX, "mlp_2d_megatron.pb")


def test_load_every_form():
    m = hlo_spmd.load(MLP)
    data = open(MLP, "rb").read()
    text = module_text(m)
    for src in (MLP, data, text, m, os.path.join(FIX, "mlp_2d_megatron.hlo")):
        got = hlo_spmd.load(src)
        assert module_text(got) == text
    assert hlo_spmd.load(m) is m
    from hlo_spmd.errors import InputError

    with pytest.raises(InputError) as e:
        hlo_spmd.load(b"\x00garbage")
    assert "HloModuleProto" in str(e.value)


@pytest.mark.parametrize("name", ["transformer_train_step", "while_loop", "shardy_mlp_2d",
                                  "gather_scatter", "conditional"])
def test_partition_leaves_the_module_unchanged_and_repeats(name):
    m = hlo_spmd.load(os.path.join(FIX, f"{name}.pb"))
    before = module_bytes(m)
    text_before = module_text(m)
    a = hlo_spmd.partition(m)
    assert module_bytes(m) == before and module_text(m) == text_before
    b = hlo_spmd.partition(m)
    assert a.serialize() == b.serialize() and a.report == b.report
    assert a.module is not m and a.num_partitions == 8


def test_partition_for_two_device_counts():
    m = hlo_spmd.load(os.path.join(FIX, "mlp_dp.pb"))
    for i in m.instructions():
        i.sharding = None
    r8 = hlo_spmd.partition(m, mesh="data=8", shard={"#0": "data,_"})
    r2 = hlo_spmd.partition(m, mesh={"data": 2}, shard=["#0=data,_"])
    r4 = hlo_spmd.partition(m, 4, mesh=[("data", 4)], shard={"#0": ["data", None]})
    assert (r8.num_partitions, r2.num_partitions, r4.num_partitions) == (8, 2, 4)
    assert all(i.sharding is None for i in m.instructions())  # still unannotated
    x8 = r8.module.entry.parameters[0].shape.dims
    x2 = r2.module.entry.parameters[0].shape.dims
    assert x8[0] * 8 == x2[0] * 2 == 32


def test_report_is_the_cli_report(tmp_path):
    from hlo_spmd_cli.main import _register, cli

    _register()
    out, rep = tmp_path / "o.pb", tmp_path / "r.json"
    r = CliRunner().invoke(cli, ["partition", MLP, "-o", str(out), "--report", str(rep)])
    assert r.exit_code == 0
    api = hlo_spmd.partition(MLP)
    assert json.loads(rep.read_text()) == json.loads(json.dumps(api.report))
    assert out.read_bytes() == api.serialize()


def test_bad_api_arguments_raise_library_errors():
    from hlo_spmd.errors import HloSpmdError

    with pytest.raises(HloSpmdError, match="unknown mesh axis"):
        hlo_spmd.partition(MLP, mesh="a=8", shard={"#0": "b,_"})
    with pytest.raises(HloSpmdError, match="8 devices"):
        hlo_spmd.partition(MLP, 4)


def _readme_example() -> str:
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text[text.index("## Python API"):]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "README's Python API section has no python example"
    return m.group(1)


def test_readme_example_runs(tmp_path):
    pytest.importorskip("jax")
    script = tmp_path / "example.py"
    script.write_text(_readme_example())
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.pop("XLA_FLAGS", None)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "all-reduce contraction for dot" in p.stdout
    assert "4 partitions" in p.stdout
