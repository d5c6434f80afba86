"""partition-id / replica-id, rng, tokens, opt-barrier, side effects and collectives already in
the input (handlers/misc.py), checked on XLA where the values are deterministic."""
from __future__ import annotations

import numpy as np
import pytest

from hlo_spmd.runtime import ensure_host_devices

ensure_host_devices(8)
pytest.importorskip("jax")

from hlo_spmd.ir.io import module_bytes  # noqa: E402
from hlo_spmd.ir.text_parser import parse_module  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402
from hlo_spmd.errors import PartitionError  # noqa: E402
from hlo_spmd.runtime import random_inputs, run_partitioned_detailed, verify  # noqa: E402
from hlo_spmd.runtime.module_io import strip_shardings  # noqa: E402
from hlo_spmd.stats import module_stats  # noqa: E402

ADD = """
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %c = f32[] add(%a, %b)
}
"""


def partition_and_verify(text: str, n: int, strip: bool = True, **kw):
    module = parse_module(text, "test")
    original = module_bytes(module)
    if strip:
        original = strip_shardings(original)
    result = partition_in_place(module, n, complete=True)
    report = verify(original, module_bytes(result.module), n, poison_padding=True, **kw)
    assert report.ok, str(report)
    return result


def find(module, name):
    inst = module.find(name)
    assert inst is not None, name
    return inst


# -- device ids ---------------------------------------------------------------------------------
PID = """
HloModule pid

ENTRY %main (x: f32[10,3]) -> (f32[10,3], u32[]) {{
  %x = f32[10,3]{{1,0}} parameter(0), sharding={{devices=[{n},1]<=[{n}]}}
  %pid = {pid}
  %rid = u32[] replica-id(), sharding={{replicated}}
  %ids = u32[] add(%pid, %rid), sharding={{replicated}}
  %f = f32[] convert(%ids), sharding={{replicated}}
  %b = f32[10,3]{{1,0}} broadcast(%f), dimensions={{}}, sharding={{devices=[{n},1]<=[{n}]}}
  %y = f32[10,3]{{1,0}} add(%x, %b), sharding={{devices=[{n},1]<=[{n}]}}
  ROOT %t = (f32[10,3]{{1,0}}, u32[]) tuple(%y, %pid), sharding={{{{devices=[{n},1]<=[{n}]}}, {{replicated}}}}
}}
"""


@pytest.mark.parametrize("n", [2, 4, 8])
def test_replica_id_is_kept(n):
    text = PID.format(n=n, pid="u32[] constant(0), sharding={replicated}")
    result = partition_and_verify(text, n)
    assert find(result.module, "rid").opcode == "replica-id"


@pytest.mark.parametrize("sharding", [", sharding={replicated}", "",
                                      ", sharding={maximal device=0}"])
def test_non_manual_partition_id_is_refused_as_xla_does(sharding):
    """XLA: "PartitionId instruction is not supported for SPMD partitioning since the
    meaning is ambiguous" unless it is manual; here the same, as a one-line error."""
    from hlo_spmd.errors import HloSpmdError

    text = PID.format(n=4, pid="u32[] partition-id()" + sharding)
    with pytest.raises(HloSpmdError) as e:
        partition_in_place(parse_module(text, "pid"), 4, complete=False)
    msg = str(e.value)
    assert "instruction pid" in msg and "manual region" in msg and "\n" not in msg


