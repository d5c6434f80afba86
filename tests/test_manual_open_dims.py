"""Open (unspecified-dims) annotations around control flow and partially manual values:
the automatic axes stay tiled through them, as XLA's propagation and partitioner keep them
(issue 9: shard_map_control_flow). Numbers checked on 8 CPU devices through jaxlib."""
from __future__ import annotations

import pytest

from hlo_spmd.runtime import ensure_host_devices

ensure_host_devices(8)
pytest.importorskip("jax")

from hlo_spmd.ir.io import module_bytes  # noqa: E402
from hlo_spmd.ir.text_parser import parse_module  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402
from hlo_spmd.runtime import verify  # noqa: E402
from hlo_spmd.runtime.module_io import strip_shardings  # noqa: E402

GATHERS = {"all-gather", "all-to-all", "all-reduce", "collective-permute"}


def run(text: str, complete: bool):
    module = parse_module(text, "test")
    # A manual region runs only partitioned: XLA's own partitioner is the reference then.
    raw = module_bytes(module)
    original = raw if "SPMDFullToShardShape" in text else strip_shardings(raw)
    result = partition_in_place(module, 8, complete=complete)
    report = verify(original, module_bytes(result.module), 8, poison_padding=True)
    assert report.ok, str(report)
    return result.module


def opcodes(module) -> list[str]:
    return [i.opcode for c in module.computations for i in c.instructions]


MANUAL_RESHAPE = """
HloModule manual_reshape

ENTRY %main (x: f32[8,16]) -> f32[8,16] {
  %x = f32[8,16]{1,0} parameter(0), sharding={devices=[2,4]<=[8]}
  %a = f32[8,16]{1,0} custom-call(%x), custom_call_target="Sharding", sharding={devices=[2,4]<=[8]}
  %m = f32[8,4]{1,0} custom-call(%a), custom_call_target="SPMDFullToShardShape", sharding={devices=[2,1,4]<=[8] last_tile_dims={manual}}
  %r = f32[8,4,1]{2,1,0} reshape(%m)%S3
  %t = f32[8,4,1]{2,1,0} tanh(%r)%S3
  %r2 = f32[32]{0} reshape(%t)%S1
  %e = f32[32]{0} exponential(%r2)%S1
  %r3 = f32[8,4]{1,0} reshape(%e)%S2
  %s = f32[8,4]{1,0} custom-call(%r3), custom_call_target="Sharding", sharding={devices=[2,1,4]<=[8] last_tile_dims={manual}}
  ROOT %full = f32[8,16]{1,0} custom-call(%s), custom_call_target="SPMDShardToFullShape", sharding={devices=[2,4]<=[8]}
}
"""


@pytest.mark.parametrize("annotated", [True, False], ids=["annotated", "propagated"])
def test_reshape_of_partially_manual_value_is_local(annotated):
    """Reshapes of a value manual over one axis and tiled over the other are local: the
    manual groups never exchange data, and the tiled dim maps through exactly."""
    subs = {"%S3": ", sharding={devices=[2,1,1,4]<=[8] last_tile_dims={manual}}",
            "%S1": ", sharding={devices=[2,4]<=[8] last_tile_dims={manual}}",
            "%S2": ", sharding={devices=[2,1,4]<=[8] last_tile_dims={manual}}"}
    text = MANUAL_RESHAPE
    for k, v in subs.items():
        text = text.replace(k, v if annotated else "")
    out = run(text, complete=annotated)
    assert not GATHERS & set(opcodes(out)), opcodes(out)


OPEN_BRANCHES = """
HloModule open_branches

%b0 (p0: f32[8,4]) -> f32[8,4] {
  %p0 = f32[8,4]{1,0} parameter(0)
  %n0 = f32[8,4]{1,0} negate(%p0)
  ROOT %r0 = f32[8,4]{1,0} custom-call(%n0), custom_call_target="Sharding", sharding={replicated}, backend_config="unspecified_dims=[0,1]"
}

%b1 (p1: f32[8,4]) -> f32[8,4] {
  %p1 = f32[8,4]{1,0} parameter(0)
  %n1 = f32[8,4]{1,0} exponential(%p1)
  ROOT %r1 = f32[8,4]{1,0} custom-call(%n1), custom_call_target="Sharding", sharding={replicated}, backend_config="unspecified_dims=[0,1]"
}

ENTRY %main (x: f32[8,4], k: s32[]) -> f32[8,4] {
  %x = f32[8,4]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}
  %k = s32[] parameter(1), sharding={replicated}
  %c = f32[8,4]{1,0} conditional(%k, %x, %x), branch_computations={%b0, %b1}
  ROOT %y = f32[8,4]{1,0} add(%c, %x), sharding={devices=[8,1]<=[8]}
}
"""


def test_open_branch_roots_do_not_pin_the_conditional():
    """Branch roots that are open annotations ({replicated} with every dim unspecified,
    as JAX writes them) leave the conditional free: it stays row-tiled like its operand
    and users, with no collective (XLA: the roots sit under ConditionalCanonicalizer's
    tuples, so they do not seed the conditional's sharding)."""
    out = run(OPEN_BRANCHES, complete=False)
    assert not GATHERS & set(opcodes(out)), opcodes(out)
    cond = next(i for i in out.entry.instructions if i.opcode == "conditional")
    assert list(cond.shape.dims) == [1, 4]
