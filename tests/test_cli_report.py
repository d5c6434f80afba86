"""`partition --report`: one entry per collective of the output, with the figures `stats`
reports, a cause, and the input instruction it serves; the terminal line names the top
causes and every full rematerialization is a warning."""
from __future__ import annotations

import glob
import json
import os

import pytest
from click.testing import CliRunner

from hlo_spmd.passes.partition.causes import CAUSES
from hlo_spmd_cli.main import _register, cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "fixtures", "hlo")
FIXTURES = (sorted(glob.glob(os.path.join(FIX, "*.pb")))
            + sorted(glob.glob(os.path.join(FIX, "handwritten", "*.hlo"))))

_register()


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _partition(tmp_path, path):
    out, rep = tmp_path / "out.pb", tmp_path / "report.json"
    meta = os.path.splitext(path)[0] + ".json"
    n = json.load(open(meta)).get("num_partitions") if path.endswith(".hlo") and \
        os.path.exists(meta) else None
    r = run("partition", path, "-o", str(out), "--report", str(rep),
            *(["-n", str(n)] if n else []))
    assert r.exit_code == 0, r.stderr
    return out, json.loads(rep.read_text()), r


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: os.path.splitext(os.path.basename(p))[0])
def test_report_agrees_with_stats(tmp_path, path):
    out, report, r = _partition(tmp_path, path)
    s = run("stats", str(out), "--json")
    assert s.exit_code == 0, s.stderr
    stats = json.loads(s.stdout)
    entries = report["collectives"]
    assert len(entries) == stats["total"]["count"]
    assert sum(e["bytes_per_device"] for e in entries) == pytest.approx(
        stats["total"]["bytes_per_device"])
    # entry by entry, the same instruction and the same figure
    by_name = {(i["computation"], i["instruction"]): i for i in stats["instructions"]}
    for e in entries:
        st = by_name[(e["computation"], e["instruction"])]
        assert e["kind"] == st["kind"] and e["bytes_per_device"] == st["bytes_per_device"]
        assert e["cause"] in CAUSES
        assert (e["in_loop"] is not None) == st["in_loop"]
        if e["cause"] == "reshard":
            assert e["from"] and e["to"] and e["from"] != e["to"]
        if e["cause"] != "user":
            assert e["for"], e
        else:  # "user": the input's own collectives, copied (never one the partitioner made)
            assert e["for"] == e["instruction"], e
    summary = report["summary"]
    assert summary["total_count"] == len(entries)
    assert sum(v["count"] for v in summary["by_cause"].values()) == len(entries)
    assert sum(v["bytes_per_device"] for v in summary["by_cause"].values()) == pytest.approx(
        stats["total"]["bytes_per_device"])
    # the terminal line names the top cause by bytes
    if entries:
        top = max(summary["by_cause"].items(), key=lambda kv: kv[1]["bytes_per_device"])[0]
        assert f"{top} " in r.stderr
    else:
        assert "no collectives" in r.stderr


def test_report_causes_on_known_programs(tmp_path):
    _, rep, _ = _partition(tmp_path, os.path.join(FIX, "mlp_2d_megatron.pb"))
    (e,) = rep["collectives"]
    assert (e["kind"], e["cause"]) == ("all-reduce", "contraction")
    assert e["for"].startswith("dot")
    _, rep, _ = _partition(tmp_path, os.path.join(FIX, "while_loop.pb"))
    (e,) = rep["collectives"]
    assert e["cause"] == "reduction" and e["in_loop"] is True  # data-dependent trip count
    _, rep, _ = _partition(tmp_path, os.path.join(FIX, "pipeline_shift.pb"))
    causes = {e["cause"] for e in rep["collectives"]}
    assert "halo" in causes
    # pipeline_shift's loop is a counted loop: the trip count is known
    assert any(isinstance(e["in_loop"], int) and e["in_loop"] is not True
               for e in rep["collectives"])


def test_full_rematerialization_is_a_warning(tmp_path):
    """An op with no partitioned handler (a custom-call of an unknown target) makes its
    sharded operand whole on every device: a warning naming the op and both shardings."""
    src = tmp_path / "unknown_call.hlo"
    src.write_text("""HloModule m, num_partitions=8

ENTRY e {
  p = f32[16,4] parameter(0), sharding={devices=[8,1]<=[8]}
  k = f32[16,4] custom-call(p), custom_call_target="my_kernel", sharding={devices=[8,1]<=[8]}
  ROOT n = f32[16,4] negate(k), sharding={devices=[8,1]<=[8]}
}
""")
    _, rep, r = _partition(tmp_path, str(src))
    warnings = [l for l in r.stderr.splitlines() if l.startswith("warning: full rematerialization")]
    assert len(warnings) == len(rep["full_rematerializations"]) >= 1
    assert any("k (custom-call)" in w and "{devices=[8,1]<=[8]} -> {replicated}" in w
               for w in warnings), warnings
    assert rep["collectives"] and all(e["cause"] == "fallback" for e in rep["collectives"])
    assert {f["instruction"] for f in rep["replicated_fallbacks"]} >= \
        {e["for"] for e in rep["collectives"]}
    assert rep["unknown_custom_calls"] == [{"instruction": "k", "target": "my_kernel"}]
    # no remat warning where nothing is made whole involuntarily
    _, rep, r = _partition(tmp_path, os.path.join(FIX, "mlp_2d_megatron.pb"))
    assert rep["full_rematerializations"] == [] and "warning" not in r.stderr


