"""Program order of the per-device program (passes/partition/schedule.py): cheap values
(constants, iotas, broadcasts of scalars) are placed just before their first user, the
program stays valid, and no fixture's peak-live estimate grows (it shrinks where a helper
was live across a big value)."""
from __future__ import annotations

import glob
import json
import os

import pytest

from hlo_spmd.ir.io import load_module
from hlo_spmd.ir.text_parser import parse_module
from hlo_spmd.ir.verifier import verify_module
from hlo_spmd.passes.partition.schedule import sink_to_first_use
from hlo_spmd.stats import module_stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TEXT = """HloModule m

ENTRY main {
  p = f32[64,64] parameter(0)
  z = f32[] constant(0)
  i = s32[64,64] iota(), iota_dimension=0
  big = f32[64,64] exponential(p)
  fill = f32[64,64] broadcast(z), dimensions={}
  one = s32[] constant(1)
  ones = s32[64,64] broadcast(one), dimensions={}
  m = pred[64,64] compare(i, ones), direction=GE
  ROOT s = f32[64,64] select(m, big, fill)
}
"""


def test_helpers_move_to_their_first_user():
    module = parse_module(TEXT)
    comp = module.entry
    before = module_stats(module).peak_live_bytes
    assert sink_to_first_use(comp)
    names = [i.name for i in comp.instructions]
    assert names == ["p", "big", "i", "one", "ones", "m", "z", "fill", "s"]
    verify_module(module)
    assert module_stats(module).peak_live_bytes < before
    assert not sink_to_first_use(comp)  # a fixed point


def test_side_effects_and_big_operands_stay():
    module = parse_module("""HloModule m

ENTRY main {
  p = f32[8] parameter(0)
  r = f32[8] exponential(p)
  c = f32[] constant(2)
  b = f32[8] broadcast(c), dimensions={}
  ROOT s = f32[8] add(r, b)
}
""")
    # exponential reads a non-scalar: it stays; the broadcast is already next to its user.
    assert not sink_to_first_use(module.entry)


FIXTURES = [p for p in sorted(glob.glob(os.path.join(ROOT, "fixtures", "hlo", "*.pb")))
            if not json.load(open(p[:-3] + ".json")).get("partition_only")]


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: os.path.basename(p)[:-3])
def test_sinking_never_raises_the_peak(path, monkeypatch):
    from hlo_spmd.passes.partition import partition_in_place, tidy

    n = json.load(open(path[:-3] + ".json"))["num_partitions"]
    sunk = module_stats(partition_in_place(load_module(path), n).module, n).peak_live_bytes
    monkeypatch.setattr(tidy, "sink_to_first_use", lambda comp: False)
    kept = module_stats(partition_in_place(load_module(path), n).module, n).peak_live_bytes
    assert sunk <= kept
