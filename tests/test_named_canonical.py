"""Named shardings XLA's verifier rejects as not canonical (jaxlib 0.10.2, checked here
against jaxlib itself in a subprocess, since jaxlib aborts the process on them): adjacent
sub-axes of one axis that must be written merged, and replicated / unreduced / manual
lists out of mesh order. The forms next to them that XLA accepts stay accepted."""
from __future__ import annotations

import subprocess
import sys

import pytest

from hlo_spmd.errors import HloSpmdError, ShardingError
from hlo_spmd.ir.text_parser import parse_module
from hlo_spmd.sharding import parse_sharding

REJECTED = [
    ("{mesh['x'=2,'y'=4], [{'y':(1)2, 'y':(2)2}, {}]}", "dim 0: adjacent sub-axes 'y':(1)2, "
     "'y':(2)2 can be merged; write 'y'"),
    ("{mesh['x'=8], [{'x':(1)2}, {'x':(2)2, 'x':(4)2}]}", "write 'x':(2)4"),
    ("{mesh['x'=2,'y'=4], [{}, {}], replicated={'y':(1)2, 'y':(2)2}}", "replicated: adjacent"),
    ("{mesh['x'=2,'y'=4], [{}, {}], unreduced={'y':(1)2, 'y':(2)2}}", "unreduced: adjacent"),
    ("{mesh['x'=2,'y'=4], [{}, {}], manual={'y':(1)2, 'y':(2)2}}", "manual: adjacent"),
    ("{mesh['x'=2,'y'=4], [{}, {}], replicated={'y':(2)2, 'y':(1)2}}", "must be sorted"),
    ("{mesh['x'=2,'y'=4], [{}, {}], replicated={'y', 'x'}}", "must be sorted"),
    ("{mesh['x'=2,'y'=4], [{}, {}], unreduced={'y', 'x'}}", "must be sorted"),
    ("{mesh['x'=12], [{'x':(1)2}, {'x':(3)2}]}", "do not nest"),
]
ACCEPTED = [
    "{mesh['x'=2,'y'=4], [{'y':(2)2, 'y':(1)2}, {}]}",        # minor first: not mergeable
    "{mesh['x'=2,'y'=4], [{'y':(1)2}, {'y':(2)2}]}",          # neighbours in different lists
    "{mesh['x'=2,'y'=4], [{}, {'y':(1)2}], replicated={'y':(2)2}}",
    "{mesh['x'=2,'y'=4], [{'y':(1)2}, {}], unreduced={'y':(2)2}}",
    "{mesh['x'=8], [{'x':(1)2, 'x':(4)2}, {}]}",
    "{mesh['x'=2,'y'=4], [{}, {}], replicated={'x', 'y'}}",
]

_JAXLIB = """
import sys
from jaxlib import _hlo
print(_hlo.HloSharding.from_string(sys.argv[1]))
"""


def _jaxlib_accepts(text: str) -> bool:
    r = subprocess.run([sys.executable, "-c", _JAXLIB, text], capture_output=True, text=True,
                       timeout=120)
    return r.returncode == 0


@pytest.mark.parametrize("text, message", REJECTED)
def test_rejected_as_xla_rejects(text, message):
    with pytest.raises(ShardingError) as e:
        parse_sharding(text)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text", ACCEPTED)
def test_accepted_as_xla_accepts_and_prints_back(text):
    assert str(parse_sharding(text)) == text


def test_jaxlib_agrees():
    pytest.importorskip("jaxlib._hlo")
    for text, _ in REJECTED:
        assert not _jaxlib_accepts(text), text
    for text in ACCEPTED[:3]:
        assert _jaxlib_accepts(text), text


def test_error_names_the_instruction():
    text = """HloModule bad

ENTRY %main (a: f32[8,16]) -> f32[8,16] {
  %a = f32[8,16]{1,0} parameter(0), sharding={mesh['x'=2,'y'=4], [{'y':(1)2, 'y':(2)2}, {}]}
  ROOT %n = f32[8,16]{1,0} negate(%a)
}
"""
    with pytest.raises(HloSpmdError) as e:
        parse_module(text, "bad.hlo")
    msg = str(e.value)
    assert "\n" not in msg and "bad.hlo:4:" in msg and "can be merged" in msg