def test_non_manual_partition_id_cli_exit_2(tmp_path):
    import subprocess
    import sys

    src = tmp_path / "pid.hlo"
    out = tmp_path / "out.hlo"
    src.write_text(PID.format(n=4, pid="u32[] partition-id(), sharding={replicated}"))
    r = subprocess.run([sys.executable, "-m", "hlo_spmd_cli", "partition", str(src), "-o",
                        str(out)], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "partition-id" in r.stderr
    assert "Traceback" not in r.stderr and not out.exists()


MANUAL = ADD + """
ENTRY %main (x: f32[8,4]) -> f32[8,4] {
  %x = f32[8,4]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}
  %s = f32[8,4]{1,0} custom-call(%x), custom_call_target="Sharding", sharding={devices=[4,1]<=[4]}
  %m = f32[2,4]{1,0} custom-call(%s), custom_call_target="SPMDFullToShardShape", sharding={manual}
  %ar = f32[2,4]{1,0} all-reduce(%m), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add, sharding={manual}
  %pid = u32[] partition-id(), sharding={manual}
  %pf = f32[] convert(%pid), sharding={manual}
  %pb = f32[2,4]{1,0} broadcast(%pf), dimensions={}, sharding={manual}
  %y = f32[2,4]{1,0} add(%ar, %pb), sharding={manual}
  %ys = f32[2,4]{1,0} custom-call(%y), custom_call_target="Sharding", sharding={manual}
  ROOT %f = f32[8,4]{1,0} custom-call(%ys), custom_call_target="SPMDShardToFullShape", sharding={devices=[4,1]<=[4]}
}
"""


def test_manual_region_keeps_partition_id_and_its_collectives():
    module = parse_module(MANUAL, "manual")
    original = module_bytes(module)
    result = partition_in_place(module, 4, complete=True)
    report = verify(original, module_bytes(result.module), 4, poison_padding=True)
    assert report.ok, str(report)
    assert "XLA" in report.reference or "xla" in report.reference
    assert find(result.module, "pid").opcode == "partition-id"
    ar = find(result.module, "ar")
    assert ar.opcode == "all-reduce"
    channels = [i.attrs.channel_id for i in result.module.instructions() if i.attrs.channel_id]
    assert len(channels) == len(set(channels))


# -- collectives in the input -------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 4])
def test_single_partition_collectives_are_identities(n):
    s = f"{{devices=[{n},1]<=[{n}]}}"
    text = ADD + f"""
ENTRY %main (x: f32[10,3]) -> (f32[10,3], f32[10,3], f32[10,3], f32[10,3]) {{
  %x = f32[10,3]{{1,0}} parameter(0), sharding={s}
  %ar = f32[10,3]{{1,0}} all-reduce(%x), channel_id=1, replica_groups={{{{0}}}}, use_global_device_ids=true, to_apply=%add, sharding={s}
  %ag = f32[10,3]{{1,0}} all-gather(%ar), channel_id=2, replica_groups={{{{0}}}}, dimensions={{0}}, use_global_device_ids=true, sharding={{replicated}}
  %cp = f32[10,3]{{1,0}} collective-permute(%x), channel_id=3, source_target_pairs={{{{0,0}}}}, sharding={s}
  %xr = f32[10,3]{{1,0}} all-reduce(%x), replica_groups={{}}, to_apply=%add, sharding={s}
  ROOT %t = (f32[10,3]{{1,0}}, f32[10,3]{{1,0}}, f32[10,3]{{1,0}}, f32[10,3]{{1,0}}) tuple(%ar, %ag, %cp, %xr), sharding={{{s}, {{replicated}}, {s}, {s}}}
}}
"""
    result = partition_and_verify(text, n)
    stats = module_stats(result.module)
    # only the gather that makes %ag replicated is communication
    assert stats.count("all-reduce") == 0 and stats.count("collective-permute") == 0


def test_multi_device_collective_outside_manual_region_is_an_error():
    text = ADD + """
ENTRY %main (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0), sharding={devices=[2]<=[2]}
  ROOT %ar = f32[8]{0} all-reduce(%x), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=%add, sharding={devices=[2]<=[2]}
}
"""
    # A tiled all-reduce across partitions has no meaning (XLA rejects it too); the
    # replicated one runs across the devices' copies (tests/test_manual_xla_reference.py).
    with pytest.raises(PartitionError, match="must be replicated"):
        partition_in_place(parse_module(text, "t"), 2, complete=True)


# -- tokens and barriers ------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 4, 8])
def test_opt_barrier_and_tokens(n):
    rows = f"{{devices=[{n},1]<=[{n}]}}"
    cols = f"{{devices=[1,{n}]<=[{n}]}}"
    text = f"""
HloModule barrier

ENTRY %main (x: f32[10,6], y: f32[10,6]) -> (f32[10,6], f32[10,6]) {{
  %x = f32[10,6]{{1,0}} parameter(0), sharding={rows}
  %y = f32[10,6]{{1,0}} parameter(1), sharding={cols}
  %tok = token[] after-all(), sharding={{replicated}}
  %xd = f32[10,6]{{1,0}} add-dependency(%x, %tok), sharding={rows}
  %t = (f32[10,6]{{1,0}}, f32[10,6]{{1,0}}) tuple(%xd, %y), sharding={{{rows}, {cols}}}
  %b = (f32[10,6]{{1,0}}, f32[10,6]{{1,0}}) opt-barrier(%t), sharding={{{cols}, {rows}}}
  %b0 = f32[10,6]{{1,0}} get-tuple-element(%b), index=0, sharding={cols}
  %b1 = f32[10,6]{{1,0}} get-tuple-element(%b), index=1, sharding={rows}
  %e = f32[10,6]{{1,0}} exponential(%b0), sharding={cols}
  ROOT %r = (f32[10,6]{{1,0}}, f32[10,6]{{1,0}}) tuple(%e, %b1), sharding={{{cols}, {rows}}}
}}
"""
    result = partition_and_verify(text, n)
    barrier = find(result.module, "b")
    assert barrier.opcode == "opt-barrier"
    assert [list(s.dims) for s in barrier.shape.tuple_shapes] == [[10, -(-6 // n)],
                                                                  [-(-10 // n), 6]]


# -- random numbers -----------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 4, 8])
def test_rng_bit_generator_matches_the_original(n):
    # the bits are a pure function of the state: computed whole, then cut
    text = f"""
HloModule rbg

ENTRY %main (x: u32[10,4]) -> u32[10,4] {{
  %x = u32[10,4]{{1,0}} parameter(0), sharding={{devices=[{n},1]<=[{n}]}}
  %s = u64[2]{{0}} constant({{7, 11}}), sharding={{replicated}}
  %g = (u64[2]{{0}}, u32[10,4]{{1,0}}) rng-bit-generator(%s), algorithm=rng_three_fry, sharding={{{{replicated}}, {{devices=[{n},1]<=[{n}]}}}}
  %bits = u32[10,4]{{1,0}} get-tuple-element(%g), index=1, sharding={{devices=[{n},1]<=[{n}]}}
  ROOT %y = u32[10,4]{{1,0}} xor(%bits, %x), sharding={{devices=[{n},1]<=[{n}]}}
}}
"""
    inputs = [np.arange(40, dtype=np.uint32).reshape(10, 4)]
    result = partition_and_verify(text, n, inputs=inputs)
    assert not [f for f in result.report.replicated_fallbacks if f[1] == "rng-bit-generator"]


def _rng_module(sharding: str) -> str:
    return f"""
HloModule rng

ENTRY %main (x: f32[8,4]) -> f32[8,4] {{
  %x = f32[8,4]{{1,0}} parameter(0), sharding={{devices=[4,1]<=[4]}}
  %lo = f32[] constant(0), sharding={{replicated}}
  %hi = f32[] constant(1), sharding={{replicated}}
  %r = f32[8,4]{{1,0}} rng(%lo, %hi), distribution=rng_uniform, sharding={sharding}
  ROOT %y = f32[8,4]{{1,0}} add(%x, %r), sharding={{devices=[4,1]<=[4]}}
}}
"""


def test_replicated_rng_is_drawn_once_and_broadcast():
    module = partition_in_place(parse_module(_rng_module("{replicated}"), "rng"), 4, complete=True).module
    (rng,) = [i for i in module.instructions() if i.opcode == "rng"]
    assert list(rng.shape.dims) == [8, 4]
    # Device 0's draw to everyone: one collective (a reduce-scatter where only the
    # tiled value is used).
    stats = module_stats(module)
    assert stats.count("all-reduce") + stats.count("reduce-scatter") == 1
    x = random_inputs([((8, 4), np.float32)])
    run = run_partitioned_detailed(module_bytes(module), x, 4, poison_padding=True)
    assert not run.problems
    r = run.outputs[0] - x[0]
    assert np.all((r >= 0) & (r <= 1))


def test_tiled_rng_draws_local_tiles_without_communication():
    module = partition_in_place(parse_module(_rng_module("{devices=[4,1]<=[4]}"), "rng"), 4,
                                complete=True).module
    (rng,) = [i for i in module.instructions() if i.opcode == "rng"]
    assert list(rng.shape.dims) == [2, 4]
    assert module_stats(module).total_count == 0


# -- side effects -------------------------------------------------------------------------------
def test_side_effecting_custom_call_on_one_device_runs_once():
    text = """
HloModule effect

ENTRY %main (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0), sharding={devices=[4]<=[4]}
  %cb = f32[8]{0} custom-call(%x), custom_call_target="host_callback", custom_call_has_side_effect=true, sharding={maximal device=2}
  ROOT %y = f32[8]{0} negate(%cb), sharding={devices=[4]<=[4]}
}
"""
    module = partition_in_place(parse_module(text, "effect"), 4, complete=True).module
    calls = [i for i in module.instructions() if i.opcode == "custom-call"]
    assert len(calls) == 1
    branch = calls[0].parent
    cond = [i for i in module.entry.instructions if i.opcode == "conditional"]
    assert len(cond) == 1 and cond[0].called_computations[0] is branch
    # the branch predicate compares this device's entry of a table with device 2 marked
    assert cond[0].operands[0].shape.element_type.name == "PRED"
