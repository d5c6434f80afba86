"""``module_stats(memory=False)`` (what partition's report uses) lists the same
collectives as the full statistics, without the memory figures."""
from __future__ import annotations

import json
import os

import pytest

from hlo_spmd.ir.io import load_module
from hlo_spmd.passes.partition import partition_in_place
from hlo_spmd.stats import module_stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = ["transformer_train_step", "pipeline_shift", "while_loop"]


@pytest.mark.parametrize("name", CASES)
def test_collectives_only_stats_match_the_full_ones(name):
    path = os.path.join(ROOT, "fixtures", "hlo", f"{name}.pb")
    meta = json.load(open(path[:-3] + ".json"))
    out = partition_in_place(load_module(path), meta["num_partitions"]).module
    full = module_stats(out, meta["num_partitions"])
    quick = module_stats(out, meta["num_partitions"], memory=False)
    assert quick.records == full.records and quick.records
    assert quick.collectives == full.collectives
    assert quick.instruction_count == full.instruction_count
    assert quick.peak_live_bytes == 0 and quick.largest_array is None
    assert full.peak_live_bytes > 0 and full.largest_array is not None
