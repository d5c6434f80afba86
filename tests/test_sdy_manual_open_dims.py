"""Open dims of a Shardy manual computation's in_shardings / out_shardings
(``{?}`` at xla.sdy.GlobalToLocalShape / LocalToGlobalShape) are open for propagation as
in Shardy's ManualComputationOp: they take the free mesh axes that tile the operand there
(in any order of the axes), so the tiling stays through the body instead of being
gathered at the boundary; closed dims keep the gather.  Checked on 8 CPU devices."""
from __future__ import annotations

import pytest

from hlo_spmd.runtime import ensure_host_devices

ensure_host_devices(8)
pytest.importorskip("jax")

from hlo_spmd.ir.io import module_bytes  # noqa: E402
from hlo_spmd.ir.text_parser import parse_module  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402
from hlo_spmd.runtime import verify  # noqa: E402

# a is tiled z-major-then-x on dim 0 (not the mesh order) and y on dim 1; the manual
# computation is manual over y; dim 0 of its in/out shardings is ENTRY / EXIT.
MODULE = r"""
HloModule sdy_open_dims, entry_computation_layout={(f32[16,8]{1,0})->f32[16,8]{1,0}}, num_partitions=8, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["x"=2, "y"=2, "z"=2]>}}

%body (p: f32[16,4]) -> f32[16,4] {
  %p = f32[16,4]{1,0} parameter(0)
  %c = f32[] constant(0.5)
  %cb = f32[16,4]{1,0} broadcast(%c), dimensions={}
  %m = f32[16,4]{1,0} multiply(%p, %cb)
  ROOT %s = f32[16,4]{1,0} sine(%m)
}

ENTRY %main (a: f32[16,8]) -> f32[16,8] {
  %a = f32[16,8]{1,0} parameter(0), frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\"z\", \"x\"}, {\"y\"}]>"}
  %enter = f32[16,4]{1,0} custom-call(%a), custom_call_target="xla.sdy.GlobalToLocalShape", custom_call_has_side_effect=true, frontend_attributes={xla.sdy.in_shardings="#sdy.sharding_per_value<[<@mesh, [ENTRY, {\"y\"}]>]>",xla.sdy.manual_axes="#sdy<manual_axes{\"y\"}>"}
  %call = f32[16,4]{1,0} call(%enter), to_apply=%body, frontend_attributes={inlineable="false"}
  %exit = f32[16,8]{1,0} custom-call(%call), custom_call_target="xla.sdy.LocalToGlobalShape", custom_call_has_side_effect=true, frontend_attributes={xla.sdy.manual_axes="#sdy<manual_axes{\"y\"}>",xla.sdy.out_shardings="#sdy.sharding_per_value<[<@mesh, [EXIT, {\"y\"}]>]>"}
  %e = f32[16,8]{1,0} exponential(%exit)
  ROOT %r = f32[16,8]{1,0} custom-call(%e), custom_call_target="xla.sdy.FuncResultSharding", custom_call_has_side_effect=true, frontend_attributes={xla.sdy.sharding="#sdy.sharding_per_value<[<@mesh, [RESULT, {\"y\"}]>]>"}
}
"""

PLAIN = r"""
HloModule plain, entry_computation_layout={(f32[16,8]{1,0})->f32[16,8]{1,0}}

ENTRY %main (a: f32[16,8]) -> f32[16,8] {
  %a = f32[16,8]{1,0} parameter(0)
  %c = f32[] constant(0.5)
  %cb = f32[16,8]{1,0} broadcast(%c), dimensions={}
  %m = f32[16,8]{1,0} multiply(%a, %cb)
  %s = f32[16,8]{1,0} sine(%m)
  ROOT %e = f32[16,8]{1,0} exponential(%s)
}
"""

COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")


ZX = '{\\"z\\", \\"x\\"}'


@pytest.mark.parametrize("entry,exit_,result,expected", [
    ("{?}", "{?}", ZX, []),                   # the z,x tiling stays through the body
    ("{}", "{?}", ZX, ["all-gather"]),        # closed entry: gathered before the body
    # closed exit: the body's result is pinned to the exit's local view (as Shardy's
    # export pins it with a Sharding custom-call), so it is gathered in the body
    ("{?}", "{}", ZX, ["all-gather"]),
    ("{?}", "{}", "{}", ["all-gather"]),
])
def test_open_boundary_dims_take_the_operand_tiling(entry, exit_, result, expected):
    text = MODULE.replace("ENTRY,", entry + ",").replace("EXIT,", exit_ + ",") \
        .replace("RESULT,", result + ",")
    out = partition_in_place(parse_module(text, "m"), 8).module
    found = sorted(i.opcode for i in out.instructions() if i.opcode in COLLECTIVES)
    assert found == expected
    body = [c for c in out.computations if c.name == "body"][0]
    assert [list(p.shape.dims) for p in body.parameters] == \
        [[4, 4] if entry == "{?}" else [16, 4]]
    report = verify(module_bytes(parse_module(PLAIN, "plain")), module_bytes(out), 8,
                    poison_padding=True)
    assert report.ok, str(report)
