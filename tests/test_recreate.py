"""Values cheaper to re-make than to move (partition/recreate.py, issue 21 item 1): an iota,
a constant, a broadcast of a value already where it is needed, and elementwise / convert
chains of such are re-made in the sharding a user wants, moving 0 bytes (XLA's own
partitioner moves 0 bytes for these forms). Written in the style of XLA's partitioner
tests; each module is partitioned, run on 8 CPU devices through jaxlib and compared with
the unpartitioned module on one device, and its bytes moved are read by ``stats``.
"""
from __future__ import annotations

import pytest

from hlo_spmd.runtime import ensure_host_devices

ensure_host_devices(8)
pytest.importorskip("jax")

from hlo_spmd.ir.io import module_bytes  # noqa: E402
from hlo_spmd.ir.text_parser import parse_module  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402
from hlo_spmd.passes.partition.recreate import MAX_OPS  # noqa: E402
from hlo_spmd.runtime import verify  # noqa: E402
from hlo_spmd.runtime.module_io import strip_shardings  # noqa: E402
from hlo_spmd.stats import module_stats  # noqa: E402

P122 = "{devices=[1,2,2,2]<=[8] last_tile_dim_replicate}"
P114 = "{devices=[1,1,4,2]<=[8] last_tile_dim_replicate}"

CASES = {
    # The form: a broadcast of a constant annotated on another dim than its user.
    "add_broadcast_constant": f"""
HloModule add_bc
ENTRY %main (p: f32[8,16,32]) -> f32[8,16,32] {{
  %p = f32[8,16,32]{{2,1,0}} parameter(0), sharding={P122}
  %c = f32[] constant(3)
  %b = f32[8,16,32]{{2,1,0}} broadcast(%c), dimensions={{}}, sharding={P114}
  ROOT %a = f32[8,16,32]{{2,1,0}} add(%p, %b), sharding={P122}
}}""",
    # A broadcast of a replicated parameter (a bias), tiled on a broadcast dim.
    "multiply_broadcast_replicated_vector": """
HloModule mul_bc
ENTRY %main (p: f32[8,16,32], v: f32[32]) -> f32[8,16,32] {
  %p = f32[8,16,32]{2,1,0} parameter(0), sharding={devices=[1,2,4]<=[8]}
  %v = f32[32]{0} parameter(1), sharding={replicated}
  %b = f32[8,16,32]{2,1,0} broadcast(%v), dimensions={2}, sharding={devices=[4,2,1]<=[8]}
  ROOT %m = f32[8,16,32]{2,1,0} multiply(%p, %b), sharding={devices=[1,2,4]<=[8]}
}""",
    # An iota tiled along its own dim, used tiled along the other one (uneven too).
    "iota_used_in_another_tiling": """
HloModule iota
ENTRY %main (p: s32[12,30]) -> s32[12,30] {
  %p = s32[12,30]{1,0} parameter(0), sharding={devices=[1,8]<=[8]}
  %i = s32[12,30]{1,0} iota(), iota_dimension=1, sharding={devices=[8,1]<=[8]}
  ROOT %a = s32[12,30]{1,0} add(%p, %i), sharding={devices=[1,8]<=[8]}
}""",
    # An elementwise / convert chain of an iota and a broadcast constant.
    "convert_chain": """
HloModule chain
ENTRY %main (p: f32[16,24]) -> f32[16,24] {
  %p = f32[16,24]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}
  %i = s32[16,24]{1,0} iota(), iota_dimension=0, sharding={devices=[1,8]<=[8]}
  %f = f32[16,24]{1,0} convert(%i), sharding={devices=[1,8]<=[8]}
  %c = f32[] constant(0.5)
  %cb = f32[16,24]{1,0} broadcast(%c), dimensions={}, sharding={devices=[1,8]<=[8]}
  %s = f32[16,24]{1,0} multiply(%f, %cb), sharding={devices=[1,8]<=[8]}
  ROOT %a = f32[16,24]{1,0} add(%p, %s), sharding={devices=[8,1]<=[8]}
}""",
    # A dynamic-update-slice into a broadcast zero buffer annotated another way.
    "dynamic_update_slice_into_broadcast": """
HloModule dus
ENTRY %main (u: f32[4,32], i: s32[]) -> f32[16,32] {
  %u = f32[4,32]{1,0} parameter(0), sharding={replicated}
  %i = s32[] parameter(1), sharding={replicated}
  %z = f32[] constant(0)
  %buf = f32[16,32]{1,0} broadcast(%z), dimensions={}, sharding={devices=[8,1]<=[8]}
  %zero = s32[] constant(0)
  ROOT %d = f32[16,32]{1,0} dynamic-update-slice(%buf, %u, %i, %zero), sharding={devices=[1,8]<=[8]}
}""",
    # Broadcast dims that need no reshard: the operand is already tiled as the user's
    # sharding needs it; only the broadcast (new) dim's tiling differs.
    "broadcast_new_dim_tiling_only": """
HloModule bc_dims
ENTRY %main (x: f32[16], p: f32[16,32]) -> f32[16,32] {
  %x = f32[16]{0} parameter(0), sharding={devices=[8]<=[8]}
  %p = f32[16,32]{1,0} parameter(1), sharding={devices=[8,1]<=[8]}
  %b = f32[16,32]{1,0} broadcast(%x), dimensions={0}, sharding={devices=[2,4]<=[8]}
  ROOT %a = f32[16,32]{1,0} add(%p, %b), sharding={devices=[8,1]<=[8]}
}""",
}


