"""records.Record / FrozenRecord behave as the dataclasses they replaced (equality, repr,
hash, immutability, copy), and Shardy parsing is loaded only for modules that use it."""
import copy
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from hlo_spmd.passes.partition.state import PartitionOptions, PartitionReport
from hlo_spmd.passes.propagation.provenance import Alternative, Decision
from hlo_spmd.stats import CollectiveSummary

ROOT = Path(__file__).resolve().parent.parent


def test_record_eq_repr_hash_like_a_dataclass():
    a, b = CollectiveSummary("all-gather", 2), CollectiveSummary("all-gather", 2)
    assert a == b and a != CollectiveSummary("all-gather", 3)
    assert repr(a) == ("CollectiveSummary(kind='all-gather', count=2, count_in_loops=0, "
                       "bytes_per_device=0.0, bytes_in_loops=0.0, max_group_size=0)")
    with pytest.raises(TypeError):
        hash(a)  # mutable records are unhashable, as a dataclass with eq
    # another class with the same fields is not equal
    assert Decision("x", None, "r", "user") != PartitionOptions()
    a.count += 1
    assert a.count == 3
    with pytest.raises(AttributeError):
        a.not_a_field = 1  # type: ignore[attr-defined]


def test_default_containers_are_per_instance():
    r1, r2 = PartitionReport(), PartitionReport()
    r1.unsharded_inputs.append("p")
    assert r2.unsharded_inputs == [] and r1 != r2


def test_extra_slot_outside_equality_and_repr():
    r = PartitionReport()
    assert r.dot_plans == {}
    r.dot_plans["d"] = "plan"
    assert r == PartitionReport() and "dot_plans" not in repr(r)


def test_frozen_record():
    alt = Alternative(None, "dot.from_lhs", ("a",), "worse", 1, 2)  # type: ignore[arg-type]
    same = Alternative(None, "dot.from_lhs", ("a",), "worse", 1, 2)  # type: ignore[arg-type]
    assert alt == same and hash(alt) == hash(same) and len({alt, same}) == 1
    with pytest.raises(AttributeError):
        alt.rule = "other"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del alt.rule
    assert copy.copy(alt) == alt and pickle.loads(pickle.dumps(alt)) == alt
    assert repr(alt).startswith("Alternative(sharding=None, rule='dot.from_lhs'")


def _sdy_loaded_after_partition(fixture: str) -> str:
    code = (
        "import sys, types\n"
        "from hlo_spmd.api import partition\n"
        f"partition({str(ROOT / 'fixtures' / 'hlo' / fixture)!r})\n"
        "m = sys.modules.get('hlo_spmd.annotations.sdy')\n"
        "print('none' if m is None else 'loaded' if type(m) is types.ModuleType else 'lazy')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ), check=True)
    return out.stdout.strip().splitlines()[-1]


def test_shardy_parser_loaded_only_when_used():
    assert _sdy_loaded_after_partition("mlp_2d_megatron.pb") in ("none", "lazy")
    assert _sdy_loaded_after_partition("shardy_mlp_2d.pb") == "loaded"


def test_frozen_record_sets_its_fields_in_declared_order_once():
    from hlo_spmd.passes.partition.causes import Remat
    from hlo_spmd.records import FrozenRecord

    r = Remat("y", "dot", "a", "b", "why")
    assert (r.serves, r.opcode, r.src, r.dst, r.cause) == ("y", "dot", "a", "b", "why")

    class Pair(FrozenRecord):
        __match_args__ = ("a", "b")
        __slots__ = __match_args__

        def __init__(self, a, b=None, *extra):
            self._set_fields(a, b, *extra)

    with pytest.raises(ValueError):   # a value too many is a bug, not a silent drop
        Pair(1, 2, 3)
    with pytest.raises(AttributeError):
        Pair(1, 2).a = 5
