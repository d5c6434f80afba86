"""Shardy user priorities (``{"y"}p1``): completion runs one round per priority, p0 first
(passes/propagation/priorities.py). The shardings chosen are Shardy's own (XLA's Shardy
pipeline through jaxlib), they differ from those without priorities, and the partitioned
program matches on 8 CPU devices."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hlo_spmd.runtime import ensure_host_devices

ensure_host_devices(8)
pytest.importorskip("jax")

from hlo_spmd.ir.io import load_module, module_bytes  # noqa: E402
from hlo_spmd.ir.text_parser import parse_module  # noqa: E402
from hlo_spmd.passes.partition import partition_in_place  # noqa: E402
from hlo_spmd.passes.propagation import propagate  # noqa: E402
from hlo_spmd.runtime import verify  # noqa: E402
from hlo_spmd.runtime.xla_reference import xla_pass_dumps  # noqa: E402
from hlo_spmd.sharding.text import parse_sharding  # noqa: E402

PATH = Path(__file__).resolve().parent.parent / "fixtures" / "hlo" / "handwritten" / \
    "shardy_priorities.hlo"
COL_Y = parse_sharding("{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}")
ROW_Y = parse_sharding("{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}")


def _text(priorities: bool) -> str:
    text = PATH.read_text()
    return text if priorities else re.sub(r"\}p\d+", "}", text)


def ours(text: str) -> dict[str, object]:
    module = parse_module(text, "test")
    propagate(module)
    return {i.name: i.sharding for i in module.entry.instructions}


def shardy(text: str) -> dict[str, object]:
    """Shardy's completion of the same module, by original instruction name."""
    dumps = xla_pass_dumps(module_bytes(parse_module(text, "test")), 8, shardy=True)
    assert dumps.error is None, dumps.error
    done = dumps.propagated.module()
    return {i.attrs.metadata.op_name: i.sharding for i in done.entry.instructions
            if i.attrs.metadata.op_name}


@pytest.mark.parametrize("priorities", [True, False], ids=["priorities", "no-priorities"])
def test_completion_is_shardys(priorities):
    text = _text(priorities)
    mine, theirs = ours(text), shardy(text)
    # The entry result (after FuncResultSharding) is left out: ours stays replicated
    # unless --to-output (XLA GSPMD's default).
    names = ["a", "b", "w", "add", "t", "c", "d", "e"]
    assert {n: str(mine[n]) for n in names} == {n: str(theirs[n]) for n in names}


def test_priorities_change_the_result_and_keep_annotations():
    with_p, without = ours(_text(True)), ours(_text(False))
    # p0 (b: columns on y) decides the add; a's p1 rows on y cannot override it, and the
    # p2 constraint then adds x on the rows. Without priorities a (operand 0) wins.
    assert with_p["add"] == parse_sharding("{devices=[2,4]<=[8]}")
    assert without["add"] == ROW_Y
    # Explicit annotations end with their full sharding, whatever their priority.
    assert with_p["a"] == ROW_Y and with_p["b"] == COL_Y
    assert with_p["c"] == parse_sharding("{devices=[2,4]<=[8]}")   # x (p2) + y refined


def test_priorities_partition_and_match():
    meta = json.loads(PATH.with_suffix(".json").read_text())
    original = module_bytes(load_module(str(PATH)))
    out = partition_in_place(load_module(str(PATH)), 8).module
    report = verify(original, module_bytes(out), 8, poison_padding=True)
    assert report.ok, str(report)
    assert meta["num_partitions"] == 8


def test_priority_text_round_trips():
    """Priorities print back as they were written (annotation text kept)."""
    module = load_module(str(PATH))
    a = next(i for i in module.entry.instructions if i.name == "a")
    assert a.attrs.frontend_attributes.map["xla.sdy.sharding"] == \
        '#sdy.sharding<@mesh, [{"y"}p1, {}]>'