def _run(name: str, text: str):
    module = parse_module(text, name)
    original = strip_shardings(module_bytes(module))
    out = partition_in_place(module, 8).module
    report = verify(original, module_bytes(out), 8, poison_padding=True)
    assert report.ok, str(report)
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_remade_values_move_nothing(name):
    out = _run(name, CASES[name])
    assert module_stats(out, 8).total_bytes_per_device == 0


def test_a_parameter_in_the_same_place_is_moved():
    """The same form with the broadcast replaced by a parameter annotated alike: data
    that cannot be re-made moves (what ``stats`` reads in the cases above is real)."""
    text = CASES["add_broadcast_constant"].replace(
        "(p: f32[8,16,32])", "(p: f32[8,16,32], q: f32[8,16,32])").replace(
        "%b = f32[8,16,32]{2,1,0} broadcast(%c), dimensions={}",
        "%b = f32[8,16,32]{2,1,0} parameter(1)")
    out = _run("moved", text)
    assert module_stats(out, 8).total_bytes_per_device > 0


def test_a_chain_longer_than_the_bound_is_moved():
    """``MAX_OPS`` bounds how much is re-emitted: a chain of more elementwise ops than that
    over the broadcast moves as data (and still computes the same numbers)."""
    lines = ["%n0 = f32[8,16,32]{2,1,0} broadcast(%c), dimensions={}, sharding=" + P114]
    for k in range(1, MAX_OPS + 1):
        lines.append(f"%n{k} = f32[8,16,32]{{2,1,0}} negate(%n{k - 1}), sharding={P114}")
    body = "\n  ".join(lines)
    text = f"""
HloModule long_chain
ENTRY %main (p: f32[8,16,32]) -> f32[8,16,32] {{
  %p = f32[8,16,32]{{2,1,0}} parameter(0), sharding={P122}
  %c = f32[] constant(3)
  {body}
  ROOT %a = f32[8,16,32]{{2,1,0}} add(%p, %n{MAX_OPS}), sharding={P122}
}}"""
    assert module_stats(_run("long_chain", text), 8).total_bytes_per_device > 0
    short = text.replace(f"add(%p, %n{MAX_OPS})", f"add(%p, %n{MAX_OPS - 2})")
    assert module_stats(_run("short_chain", short), 8).total_bytes_per_device == 0


def test_an_elementwise_op_over_data_is_moved_not_recomputed():
    """cos(parameter) annotated tiled and wanted replicated: its operand is data, so the
    tiles are gathered (as XLA does) rather than cos recomputed over the whole array on
    every device (more compute and a larger peak; shardy_sharding_group's form)."""
    text = """
HloModule over_data
ENTRY %main (b: f32[8,16]) -> f32[8,16] {
  %b = f32[8,16]{1,0} parameter(0), sharding={replicated}
  %c = f32[8,16]{1,0} cosine(%b), sharding={devices=[2,4]<=[8]}
  %k = f32[] constant(2)
  %kb = f32[8,16]{1,0} broadcast(%k), dimensions={}, sharding={devices=[2,4]<=[8]}
  %m = f32[8,16]{1,0} multiply(%c, %kb), sharding={devices=[2,4]<=[8]}
  ROOT %r = f32[8,16]{1,0} copy(%m), sharding={replicated}
}"""
    out = _run("over_data", text)
    assert module_stats(out, 8).total_bytes_per_device > 0
    cos = [i for i in out.instructions() if i.opcode == "cosine"]
    assert [list(i.shape.dims) for i in cos] == [[4, 4]]