def test_reshard_through_replicated_is_a_warning(tmp_path):
    """A sharded value moved to one device is gathered whole on every device first:
    warned, with the op and both shardings; the same value resharded along routes that
    move only tiles is not."""
    def module(target):
        return f"""HloModule m, num_partitions=4

ENTRY e {{
  p = f32[7,13] parameter(0), sharding={{devices=[4,1]<=[4]}}
  c = f32[7,13] custom-call(p), custom_call_target="Sharding", sharding={target}
  ROOT n = f32[7,13] negate(c), sharding={target}
}}
"""
    src = tmp_path / "m.hlo"
    src.write_text(module("{maximal device=1}"))
    _, rep, r = _partition(tmp_path, str(src))
    (w,) = rep["full_rematerializations"]
    assert (w["for"], w["from"], w["to"]) == ("c", "{devices=[4,1]<=[4]}", "{maximal device=1}")
    assert f"warning: {w['message']}" in r.stderr
    src.write_text(module("{devices=[2,2]0,3,1,2}"))
    _, rep, r = _partition(tmp_path, str(src))
    assert rep["full_rematerializations"] == [] and "warning" not in r.stderr
    assert {e["kind"] for e in rep["collectives"]} <= {"all-to-all", "collective-permute"}
    assert all(e["cause"] == "reshard" and e["to"] == "{devices=[2,2]0,3,1,2}"
               for e in rep["collectives"])


def test_report_to_stdout_and_same_file_refused(tmp_path):
    out = tmp_path / "o.pb"
    r = run("partition", os.path.join(FIX, "mlp_2d_megatron.pb"), "-o", str(out), "--report", "-")
    assert r.exit_code == 0
    assert json.loads(r.stdout)["summary"]["total_count"] == 1
    r = run("partition", os.path.join(FIX, "mlp_2d_megatron.pb"), "-o", str(out),
            "--report", str(out))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1


def test_bad_report_path_writes_nothing(tmp_path):
    out = tmp_path / "o.pb"
    r = run("partition", os.path.join(FIX, "mlp_2d_megatron.pb"), "-o", str(out),
            "--report", str(tmp_path / "missing" / "r.json"))
    assert r.exit_code == 2 and "missing" in r.stderr and not out.exists()


_LOOP = """HloModule w, num_partitions=4

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

body {
  p = (s32[], f32[8,4], f32[]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  n = s32[] add(i, one)
  x = f32[8,4] get-tuple-element(p), index=1, sharding={devices=[4,1]<=[4]}
  z = f32[] constant(0)
  r = f32[] reduce(x, z), dimensions={0,1}, to_apply=add
  ROOT t = (s32[], f32[8,4], f32[]) tuple(n, x, r)
}

cond {
  p = (s32[], f32[8,4], f32[]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  lim = s32[] constant(LIMIT)
  ROOT lt = pred[] compare(i, lim), direction=LT
}

ENTRY e {
  x = f32[8,4] parameter(0), sharding={devices=[4,1]<=[4]}
  zero = s32[] constant(START)
  f = f32[] constant(0)
  init = (s32[], f32[8,4], f32[]) tuple(zero, x, f)
  w = (s32[], f32[8,4], f32[]) while(init), condition=cond, body=body BACKEND
  ROOT out = f32[] get-tuple-element(w), index=2
}
"""


@pytest.mark.parametrize("start, limit, backend, trips", [
    (2, 7, "", 5),                                   # counted loop i = 2; i < 7; i += 1
    (0, 3, ', backend_config={"known_trip_count":{"n":"11"}}', 11),  # XLA's own figure
])
def test_in_loop_gives_the_trip_count(tmp_path, start, limit, backend, trips):
    src = tmp_path / "w.hlo"
    src.write_text(_LOOP.replace("LIMIT", str(limit)).replace("START", str(start))
                   .replace(" BACKEND", backend))
    _, rep, _ = _partition(tmp_path, str(src))
    (e,) = rep["collectives"]
    assert (e["kind"], e["cause"], e["for"], e["in_loop"]) == ("all-reduce", "reduction", "r",
                                                               trips)
